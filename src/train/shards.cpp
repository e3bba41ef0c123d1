// Shard files (see shards.h).
#include "train/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

namespace kiln {
namespace {

static_assert(std::endian::native == std::endian::little, "shards are little-endian; add byte swapping here");

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'S', 'H', 'D', '1'};
constexpr uint32_t kVersion = 1, kHeaderBytes = 64;

struct Header {
  char magic[8];
  uint32_t version, header_bytes;
  int64_t rows, tokens, documents;
  unsigned char reserved[24];
};
static_assert(sizeof(Header) == kHeaderBytes);

int64_t align64(int64_t x) { return (x + 63) / 64 * 64; }

struct Layout {
  int64_t row_offsets, doc_starts, ids, mask, end;
};

// Section offsets for the counts; false when they overflow 64 bits.
bool layout_for(int64_t rows, int64_t tokens, int64_t documents, Layout* l) {
  constexpr int64_t kMax = int64_t(1) << 56;
  if (rows < 0 || tokens < 0 || documents < 0 || rows >= kMax / 8 || tokens >= kMax / 8 || documents >= kMax / 8)
    return false;
  l->row_offsets = kHeaderBytes;
  l->doc_starts = align64(l->row_offsets + 8 * (rows + 1));
  l->ids = align64(l->doc_starts + 8 * documents);
  l->mask = align64(l->ids + 4 * tokens);
  l->end = l->mask + tokens;
  return true;
}

Status write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0) return io_error("error writing '" + path + "': " + std::strerror(errno) + " (disk full?)");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status pad_to(int fd, int64_t* at, int64_t offset, const std::string& path) {
  static const char zeros[64] = {};
  KILN_RETURN_IF_ERROR(write_all(fd, zeros, static_cast<size_t>(offset - *at), path));
  *at = offset;
  return Status::Ok();
}

}  // namespace

void ShardWriter::add_row(const std::vector<const TokenDocument*>& docs) {
  for (const TokenDocument* d : docs) {
    doc_starts_.push_back(static_cast<int64_t>(ids_.size()));
    ids_.insert(ids_.end(), d->ids.begin(), d->ids.end());
    mask_.insert(mask_.end(), d->mask.begin(), d->mask.end());
  }
  row_offsets_.push_back(static_cast<int64_t>(ids_.size()));
}

Status ShardWriter::finish() {
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.header_bytes = kHeaderBytes;
  h.rows = rows();
  h.tokens = tokens();
  h.documents = static_cast<int64_t>(doc_starts_.size());
  Layout l;
  if (!layout_for(h.rows, h.tokens, h.documents, &l)) return invalid_argument("shard '" + path_ + "' is too large");
  const std::string partial = path_ + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("cannot create '" + partial + "': " + std::strerror(errno));
  int64_t at = 0;
  Status s = write_all(fd, &h, sizeof(h), partial);
  at = sizeof(h);
  if (s.ok()) s = write_all(fd, row_offsets_.data(), 8 * row_offsets_.size(), partial);
  at += 8 * static_cast<int64_t>(row_offsets_.size());
  if (s.ok()) s = pad_to(fd, &at, l.doc_starts, partial);
  if (s.ok()) s = write_all(fd, doc_starts_.data(), 8 * doc_starts_.size(), partial);
  at += 8 * static_cast<int64_t>(doc_starts_.size());
  if (s.ok()) s = pad_to(fd, &at, l.ids, partial);
  if (s.ok()) s = write_all(fd, ids_.data(), 4 * ids_.size(), partial);
  at += 4 * static_cast<int64_t>(ids_.size());
  if (s.ok()) s = pad_to(fd, &at, l.mask, partial);
  if (s.ok()) s = write_all(fd, mask_.data(), mask_.size(), partial);
  if (s.ok() && ::fsync(fd) != 0) s = io_error("cannot flush '" + partial + "': " + std::strerror(errno));
  ::close(fd);
  if (s.ok() && std::rename(partial.c_str(), path_.c_str()) != 0)
    s = io_error("cannot rename '" + partial + "' to '" + path_ + "': " + std::strerror(errno));
  if (!s.ok()) ::unlink(partial.c_str());
  return s;
}

Result<Shard> Shard::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open the shard '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kHeaderBytes)) {
    ::close(fd);
    return invalid_argument("'" + path + "' is not a kiln shard (too short); run kiln preprocess again");
  }
  Shard s;
  s.path_ = path;
  s.map_bytes_ = static_cast<size_t>(st.st_size);
  s.map_ = ::mmap(nullptr, s.map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (s.map_ == MAP_FAILED) {
    s.map_ = nullptr;
    return io_error("cannot map the shard '" + path + "': " + std::strerror(errno));
  }
  const auto* base = static_cast<const unsigned char*>(s.map_);
  Header h;
  std::memcpy(&h, base, sizeof(h));
  const std::string bad = "the shard '" + path + "' is damaged (";
  if (std::memcmp(h.magic, kMagic, 8) != 0) return invalid_argument("'" + path + "' is not a kiln shard (bad magic)");
  if (h.version != kVersion || h.header_bytes != kHeaderBytes)
    return invalid_argument("the shard '" + path + "' has format version " + std::to_string(h.version) +
                            "; this kiln reads version 1 (run kiln preprocess again)");
  Layout l;
  if (!layout_for(h.rows, h.tokens, h.documents, &l) || l.end != static_cast<int64_t>(s.map_bytes_))
    return invalid_argument(bad + "its size does not match its header; was it truncated?)");
  s.rows_ = h.rows;
  s.tokens_ = h.tokens;
  s.documents_ = h.documents;
  s.row_offsets_ = reinterpret_cast<const int64_t*>(base + l.row_offsets);
  s.doc_starts_ = reinterpret_cast<const int64_t*>(base + l.doc_starts);
  s.ids_ = reinterpret_cast<const int32_t*>(base + l.ids);
  s.mask_ = base + l.mask;
  if (s.row_offsets_[0] != 0 || s.row_offsets_[s.rows_] != s.tokens_) return invalid_argument(bad + "row offsets)");
  int64_t d = 0;
  for (int64_t r = 0; r < s.rows_; ++r) {
    const int64_t begin = s.row_offsets_[r], end = s.row_offsets_[r + 1];
    if (end <= begin) return invalid_argument(bad + "row " + std::to_string(r) + " is empty or out of order)");
    if (d >= s.documents_ || s.doc_starts_[d] != begin)
      return invalid_argument(bad + "row " + std::to_string(r) + " does not start a document)");
    for (++d; d < s.documents_ && s.doc_starts_[d] < end; ++d)
      if (s.doc_starts_[d] <= s.doc_starts_[d - 1]) return invalid_argument(bad + "document starts out of order)");
  }
  if (d != s.documents_) return invalid_argument(bad + "documents past the last row)");
  return s;
}

Shard::Shard(Shard&& o) noexcept { *this = std::move(o); }

Shard& Shard::operator=(Shard&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = o.map_bytes_;
    rows_ = o.rows_;
    tokens_ = o.tokens_;
    documents_ = o.documents_;
    row_offsets_ = o.row_offsets_;
    doc_starts_ = o.doc_starts_;
    ids_ = o.ids_;
    mask_ = o.mask_;
  }
  return *this;
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_bytes_);
}

ShardRow Shard::row(int64_t r) const {
  const int64_t begin = row_offsets_[r], end = row_offsets_[r + 1];
  ShardRow out;
  out.ids = {ids_ + begin, static_cast<size_t>(end - begin)};
  out.mask = {mask_ + begin, static_cast<size_t>(end - begin)};
  const int64_t* first = std::lower_bound(doc_starts_, doc_starts_ + documents_, begin);
  for (const int64_t* p = first; p < doc_starts_ + documents_ && *p < end; ++p)
    out.doc_starts.push_back(static_cast<int32_t>(*p - begin));
  return out;
}

}  // namespace kiln
