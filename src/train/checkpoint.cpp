#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <system_error>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "model/safetensors.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Files of a model folder that are not weights: tokenizer, templates, generation defaults.
constexpr const char* kCopiedFiles[] = {
    "tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json",         "merges.txt",            "added_tokens.json",       "chat_template.jinja",
    "chat_template.json", "generation_config.json",
};
constexpr const char* kCopiedDirs[] = {"additional_chat_templates"};

Status copy_file_atomic(const fs::path& src, const fs::path& dst) {
  std::ifstream in(src, std::ios::binary);
  if (!in) return io_error("cannot read '" + src.string() + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return write_file_atomic(dst.string(), text);
}

}  // namespace

Status write_file_atomic(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("cannot write '" + partial + "': " + std::strerror(errno));
  const char* p = text.data();
  size_t left = text.size();
  bool ok = true;
  while (ok && left > 0) {
    const ssize_t n = ::write(fd, p, left);
    ok = n > 0;
    if (ok) {
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  ok = ok && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) {
    ::unlink(partial.c_str());
    return io_error("error writing '" + partial + "' (disk full?)");
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0)
    return io_error("cannot rename '" + partial + "' to '" + path + "': " + std::strerror(errno));
  return Status::Ok();
}

namespace {

const char* torch_dtype_name(DType dt) {
  switch (dt) {
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: return "float32";
  }
}

}  // namespace

Status prepare_output_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    return io_error("cannot create the output directory '" + dir + "'" + (ec ? ": " + ec.message() : ""));
  const fs::path probe = fs::path(dir) / ".kiln-write-test";
  {
    std::ofstream out(probe, std::ios::binary | std::ios::trunc);
    if (!out || !(out << "ok") || !out.flush())
      return io_error("the output directory '" + dir + "' is not writable");
  }
  fs::remove(probe, ec);
  return Status::Ok();
}

Result<Tensor> whole_master(Backend& be, const ParameterSet& params, Collectives* collectives, TensorBuffer& storage) {
  if (!params.master_sharded()) return params.master();
  if (!collectives || collectives->size() != params.shards())
    return invalid_argument("the master weights are sharded, but the ranks that hold them are not given");
  KILN_ASSIGN_OR_RETURN(storage, empty(be, {params.size()}, DType::f32));
  KILN_RETURN_IF_ERROR(collectives->all_gather(be, params.master(), storage.view()));
  return storage.view();
}

Status save_hf_checkpoint(Backend& be, const ParameterSet& params, const std::string& source_dir,
                          const std::string& output_dir, DType dtype, Tensor master) {
  KILN_RETURN_IF_ERROR(prepare_output_dir(output_dir));
  if (master.data == nullptr) master = params.master();
  KILN_ASSERT(master.numel() == params.size());
  // The weights: master (f32) -> dtype on the device, then one copy to the host.
  KILN_ASSIGN_OR_RETURN(TensorBuffer converted, empty(be, {params.size()}, dtype));
  ops::cast(be, converted, master);
  TensorBuffer host = to_host(be, converted);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const HfTensor& t : params.layout().hf) tensors.emplace_back(t.name, params.hf_view(host.view(), t));
  KILN_RETURN_IF_ERROR(write_safetensors((fs::path(output_dir) / "model.safetensors").string(), tensors,
                                         {{"format", "pt"}}));
  // A stale index from an earlier sharded save would point transformers at missing shards.
  std::error_code ec;
  fs::remove(fs::path(output_dir) / "model.safetensors.index.json", ec);

  // config.json: the source's, with the dtype entries naming what was written.
  const fs::path src_config = fs::path(source_dir) / "config.json";
  nlohmann::json cfg;
  if (fs::exists(src_config)) {
    std::ifstream in(src_config);
    try {
      cfg = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {  // syntax errors, and numbers out of range
      return invalid_argument("cannot re-read '" + src_config.string() + "': " + e.what());
    }
  }
  if (cfg.contains("dtype") || !cfg.contains("torch_dtype")) cfg["dtype"] = torch_dtype_name(dtype);
  if (cfg.contains("torch_dtype")) cfg["torch_dtype"] = torch_dtype_name(dtype);
  KILN_RETURN_IF_ERROR(write_file_atomic((fs::path(output_dir) / "config.json").string(), cfg.dump(2) + "\n"));

  if (fs::equivalent(fs::path(source_dir), fs::path(output_dir), ec)) return Status::Ok();
  for (const char* name : kCopiedFiles) {
    const fs::path src = fs::path(source_dir) / name;
    if (fs::is_regular_file(src)) KILN_RETURN_IF_ERROR(copy_file_atomic(src, fs::path(output_dir) / name));
  }
  for (const char* name : kCopiedDirs) {
    const fs::path src = fs::path(source_dir) / name;
    if (!fs::is_directory(src)) continue;
    fs::create_directories(fs::path(output_dir) / name, ec);
    for (const fs::directory_entry& e : fs::directory_iterator(src))
      if (e.is_regular_file())
        KILN_RETURN_IF_ERROR(copy_file_atomic(e.path(), fs::path(output_dir) / name / e.path().filename()));
  }
  return Status::Ok();
}

}  // namespace kiln
