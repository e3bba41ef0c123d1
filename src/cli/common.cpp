#include "cli/common.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

namespace kiln::cli {

int fail(const Status& s) {
  std::fprintf(stderr, "kiln: error: %s\n", s.message().c_str());
  return 1;
}

Result<std::vector<int32_t>> parse_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  if (text.find_first_not_of(" \t") == std::string::npos) return ids;  // "" is the empty list
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    char* end = nullptr;
    errno = 0;
    long long v = item.empty() ? 0 : std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || v < INT32_MIN || v > INT32_MAX)
      return invalid_argument(std::string(flag) + ": '" + item + "' is not an integer token id (expected e.g. 1,2,3)");
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

Result<std::string> read_text(const std::string& path) {
  std::stringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot read " + path);
  ss << in.rdbuf();
  return ss.str();
}

std::string bundled_model_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return (exe.parent_path().parent_path() / "share" / "kiln" / "tiny-llama").lexically_normal().string();
}

void ModelFlags::add(CLI::App* cmd, const std::string& default_model) {
  model_dir = default_model;
  cmd->add_option("--model", model_dir, "Hugging Face model folder (config.json + safetensors)")->capture_default_str();
  cmd->add_option("--device", device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_flag("--random-weights", random_weights, "build the model from config.json alone with seeded random weights");
  cmd->add_option("--weight-seed", weight_seed, "seed of --random-weights");
}

void SamplingFlags::add(CLI::App* cmd) {
  temperature_option_ =
      cmd->add_option("--temperature", temperature, "sampling temperature; 0 is greedy")->capture_default_str();
  top_k_option_ = cmd->add_option("--top-k", top_k, "keep the k most likely tokens (0: all)")->capture_default_str();
  top_p_option_ = cmd->add_option("--top-p", top_p, "nucleus sampling mass")->capture_default_str();
  CLI::Option* opt = cmd->add_option("--seed", seed, seed.empty() ? "sampling seed (default: random)" : "sampling seed");
  if (!seed.empty()) opt->capture_default_str();
}

Status SamplingFlags::apply(GenerationRequest* r) const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    return invalid_argument("--temperature must be a finite value >= 0 (0 is greedy)");
  if (!(top_p > 0 && top_p <= 1)) return invalid_argument("--top-p must be in (0, 1]");
  if (top_k < 0) return invalid_argument("--top-k must be >= 0 (0: all tokens)");
  r->temperature = temperature;
  r->top_k = top_k;
  r->top_p = top_p;
  if (seed.empty()) {
    r->seed = std::random_device{}();
  } else {
    KILN_ASSIGN_OR_RETURN(r->seed, parse_u64(seed, "--seed"));
  }
  return Status::Ok();
}

void SamplingFlags::prefer_model_defaults(const SamplingDefaults& d, GenerationRequest* r) const {
  const GenerationRequest flags = *r;
  d.apply(r);
  if (temperature_option_ && temperature_option_->count() > 0) r->temperature = flags.temperature;
  if (top_k_option_ && top_k_option_->count() > 0) r->top_k = flags.top_k;
  if (top_p_option_ && top_p_option_->count() > 0) r->top_p = flags.top_p;
}

Result<uint64_t> parse_u64(const std::string& text, const char* flag) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return invalid_argument(std::string(flag) + " must be an integer in [0, 18446744073709551615], not '" + text + "'");
  return v;
}

bool TextStreamer::push(int32_t id) {
  Result<std::string> piece = decoder_.push(id);
  if (!piece.ok()) {
    status_ = piece.status();
    return false;
  }
  std::fwrite(piece->data(), 1, piece->size(), stdout);
  std::fflush(stdout);
  return true;
}

void TextStreamer::finish() {
  std::string rest = decoder_.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

Result<LoadedModel> load_model(const ModelFlags& f) {
  LoadedModel l;
  KILN_ASSIGN_OR_RETURN(Device device, parse_device(f.device));
  KILN_ASSIGN_OR_RETURN(l.backend, make_backend(device));
  ModelLoadOptions opts;
  opts.random_weights = f.random_weights;
  KILN_ASSIGN_OR_RETURN(opts.seed, parse_u64(f.weight_seed, "--weight-seed"));
  KILN_ASSIGN_OR_RETURN(l.model, Transformer::load(*l.backend, f.model_dir, opts));
  return l;
}

}  // namespace kiln::cli
