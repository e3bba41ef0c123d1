// Preprocessing (see preprocess.h).
#include "core/plural.h"
#include "train/preprocess.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "train/checkpoint.h"
#include "train/packing.h"
#include "train/shuffle.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr size_t kPieceBytes = size_t(4) << 20;  // lines handed to the workers at once

struct Line {
  std::string text;
  int64_t number = 0;
};

struct LineResult {
  Result<TokenDocument> doc = TokenDocument{};
};

// Makes documents for `lines` on `threads` workers, each a contiguous range.
std::vector<LineResult> make_documents(const std::vector<Line>& lines, const DocumentMaker& make, int32_t threads) {
  std::vector<LineResult> out(lines.size());
  auto work = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      nlohmann::ordered_json j;
      try {
        j = nlohmann::ordered_json::parse(lines[i].text);
      } catch (const nlohmann::json::exception& e) {
        out[i].doc = invalid_argument(std::string("not valid JSON (") + e.what() + ")");
        continue;
      }
      if (!j.is_object()) {
        out[i].doc = invalid_argument("expected a JSON object, found " + with_article(j.type_name()));
        continue;
      }
      try {
        out[i].doc = make(j);
      } catch (const std::exception& e) {  // the error boundary: nothing a line holds may escape
        out[i].doc = invalid_argument(e.what());
      }
    }
  };
  const size_t n = lines.size(), t = std::max<size_t>(1, std::min<size_t>(threads, n / 8 + 1));
  std::vector<std::thread> pool;
  for (size_t k = 1; k < t; ++k) pool.emplace_back(work, n * k / t, n * (k + 1) / t);
  work(0, n / t);
  for (std::thread& th : pool) th.join();
  return out;
}

// Packs one split and writes its shards; returns its meta.json entry.
Result<nlohmann::ordered_json> write_split(const std::string& split, std::vector<TokenDocument> docs,
                                           const PreprocessOptions& o) {
  const int64_t n_docs = static_cast<int64_t>(docs.size());
  PackedRows packed = pack_documents(std::move(docs), o.seq_len, o.pack, o.seed);
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  int64_t targets = 0;
  for (const TokenDocument& p : packed.pieces)
    for (uint8_t m : p.mask) targets += m;
  size_t row = 0;
  int32_t index = 0;
  do {  // one shard at least, so that an empty split still reads as one
    char name[64];
    std::snprintf(name, sizeof(name), "%s-%05d.kshard", split.c_str(), index++);
    ShardWriter w((fs::path(o.output) / name).string());
    for (; row < packed.rows.size() && (w.tokens() == 0 || w.tokens() + o.seq_len <= o.shard_tokens); ++row) {
      std::vector<const TokenDocument*> parts;
      for (int32_t p : packed.rows[row]) parts.push_back(&packed.pieces[p]);
      w.add_row(parts);
    }
    KILN_RETURN_IF_ERROR(w.finish());
    shards.push_back({{"file", name}, {"rows", w.rows()}, {"tokens", w.tokens()}});
  } while (row < packed.rows.size());
  nlohmann::ordered_json j;
  j["rows"] = static_cast<int64_t>(packed.rows.size());
  j["tokens"] = packed.tokens;
  j["targets"] = targets;
  j["documents"] = n_docs;
  j["split_documents"] = packed.split_documents;
  j["packing_efficiency"] = packed.efficiency(o.seq_len);
  j["shards"] = shards;
  return j;
}

}  // namespace

Result<PreprocessReport> preprocess(const PreprocessOptions& o, const DocumentMaker& make,
                                    const std::function<void(const std::string&)>& warn,
                                    const std::function<void(const PreprocessProgress&)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  if (o.inputs.empty()) return invalid_argument("--input: give at least one JSONL file");
  if (o.seq_len <= 1) return invalid_argument("--seq-len must be at least 2");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) return invalid_argument("--val-fraction must be in [0, 1)");
  // Each worker is a std::thread per piece of input: a count beyond any machine's cores would only
  // fail to start them.
  if (o.threads < 0 || o.threads > 1024) return invalid_argument("--threads must be within [0, 1024] (0: all cores)");
  if (o.shard_tokens < o.seq_len) return invalid_argument("--shard-tokens must be at least --seq-len");
  PreprocessProgress prog;
  nlohmann::ordered_json inputs = nlohmann::ordered_json::array();
  for (const std::string& path : o.inputs) {
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) return io_error("cannot read the input '" + path + "': " + ec.message());
    prog.bytes_total += static_cast<int64_t>(size);
  }
  std::error_code ec;
  const fs::path out_dir(o.output);
  if (fs::exists(out_dir / "meta.json") && !o.overwrite)
    return invalid_argument("'" + o.output + "' already holds preprocessed data; pass --overwrite to replace it");
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir)) return io_error("cannot create the output directory '" + o.output + "'");
  fs::remove(out_dir / "meta.json", ec);  // from here on the directory is incomplete until meta.json
  for (const fs::directory_entry& e : fs::directory_iterator(out_dir))
    if (e.path().extension() == ".kshard") fs::remove(e.path(), ec);

  const int32_t threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  std::vector<TokenDocument> docs;
  PreprocessReport report;
  for (const std::string& path : o.inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return io_error("cannot read the input '" + path + "'");
    int64_t line_no = 0, file_bytes = 0;
    std::vector<Line> piece;
    size_t piece_bytes = 0;
    auto flush = [&]() -> Status {
      std::vector<LineResult> made = make_documents(piece, make, threads);
      for (size_t i = 0; i < made.size(); ++i) {
        if (!made[i].doc.ok()) {
          const std::string msg = path + ":" + std::to_string(piece[i].number) + ": " + made[i].doc.status().message();
          if (!o.skip_bad_lines) return invalid_argument(msg + " (pass --skip-bad-lines to skip such lines)");
          ++report.bad_lines;
          if (warn) warn(msg);
          continue;
        }
        TokenDocument& d = *made[i].doc;
        if (d.ids.empty()) continue;
        docs.push_back(std::move(d));
      }
      prog.documents = static_cast<int64_t>(docs.size());
      if (progress) progress(prog);
      piece.clear();
      piece_bytes = 0;
      return Status::Ok();
    };
    std::string text;
    while (std::getline(in, text)) {
      ++line_no;
      file_bytes += static_cast<int64_t>(text.size()) + 1;
      prog.bytes_done += static_cast<int64_t>(text.size()) + 1;
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      piece_bytes += text.size();
      piece.push_back({std::move(text), line_no});
      if (piece_bytes >= kPieceBytes) KILN_RETURN_IF_ERROR(flush());
    }
    if (in.bad()) return io_error("error reading '" + path + "'");
    KILN_RETURN_IF_ERROR(flush());
    inputs.push_back({{"path", fs::absolute(path).string()}, {"bytes", file_bytes}, {"lines", line_no}});
    report.bytes += file_bytes;
  }
  prog.finished_reading = true;
  if (progress) progress(prog);
  if (docs.empty()) return invalid_argument("the inputs hold no documents");
  report.documents = static_cast<int64_t>(docs.size());

  // The validation split: a seeded choice of documents (at least one when a fraction is asked).
  std::vector<TokenDocument> train, val;
  const int64_t n = static_cast<int64_t>(docs.size());
  int64_t n_val = static_cast<int64_t>(o.val_fraction * static_cast<double>(n) + 0.5);
  if (o.val_fraction > 0.0) n_val = std::clamp<int64_t>(n_val, 1, n - 1);
  if (o.val_fraction > 0.0 && n < 2) return invalid_argument("--val-fraction needs at least two documents");
  std::vector<uint8_t> is_val(static_cast<size_t>(n), 0);
  if (n_val > 0) {
    const std::vector<int64_t> order = seeded_permutation(n, o.seed, /*stream=*/0x76616cull);
    for (int64_t i = 0; i < n_val; ++i) is_val[order[i]] = 1;
  }
  for (int64_t i = 0; i < n; ++i) (is_val[i] ? val : train).push_back(std::move(docs[i]));
  docs.clear();
  docs.shrink_to_fit();

  nlohmann::ordered_json meta;
  meta["format"] = "kiln-preprocessed";
  meta["version"] = 1;
  meta["data_format"] = o.data_format;
  meta["seq_len"] = o.seq_len;
  meta["packed"] = o.pack;
  meta["seed"] = o.seed;
  meta["val_fraction"] = o.val_fraction;
  meta["tokenizer"] = o.tokenizer_info;
  meta["inputs"] = inputs;
  meta["documents"] = report.documents;
  meta["bad_lines"] = report.bad_lines;
  nlohmann::ordered_json splits;
  KILN_ASSIGN_OR_RETURN(splits["train"], write_split("train", std::move(train), o));
  if (!val.empty()) {
    KILN_ASSIGN_OR_RETURN(splits["val"], write_split("val", std::move(val), o));
  }
  meta["splits"] = splits;
  KILN_RETURN_IF_ERROR(write_file_atomic((out_dir / "meta.json").string(), meta.dump(2) + "\n"));
  report.meta = meta;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace kiln
