// Safetensors reading (mmap) and writing. See safetensors.h.
#include "core/json_text.h"
#include "core/plural.h"
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace kiln {

using nlohmann::json;

namespace {

struct DTypeSpec {
  const char* name;
  int64_t size;    // bytes per element; 0: unknown (F4 and other packed types)
  bool supported;  // kiln reads it
  DType dtype;
};

// Every dtype the safetensors format defines; kiln reads the first five.
constexpr DTypeSpec kDTypes[] = {
    {"F32", 4, true, DType::f32},       {"BF16", 2, true, DType::bf16},     {"F16", 2, true, DType::f16},
    {"I32", 4, true, DType::i32},       {"I64", 8, true, DType::i64},       {"F64", 8, false, DType::f32},
    {"I8", 1, false, DType::f32},       {"U8", 1, false, DType::f32},       {"BOOL", 1, false, DType::f32},
    {"I16", 2, false, DType::f32},      {"U16", 2, false, DType::f32},      {"U32", 4, false, DType::f32},
    {"U64", 8, false, DType::f32},      {"F8_E4M3", 1, false, DType::f32},  {"F8_E5M2", 1, false, DType::f32},
    {"F8_E8M0", 1, false, DType::f32},  {"C64", 8, false, DType::f32},
};

const DTypeSpec* find_dtype(const std::string& name) {
  for (const DTypeSpec& d : kDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

std::string errno_text() { return std::strerror(errno); }

// A JSON value as a non-negative int64, or false.
bool to_offset(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = i;
    return true;
  }
  return false;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

// ---- SafetensorsFile ------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    data_start_ = std::exchange(o.data_start_, 0);
    entries_ = std::move(o.entries_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

void SafetensorsFile::unmap() {
  if (map_) munmap(map_, static_cast<size_t>(map_bytes_));
  map_ = nullptr;
  map_bytes_ = 0;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const std::string corrupt = "; the file is truncated or corrupt (download or save it again)";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(path + " does not exist");
    return io_error("cannot open " + path + ": " + errno_text());
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    std::string why = errno_text();
    ::close(fd);
    return io_error("cannot stat " + path + ": " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + " is not a regular file");
  }
  const int64_t file_bytes = static_cast<int64_t>(st.st_size);
  if (file_bytes < 8) {
    ::close(fd);
    return invalid_argument(path + " is " + std::to_string(file_bytes) +
                            " bytes long, too short for a safetensors file (it starts with an 8-byte header length)" +
                            corrupt);
  }
  void* map = mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  std::string map_error = map == MAP_FAILED ? errno_text() : "";
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return io_error("cannot memory-map " + path + ": " + map_error);

  SafetensorsFile f;
  f.path_ = path;
  f.map_ = map;
  f.map_bytes_ = file_bytes;

  const auto* bytes = static_cast<const unsigned char*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > static_cast<uint64_t>(file_bytes - 8))
    return invalid_argument(path + ": the header length field says " + std::to_string(header_len) +
                            " bytes, but the file has only " + std::to_string(file_bytes - 8) +
                            " bytes after it" + corrupt);
  f.data_start_ = 8 + static_cast<int64_t>(header_len);
  const int64_t data_bytes = file_bytes - f.data_start_;

  json header;
  try {
    const char* h = reinterpret_cast<const char*>(bytes + 8);
    header = json::parse(h, h + header_len);
  } catch (const json::exception& e) {  // syntax errors, and numbers out of range
    return invalid_argument(path + ": the header is not valid JSON (" + e.what() + ")" + corrupt);
  }
  if (!header.is_object())
    return invalid_argument(path + ": the header must be a JSON object, but it is " + with_article(header.type_name()) + corrupt);

  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object())
        return invalid_argument(path + ": '__metadata__' must be an object of strings, but it is " + with_article(v.type_name()));
      for (const auto& [k, mv] : v.items())
        if (mv.is_string()) f.metadata_[k] = mv.get<std::string>();
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    if (!v.is_object()) return invalid_argument(where + " must be an object with dtype, shape and data_offsets" + corrupt);
    auto dtype_it = v.find("dtype");
    auto shape_it = v.find("shape");
    auto offs_it = v.find("data_offsets");
    if (dtype_it == v.end() || !dtype_it->is_string())
      return invalid_argument(where + " has no string 'dtype'" + corrupt);
    if (shape_it == v.end() || !shape_it->is_array())
      return invalid_argument(where + " has no 'shape' list" + corrupt);
    if (offs_it == v.end() || !offs_it->is_array() || offs_it->size() != 2)
      return invalid_argument(where + " has no 'data_offsets' pair [begin, end]" + corrupt);

    Entry e;
    e.dtype_name = dtype_it->get<std::string>();
    std::vector<int64_t> dims;
    int64_t numel = 1;
    for (const json& d : *shape_it) {
      int64_t n = 0;
      if (!to_offset(d, &n)) return invalid_argument(where + ": shape " + json_brief(*shape_it) +
                                                     " must hold non-negative integers" + corrupt);
      if (__builtin_mul_overflow(numel, n, &numel))
        return invalid_argument(where + ": shape " + json_brief(*shape_it) + " has too many elements" + corrupt);
      dims.push_back(n);
    }
    if (!to_offset((*offs_it)[0], &e.begin) || !to_offset((*offs_it)[1], &e.end) || e.begin > e.end)
      return invalid_argument(where + ": data_offsets " + json_brief(*offs_it) +
                              " must be two non-negative integers with begin <= end" + corrupt);
    if (e.end > data_bytes)
      return invalid_argument(where + ": data_offsets " + json_brief(*offs_it) + " reach past the end of the data section (" +
                              std::to_string(data_bytes) + " bytes)" + corrupt);

    const DTypeSpec* spec = find_dtype(e.dtype_name);
    if (spec && spec->size > 0) {
      int64_t expected = 0;
      if (__builtin_mul_overflow(numel, spec->size, &expected) || expected != e.end - e.begin)
        return invalid_argument(where + ": data_offsets " + json_brief(*offs_it) + " cover " +
                                std::to_string(e.end - e.begin) + " bytes, but shape " + dims_text(dims) + " of " +
                                e.dtype_name + " needs " + std::to_string(numel) + " x " + std::to_string(spec->size) +
                                " bytes" + corrupt);
    }
    if (!spec) {
      e.unsupported = "has dtype '" + e.dtype_name + "', which is not a safetensors dtype kiln knows";
    } else if (!spec->supported) {
      e.unsupported = "has dtype " + e.dtype_name + ", which kiln does not read (it reads F32, BF16, F16, I32, I64)";
    } else if (dims.size() > static_cast<size_t>(kMaxDims)) {
      e.unsupported = "has " + std::to_string(dims.size()) + " dimensions; kiln tensors have at most " +
                      std::to_string(kMaxDims);
    }
    if (spec && spec->supported) e.dtype = spec->dtype;
    if (dims.size() <= static_cast<size_t>(kMaxDims)) {
      e.shape.ndim = static_cast<int>(dims.size());
      for (size_t i = 0; i < dims.size(); ++i) e.shape.dims[i] = dims[i];
    }
    f.entries_.emplace(name, std::move(e));
  }
  return f;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

Result<TensorInfo> SafetensorsFile::find(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return not_found("tensor '" + name + "' is not in " + path_);
  const Entry& e = it->second;
  if (!e.unsupported.empty()) return unsupported("tensor '" + name + "' in " + path_ + " " + e.unsupported);
  TensorInfo info;
  info.dtype = e.dtype;
  info.shape = e.shape;
  info.data = static_cast<const char*>(map_) + data_start_ + e.begin;
  info.file = path_;
  return info;
}

// ---- SafetensorsCheckpoint ------------------------------------------------------------------

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    return not_found("model folder '" + model_dir + "' does not exist or is not a folder");
  const fs::path dir(model_dir);
  const std::string single = (dir / "model.safetensors").string();
  const std::string index = (dir / "model.safetensors.index.json").string();

  SafetensorsCheckpoint ckpt;
  ckpt.dir_ = model_dir;
  if (fs::exists(single, ec)) {
    KILN_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single));
    for (const std::string& name : f.names()) ckpt.where_[name] = 0;
    ckpt.files_.push_back(std::make_unique<SafetensorsFile>(std::move(f)));
    return ckpt;
  }
  if (!fs::exists(index, ec))
    return not_found("model folder '" + model_dir + "' has neither " + single + " nor " + index +
                     "; it needs the weights in safetensors format (save with safe_serialization=True)");

  std::ifstream in(index, std::ios::binary);
  if (!in) return io_error("cannot open " + index + " for reading (check its permissions)");
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {  // syntax errors, and numbers out of range
    return invalid_argument(index + " is not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return invalid_argument(index + " has no 'weight_map' object (tensor name -> shard file)");

  std::map<std::string, size_t> shard_index;  // shard file name -> index into files_
  for (const auto& [name, v] : j["weight_map"].items()) {
    if (!v.is_string())
      return invalid_argument(index + ": weight_map entry for tensor '" + name + "' must be a shard file name, but it is " +
                              with_article(v.type_name()));
    const std::string shard = v.get<std::string>();
    auto it = shard_index.find(shard);
    if (it == shard_index.end()) {
      const std::string shard_path = (dir / shard).string();
      if (!fs::exists(shard_path, ec))
        return not_found(index + " puts tensor '" + name + "' in shard '" + shard + "', but " + shard_path +
                         " does not exist; the download is incomplete (fetch every model-*.safetensors file)");
      KILN_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(shard_path));
      ckpt.files_.push_back(std::make_unique<SafetensorsFile>(std::move(f)));
      it = shard_index.emplace(shard, ckpt.files_.size() - 1).first;
    }
    const SafetensorsFile& file = *ckpt.files_[it->second];
    if (!file.contains(name))
      return invalid_argument(index + " puts tensor '" + name + "' in " + file.path() +
                              ", but that file has no such tensor; the index and the shards do not match");
    ckpt.where_[name] = it->second;
  }
  return ckpt;
}

Result<TensorInfo> SafetensorsCheckpoint::find(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end())
    return not_found("tensor '" + name + "' is not in the checkpoint in '" + dir_ +
                     "'; the weights do not match this architecture or the checkpoint is incomplete");
  return files_[it->second]->find(name);
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, i] : where_) out.push_back(name);
  return out;
}

// ---- writer -----------------------------------------------------------------------------------

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  std::set<std::string> seen;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__")
      return invalid_argument("cannot write " + path + ": tensor name '" + name + "' is not allowed");
    if (!seen.insert(name).second)
      return invalid_argument("cannot write " + path + ": tensor name '" + name + "' appears twice");
    if (!t.device.is_cpu())
      return invalid_argument("cannot write " + path + ": tensor '" + name + "' is on " + t.device.str() +
                              "; copy it to the host first");
    if (t.numel() > 0 && t.data == nullptr)
      return invalid_argument("cannot write " + path + ": tensor '" + name + "' has no data");
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = safetensors_dtype_name(t.dtype);
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int i = 0; i < t.shape.ndim; ++i) shape.push_back(t.shape.dims[i]);
    entry["shape"] = shape;
    entry["data_offsets"] = {offset, offset + t.nbytes()};
    offset += t.nbytes();
    header[name] = entry;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // data section starts 8-byte aligned

  const std::string tmp = path + ".partial";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return io_error("cannot create " + tmp + ": " + errno_text() + " (does the folder exist and is it writable?)");
  unsigned char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& [name, t] : tensors) {
    if (!ok) break;
    size_t bytes = static_cast<size_t>(t.nbytes());
    if (bytes) ok = std::fwrite(t.data, 1, bytes, f) == bytes;
  }
  std::string why = ok ? "" : errno_text();
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    why = errno_text();
  }
  if (!ok) {
    std::remove(tmp.c_str());
    return io_error("writing " + tmp + " failed: " + why + " (is the disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return io_error("cannot rename " + tmp + " to " + path + ": " + ec.message());
  }
  return Status::Ok();
}

}  // namespace kiln
