// kiln info: what a model folder holds, read without loading the weights: the architecture and its
// shapes, the parameter count, the checkpoint's dtypes, context and RoPE, the tokenizer's
// vocabulary and special tokens, chat templates and tool support, and the memory the model needs
// on each device. Text by default, --json for scripts.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>

#include "cli/common.h"
#include "model/config.h"
#include "model/model_text.h"
#include "model/safetensors.h"
#include "model/tensor_table.h"

namespace kiln::cli {
namespace {

namespace fs = std::filesystem;

struct InfoFlags {
  std::string model_dir;
  bool json = false;
};

// A float config value as JSON, written with the digits that identify the float (1e-05, not
// 9.999999747378752e-06).
nlohmann::ordered_json f32_json(float v) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.9g", static_cast<double>(v));
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(s, sizeof(s), "%.*g", digits, static_cast<double>(v));
    if (std::strtof(s, nullptr) == v) break;
  }
  return nlohmann::ordered_json(std::strtod(s, nullptr));
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, ++u;
  char s[32];
  std::snprintf(s, sizeof(s), u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return s;
}

std::string human_count(double n) {
  char s[32];
  if (n >= 1e9)
    std::snprintf(s, sizeof(s), "%.2fB", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(s, sizeof(s), "%.1fM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(s, sizeof(s), "%.1fK", n / 1e3);
  else
    std::snprintf(s, sizeof(s), "%.0f", n);
  return s;
}

// The checkpoint's tensors by dtype (count and bytes), and whether they make the config's model.
nlohmann::ordered_json checkpoint_info(const ModelConfig& c, const std::string& dir) {
  nlohmann::ordered_json j;
  Result<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::open(dir);
  if (!ckpt.ok()) {
    j["error"] = ckpt.status().message();
    return j;
  }
  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // dtype -> (tensors, bytes)
  int64_t unreadable = 0;
  for (const std::string& name : ckpt->names()) {
    Result<TensorInfo> t = ckpt->find(name);
    if (!t.ok()) {
      ++unreadable;
      continue;
    }
    auto& [count, bytes] = by_dtype[dtype_name(t->dtype)];
    ++count;
    bytes += t->nbytes();
  }
  nlohmann::ordered_json dtypes = nlohmann::ordered_json::object();
  int64_t total = 0;
  for (const auto& [name, cb] : by_dtype) {
    dtypes[name] = {{"tensors", cb.first}, {"bytes", cb.second}};
    total += cb.second;
  }
  j["dtypes"] = dtypes;
  j["bytes"] = total;
  if (unreadable > 0) j["unreadable_tensors"] = unreadable;
  const Status fits = check_checkpoint(model_tensor_layout(c), dir);
  j["matches_config"] = fits.ok();
  if (!fits.ok()) j["error"] = fits.message();
  return j;
}

nlohmann::ordered_json text_info(const std::string& dir) {
  nlohmann::ordered_json j;
  if (!fs::exists(fs::path(dir) / "tokenizer.json")) {
    j["tokenizer"] = nullptr;
    return j;
  }
  Result<ModelText> text = ModelText::load(dir);
  if (!text.ok()) {
    j["error"] = text.status().message();
    return j;
  }
  const Tokenizer& tok = text->tokenizer();
  j["vocab_size"] = tok.vocab_size();
  const SpecialTokens& sp = text->special_tokens();
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  for (const auto& [key, value] : {std::pair{"bos", &sp.bos}, {"eos", &sp.eos}, {"pad", &sp.pad}, {"unk", &sp.unk}})
    special[key] = value->empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(*value);
  j["special_tokens"] = special;
  j["stop_ids"] = text->stop_ids();
  // Tool support: a tool given to the template shows up in what it renders.
  const nlohmann::ordered_json probe_messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  const nlohmann::ordered_json probe_tools = nlohmann::ordered_json::array(
      {{{"type", "function"},
        {"function", {{"name", "kiln_probe_tool"}, {"description", "probe"}, {"parameters", {{"type", "object"}}}}}}});
  Result<std::string> plain = text->render_chat(probe_messages, nlohmann::ordered_json(), true);
  Result<std::string> with_tools = text->render_chat(probe_messages, probe_tools, true);
  const bool present = text->chat_template("", false).ok();
  const bool tools = with_tools.ok() && with_tools->find("kiln_probe_tool") != std::string::npos;
  j["chat_template"] = {{"present", present}, {"tools", tools}};
  if (present && !plain.ok()) j["chat_template"]["error"] = plain.status().message();
  return j;
}

int run_info(const InfoFlags& f) {
  Result<ModelConfig> config = load_model_config(f.model_dir);
  if (!config.ok()) return fail(config.status());
  const ModelConfig& c = *config;
  int64_t params = 0;
  for (const auto& [name, shape] : model_tensor_layout(c).fused) params += shape.numel();
  const int64_t kv_elems_per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim;

  nlohmann::ordered_json j;
  j["path"] = fs::absolute(f.model_dir).lexically_normal().string();
  j["architecture"] = c.architecture_class;
  j["family"] = architecture_name(c.architecture);
  j["parameters"] = params;
  j["shape"] = {{"layers", c.num_hidden_layers},           {"hidden_size", c.hidden_size},
                {"intermediate_size", c.intermediate_size}, {"attention_heads", c.num_attention_heads},
                {"key_value_heads", c.num_key_value_heads}, {"head_dim", c.head_dim},
                {"vocab_size", c.vocab_size},               {"tie_word_embeddings", c.tie_word_embeddings},
                {"attention_bias", c.attention_bias},       {"qk_norm", c.qk_norm},
                {"rms_norm_eps", f32_json(c.rms_norm_eps)}};
  j["context"] = {{"max_position_embeddings", c.max_position_embeddings},
                  {"context_length", c.context_length()},
                  {"sliding_window", c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nlohmann::ordered_json(nullptr)}};
  j["rope"] = {{"type", c.rope.type}, {"theta", c.rope.theta}, {"factor", f32_json(c.rope.factor)}};
  if (c.rope.type == "llama3")
    j["rope"].update({{"low_freq_factor", f32_json(c.rope.low_freq_factor)}, {"high_freq_factor", f32_json(c.rope.high_freq_factor)},
                      {"original_max_position_embeddings", c.rope.original_max_position_embeddings}});
  if (c.rope.type == "yarn")
    j["rope"].update({{"original_max_position_embeddings", c.rope.original_max_position_embeddings},
                      {"attention_factor", f32_json(c.rope.attention_factor)}, {"beta_fast", c.rope.beta_fast},
                      {"beta_slow", c.rope.beta_slow}, {"truncate", c.rope.truncate}});
  j["config_dtype"] = dtype_name(c.dtype);
  j["checkpoint"] = checkpoint_info(c, f.model_dir);
  j["text"] = text_info(f.model_dir);
  // The sampling the model's generation_config.json recommends (what generate, chat and serve use
  // for fields a request leaves out; infer/sampling_defaults.h).
  if (Result<SamplingDefaults> d = load_sampling_defaults(f.model_dir); !d.ok()) {
    j["sampling_defaults"] = {{"error", d.status().message()}};
  } else {
    nlohmann::ordered_json s = nlohmann::ordered_json::object();
    if (d->temperature) s["temperature"] = f32_json(*d->temperature);
    if (d->top_k) s["top_k"] = *d->top_k;
    if (d->top_p) s["top_p"] = f32_json(*d->top_p);
    if (d->min_p) s["min_p"] = f32_json(*d->min_p);
    if (d->repetition_penalty) s["repetition_penalty"] = f32_json(*d->repetition_penalty);
    if (d->max_tokens) s["max_new_tokens"] = *d->max_tokens;
    j["sampling_defaults"] = s;
  }
  // What kiln needs: the CPU computes in f32, CUDA in bf16. Training keeps f32 master weights,
  // gradients and two AdamW moments (and on CUDA the bf16 copy the kernels read); activations come
  // on top and depend on the batch.
  auto device = [&](int64_t bytes_per_value, int64_t train_bytes_per_param) {
    const int64_t kv_token = kv_elems_per_token * bytes_per_value;
    return nlohmann::ordered_json{{"weights_bytes", params * bytes_per_value},
                                  {"kv_bytes_per_token", kv_token},
                                  {"kv_bytes_full_context", kv_token * c.context_length()},
                                  {"adamw_training_bytes_before_activations", params * train_bytes_per_param}};
  };
  j["memory"] = {{"cpu", device(4, 16)}, {"cuda", device(2, 18)}};

  if (f.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s  (%s, %s)\n", j["path"].get<std::string>().c_str(), c.architecture_class.c_str(),
              architecture_name(c.architecture));
  std::printf("parameters     %s (%" PRId64 ")\n", human_count(static_cast<double>(params)).c_str(), params);
  std::printf("layers         %" PRId64 " x (hidden %" PRId64 ", MLP %" PRId64 ", %" PRId64 " heads / %" PRId64
              " KV heads of %" PRId64 ")%s%s\n",
              c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
              c.head_dim, c.qk_norm ? ", q/k norm" : "", c.attention_bias ? ", q/k/v bias" : "");
  std::printf("vocabulary     %" PRId64 "%s\n", c.vocab_size, c.tie_word_embeddings ? " (embeddings tied)" : "");
  std::printf("context        %" PRId64 " tokens%s%s\n", c.context_length(),
              c.context_length() > c.max_position_embeddings
                  ? (" (YaRN: " + std::to_string(c.rope.original_max_position_embeddings) + " x factor)").c_str()
                  : "",
              c.sliding_window > 0 ? (", sliding window " + std::to_string(c.sliding_window)).c_str() : "");
  std::printf("rope           %s, theta %g%s\n", c.rope.type.c_str(), c.rope.theta,
              c.rope.type == "default" ? "" : (", factor " + std::to_string(c.rope.factor)).c_str());
  const nlohmann::ordered_json& ck = j["checkpoint"];
  std::string dtypes;
  if (ck.contains("dtypes"))
    for (const auto& [name, v] : ck["dtypes"].items())
      dtypes += (dtypes.empty() ? "" : ", ") + name + " (" + std::to_string(v["tensors"].get<int64_t>()) + ")";
  std::printf("checkpoint     %s%s%s\n", dtypes.empty() ? "none" : dtypes.c_str(),
              ck.contains("bytes") ? (", " + human_bytes(ck["bytes"].get<double>())).c_str() : "",
              ck.value("matches_config", false) ? "" : "; does not load: see --json's checkpoint.error");
  if (j["sampling_defaults"].contains("error")) {
    std::printf("sampling       %s\n", j["sampling_defaults"]["error"].get<std::string>().c_str());
  } else if (!j["sampling_defaults"].empty()) {
    std::string s;
    for (const auto& [key, v] : j["sampling_defaults"].items()) s += (s.empty() ? "" : ", ") + key + " " + v.dump();
    std::printf("sampling       %s (generation_config.json)\n", s.c_str());
  }
  const nlohmann::ordered_json& tx = j["text"];
  if (tx.contains("vocab_size")) {
    std::string special;
    for (const auto& [key, v] : tx["special_tokens"].items())
      if (!v.is_null()) special += (special.empty() ? "" : ", ") + key + " " + v.get<std::string>();
    std::printf("tokenizer      %d tokens; %s\n", tx["vocab_size"].get<int>(), special.empty() ? "no special tokens named" : special.c_str());
    std::printf("chat template  %s\n", !tx["chat_template"]["present"].get<bool>()
                                            ? "none"
                                            : tx["chat_template"]["tools"].get<bool>() ? "yes, with tools" : "yes, without tools");
  } else {
    std::printf("tokenizer      %s\n", tx.contains("error") ? tx["error"].get<std::string>().c_str() : "none (ids only)");
  }
  for (const char* dev : {"cpu", "cuda"}) {
    const nlohmann::ordered_json& m = j["memory"][dev];
    std::printf("memory (%-4s)  weights %s, KV %s per token (%s at full context), AdamW training %s + activations\n", dev,
                human_bytes(m["weights_bytes"].get<double>()).c_str(), human_bytes(m["kv_bytes_per_token"].get<double>()).c_str(),
                human_bytes(m["kv_bytes_full_context"].get<double>()).c_str(),
                human_bytes(m["adamw_training_bytes_before_activations"].get<double>()).c_str());
  }
  return 0;
}

}  // namespace

Runner add_info(CLI::App& app) {
  auto f = std::make_shared<InfoFlags>();
  CLI::App* i = app.add_subcommand("info", "what a model folder holds: architecture, parameters, dtypes, context, "
                                           "tokenizer, chat template and the memory it needs");
  i->add_option("--model", f->model_dir, "Hugging Face model folder")->required();
  i->add_flag("--json", f->json, "print JSON instead of text");
  return [f] { return run_info(*f); };
}

}  // namespace kiln::cli
