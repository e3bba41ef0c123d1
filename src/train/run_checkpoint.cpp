// Training checkpoints (see run_checkpoint.h).
#include "train/run_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json_text.h"
#include "core/sha256.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStateFile = "trainer_state.json";
constexpr const char* kPrefix = "checkpoint-";

Status fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open '" + p.string() + "' to flush it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return io_error("cannot flush '" + p.string() + "' to disk: " + std::strerror(errno));
  return Status::Ok();
}

// Size and CRC-32 of a file, read in 4 MiB pieces.
Result<std::pair<int64_t, uint32_t>> size_and_crc(const fs::path& p) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(p.c_str(), "rb"), &std::fclose);
  if (!f) return io_error("cannot read '" + p.string() + "'");
  std::vector<unsigned char> piece(size_t(4) << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  int64_t bytes = 0;
  size_t got = 0;
  while ((got = std::fread(piece.data(), 1, piece.size(), f.get())) > 0) {
    crc = crc32(crc, piece.data(), static_cast<uInt>(got));
    bytes += static_cast<int64_t>(got);
  }
  if (std::ferror(f.get())) return io_error("error reading '" + p.string() + "'");
  return std::make_pair(bytes, static_cast<uint32_t>(crc));
}

int64_t checkpoint_step(const fs::path& p) {
  const std::string name = p.filename().string();
  if (name.rfind(kPrefix, 0) != 0) return -1;
  const std::string digits = name.substr(std::strlen(kPrefix));
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

// The checkpoints under `run_dir` that hold a trainer state, oldest first.
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (fs::directory_iterator it(run_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = checkpoint_step(it->path());
    if (step >= 0 && fs::is_regular_file(it->path() / kStateFile)) out.emplace_back(step, it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Writes `flat`'s Hugging Face tensors (an [N] f32 tensor laid out like the parameters: the master
// weights) to `path`.
Status write_flat(Backend& be, const ParameterSet& params, Tensor flat, const fs::path& path) {
  TensorBuffer host = to_host(be, flat);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const HfTensor& t : params.layout().hf) tensors.emplace_back(t.name, params.hf_view(host.view(), t));
  return write_safetensors(path.string(), tensors, {{"format", "pt"}});
}

// Reads `path`'s Hugging Face tensors (f32, the parameters' shapes) into the [N] tensor `flat`.
Status read_flat(Backend& be, const ParameterSet& params, Tensor flat, const fs::path& path) {
  KILN_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path.string()));
  for (const HfTensor& t : params.layout().hf) {
    Tensor dst = params.hf_view(flat, t);
    Result<TensorInfo> info = file.find(t.name);
    if (!info.ok()) return invalid_argument("'" + path.string() + "' has no tensor " + t.name);
    if (info->dtype != DType::f32 || info->shape.numel() != dst.numel())
      return invalid_argument("'" + path.string() + "': " + t.name + " is " + dtype_name(info->dtype) +
                              info->shape.str() + ", expected f32" + dst.shape.str());
    Tensor src = dst;
    src.data = const_cast<void*>(info->data);
    src.device = Device{};
    be.copy(dst, src);
  }
  return be.synchronize();
}

// Every rank's outcome of a part of a collective save: this rank's error, or an error naming how
// many others failed, or Ok when all succeeded (so that no rank waits for one that gave up).
Status agree(Collectives* coll, Status mine, const std::string& what) {
  if (!coll || coll->size() == 1) return mine;
  double failed = mine.ok() ? 0.0 : 1.0;
  KILN_RETURN_IF_ERROR(coll->sum(&failed, 1));
  if (!mine.ok()) return mine;
  if (failed > 0) return io_error(std::to_string(static_cast<int64_t>(failed)) + " other rank(s) failed " + what);
  return Status::Ok();
}

std::string shard_file(const std::string& state, int32_t rank, int32_t ranks) {
  return "optimizer/" + state + ".rank-" + std::to_string(rank) + "-of-" + std::to_string(ranks) + ".safetensors";
}

// A piece of a saved optimizer state: elements [begin, end) of `state` in `file`.
struct StatePiece {
  std::string state, file;
  int64_t begin = 0, end = 0, space = 0;
};

// Fills `s.values` (elements [s.begin, s.begin + n) of its space) from the pieces of its state;
// elements past the saved space are the padding of a run with more ranks: zero.
Status load_state(Backend& be, const OptimizerState& s, const std::vector<StatePiece>& pieces, const fs::path& dir) {
  const int64_t begin = s.begin, end = s.begin + s.values.numel();
  std::vector<const StatePiece*> mine;
  for (const StatePiece& p : pieces)
    if (p.state == s.name) mine.push_back(&p);
  std::sort(mine.begin(), mine.end(), [](const StatePiece* a, const StatePiece* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < mine.size(); ++i)
    if (mine[i]->begin < mine[i - 1]->end || mine[i]->space != mine[0]->space)
      return invalid_argument("the checkpoint's pieces of " + s.name + " overlap or disagree on its size");
  int64_t saved_space = -1, covered = 0;
  for (const StatePiece* piece : mine) {
    const StatePiece& p = *piece;
    saved_space = p.space;
    const int64_t a = std::max(begin, p.begin), b = std::min(end, p.end);
    if (a >= b) continue;
    const fs::path path = dir / p.file;
    KILN_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(path.string()));
    Result<TensorInfo> info = file.find(s.name);
    if (!info.ok() || info->dtype != DType::f32 || info->shape.numel() != p.end - p.begin)
      return invalid_argument("'" + path.string() + "' does not hold " + s.name + " (f32, " +
                              std::to_string(p.end - p.begin) + " values) as the manifest says");
    Tensor src{const_cast<void*>(info->data), DType::f32, Device{}, Shape{p.end - p.begin}};
    be.copy(s.values.rows(a - begin, b - begin), src.rows(a - p.begin, b - p.begin));
    KILN_RETURN_IF_ERROR(be.synchronize());  // the file is unmapped when it goes out of scope
    covered += b - a;
  }
  if (saved_space < 0) return invalid_argument("the checkpoint has no " + s.name);
  const int64_t saved_end = std::min(end, saved_space);
  if (covered != std::max<int64_t>(saved_end - begin, 0))
    return invalid_argument("the checkpoint's pieces of " + s.name + " do not cover elements [" +
                            std::to_string(begin) + ", " + std::to_string(saved_end) + ")");
  if (saved_end < end) be.zero(s.values.rows(std::max<int64_t>(saved_end, begin) - begin, end - begin));
  return Status::Ok();
}

}  // namespace

std::string layout_fingerprint(const ParameterSet& params) {
  std::string text;
  for (const HfTensor& t : params.layout().hf) {
    const Tensor v = params.hf_view(params.compute(), t);
    text += t.name + " " + v.shape.str() + "\n";
  }
  return sha256_hex(text);
}

Result<std::string> save_training_checkpoint(Backend& be, const ParameterSet& params, const Optimizer& optimizer,
                                             const TrainingState& state, const std::string& model_dir,
                                             const std::string& run_dir, DType save_dtype, int32_t keep_last,
                                             Collectives* coll) {
  const int32_t rank = coll ? coll->rank() : 0, ranks = coll ? coll->size() : 1;
  const bool writer = rank == 0;
  const fs::path run(run_dir);
  const std::string name = kPrefix + std::to_string(state.step);
  const fs::path partial = run / ("." + name + ".partial"), final_dir = run / name;
  std::error_code ec;
  Status made = Status::Ok();
  if (writer) {
    fs::remove_all(partial, ec);
    fs::create_directories(partial / "optimizer", ec);
    if (ec) made = io_error("cannot create '" + partial.string() + "': " + ec.message());
  }
  KILN_RETURN_IF_ERROR(agree(coll, made, "to create the checkpoint directory"));

  // The model and the master weights (gathered first when sharded: every rank takes part).
  TensorBuffer gathered;
  KILN_ASSIGN_OR_RETURN(Tensor master, whole_master(be, params, coll, gathered));
  Status wrote = Status::Ok();
  if (writer) {
    wrote = save_hf_checkpoint(be, params, model_dir, partial.string(), save_dtype, master);
    if (wrote.ok() && save_dtype != DType::f32)
      wrote = write_flat(be, params, master, partial / "optimizer" / "master.safetensors");
  }
  // The optimizer state: each rank its shard, or rank 0 all of it.
  const bool sharded = optimizer.sharded();
  nlohmann::json pieces = nlohmann::json::array();
  for (const OptimizerState& st : optimizer.state_tensors()) {
    const std::string file = sharded ? shard_file(st.name, rank, ranks) : "optimizer/" + st.name + ".safetensors";
    if (wrote.ok() && (sharded || writer)) {
      TensorBuffer host = to_host(be, st.values);
      wrote = write_safetensors((partial / file).string(), {{st.name, host.view()}},
                                {{"layout", layout_fingerprint(params)}, {"begin", std::to_string(st.begin)},
                                 {"space", std::to_string(st.space)}});
    }
    // The manifest lists every rank's piece: shards are equal, so rank r's range is known here.
    for (int32_t r = 0; r < (sharded ? ranks : 1); ++r) {
      const int64_t n = st.values.numel(), begin = sharded ? st.begin + (r - rank) * n : st.begin;
      pieces.push_back({{"state", st.name},
                        {"file", sharded ? shard_file(st.name, r, ranks) : file},
                        {"begin", begin},
                        {"end", begin + n},
                        {"space", st.space}});
    }
  }
  KILN_RETURN_IF_ERROR(agree(coll, wrote, "to write their part of " + partial.string()));

  Status finished = Status::Ok();
  if (writer) {
    finished = [&]() -> Status {
      nlohmann::json j;
      j["format"] = "kiln-training-checkpoint";
      j["version"] = 2;
      j["step"] = state.step;
      j["policy_version"] = state.policy_version;
      j["optimizer_steps"] = state.optimizer_steps;
      j["sampler"] = state.sampler;
      j["config"] = state.config;
      j["layout"] = layout_fingerprint(params);
      j["master_in_model"] = save_dtype == DType::f32;
      nlohmann::json optimizer_states = nlohmann::json::array();
      for (const OptimizerState& st : optimizer.state_tensors()) optimizer_states.push_back(st.name);
      j["optimizer_states"] = optimizer_states;
      j["optimizer_pieces"] = pieces;
      j["ranks"] = ranks;
      nlohmann::json files = nlohmann::json::object();
      for (const fs::directory_entry& e : fs::recursive_directory_iterator(partial)) {
        if (!e.is_regular_file()) continue;
        KILN_ASSIGN_OR_RETURN(auto sc, size_and_crc(e.path()));
        KILN_RETURN_IF_ERROR(fsync_path(e.path()));
        files[fs::relative(e.path(), partial).generic_string()] = {{"bytes", sc.first}, {"crc32", sc.second}};
      }
      j["files"] = files;
      KILN_RETURN_IF_ERROR(write_file_atomic((partial / kStateFile).string(), j.dump(2) + "\n"));
      KILN_RETURN_IF_ERROR(fsync_path(partial / "optimizer"));
      KILN_RETURN_IF_ERROR(fsync_path(partial));

      // Into place: a checkpoint of the same step (a run resumed before it) is replaced.
      const fs::path old = run / ("." + name + ".old");
      fs::remove_all(old, ec);
      if (fs::exists(final_dir)) {
        fs::rename(final_dir, old, ec);
        if (ec) return io_error("cannot move the old '" + final_dir.string() + "' aside: " + ec.message());
      }
      fs::rename(partial, final_dir, ec);
      if (ec) return io_error("cannot rename '" + partial.string() + "' to '" + final_dir.string() + "': " + ec.message());
      KILN_RETURN_IF_ERROR(fsync_path(run));
      fs::remove_all(old, ec);

      if (keep_last > 0) {
        std::vector<std::pair<int64_t, fs::path>> all = list_checkpoints(run);
        for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) fs::remove_all(all[i].second, ec);
      }
      return Status::Ok();
    }();
  }
  KILN_RETURN_IF_ERROR(agree(coll, finished, "to complete " + final_dir.string()));
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> all = list_checkpoints(run_dir);
  return all.empty() ? std::string() : all.back().second.string();
}

Result<std::string> resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(path) / kStateFile, ec)) return path;
  if (!fs::is_directory(path, ec)) return invalid_argument("--resume: '" + path + "' is not a directory");
  const std::string latest = latest_checkpoint(path);
  if (latest.empty())
    return invalid_argument("--resume: '" + path + "' is neither a checkpoint (no " + kStateFile +
                            ") nor a run directory holding checkpoint-<step>/ folders");
  return latest;
}

Result<TrainingState> load_training_checkpoint(Backend& be, ParameterSet& params, Optimizer& optimizer,
                                               const std::string& checkpoint_dir) {
  const fs::path dir(checkpoint_dir);
  const std::string where = "the checkpoint '" + checkpoint_dir + "'";
  std::ifstream in(dir / kStateFile, std::ios::binary);
  if (!in) return invalid_argument(where + " has no " + kStateFile);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  TrainingState state;
  bool master_in_model = false;
  std::vector<StatePiece> pieces;
  try {
    j = nlohmann::json::parse(text.str());
    if (j.value("format", "") != "kiln-training-checkpoint" || j.value("version", 0) != 2)
      return invalid_argument(where + " is not a version 2 kiln training checkpoint (one written by this kiln)");
    for (const auto& [file, info] : j.at("files").items()) {
      if (file.find("..") != std::string::npos) return invalid_argument(where + " names a file outside itself");
      Result<std::pair<int64_t, uint32_t>> sc = size_and_crc(dir / file);
      if (!sc.ok()) return invalid_argument(where + " is incomplete: " + file + " is missing");
      if (sc->first != info.at("bytes").get<int64_t>())
        return invalid_argument(where + " is damaged: " + file + " has " + std::to_string(sc->first) +
                                " bytes, " + std::to_string(info.at("bytes").get<int64_t>()) + " were written");
      if (sc->second != info.at("crc32").get<uint32_t>())
        return invalid_argument(where + " is damaged: " + file + " fails its CRC-32 check");
    }
    if (j.at("layout").get<std::string>() != layout_fingerprint(params))
      return invalid_argument(where + " was made for a different model (its tensors' names or shapes differ from --model's)");
    state.step = j.at("step").get<int64_t>();
    state.policy_version = j.at("policy_version").get<uint64_t>();
    state.optimizer_steps = j.at("optimizer_steps").get<int64_t>();
    state.sampler = j.at("sampler");
    state.config = j.at("config");
    master_in_model = j.at("master_in_model").get<bool>();
    std::vector<std::string> saved = j.at("optimizer_states").get<std::vector<std::string>>();
    std::vector<std::string> mine;
    for (const OptimizerState& st : optimizer.state_tensors()) mine.push_back(st.name);
    if (saved != mine)
      return invalid_argument(where + " holds the state of a different optimizer (" +
                              (saved.empty() ? std::string("none") : saved.front()) + ", ...); resume with its --optimizer");
    for (const nlohmann::json& p : j.at("optimizer_pieces")) {
      StatePiece piece{p.at("state").get<std::string>(), p.at("file").get<std::string>(), p.at("begin").get<int64_t>(),
                       p.at("end").get<int64_t>(), p.at("space").get<int64_t>()};
      if (piece.file.find("..") != std::string::npos || piece.begin < 0 || piece.end < piece.begin ||
          piece.end > piece.space)
        return invalid_argument(where + ": its manifest lists an invalid optimizer piece (" + json_brief(p) + ")");
      pieces.push_back(std::move(piece));
    }
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(where + ": " + kStateFile + " is malformed: " + e.what());
  }
  const fs::path master_file = master_in_model ? dir / "model.safetensors" : dir / "optimizer" / "master.safetensors";
  if (params.master_sharded()) {  // read whole, keep this rank's part
    KILN_ASSIGN_OR_RETURN(TensorBuffer whole, empty(be, {params.size()}, DType::f32));
    be.zero(whole);
    KILN_RETURN_IF_ERROR(read_flat(be, params, whole.view(), master_file));
    params.assign(be, whole.view());
  } else {
    KILN_RETURN_IF_ERROR(read_flat(be, params, params.master(), master_file));
    params.sync_compute(be);
  }
  for (const OptimizerState& st : optimizer.state_tensors()) KILN_RETURN_IF_ERROR(load_state(be, st, pieces, dir));
  optimizer.restore_steps_taken(state.optimizer_steps);
  KILN_RETURN_IF_ERROR(be.synchronize());
  return state;
}

}  // namespace kiln
