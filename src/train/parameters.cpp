#include "train/parameters.h"

#include <regex>

#include "kernels/ops.h"

namespace kiln {
namespace {

constexpr int64_t kAlignElements = 128;  // 512 bytes of f32, 256 of bf16: what cuBLASLt likes best

int64_t align_up(int64_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; }

}  // namespace

ModelTensorLayout model_tensor_layout(const ModelConfig& c) {
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t q_rows = c.num_attention_heads * D, kv_rows = c.num_key_value_heads * D;
  const int64_t qkv_rows = q_rows + 2 * kv_rows;
  ModelTensorLayout out;
  auto fused = [&](const std::string& name, Shape s) { out.fused.emplace_back(name, s); };
  auto whole = [&](const std::string& hf, const std::string& kiln, int64_t rows) {
    out.hf.push_back({hf, kiln, 0, rows});
  };
  auto part = [&](const std::string& hf, const std::string& kiln, int64_t begin, int64_t end) {
    out.hf.push_back({hf, kiln, begin, end});
  };
  fused("embed_tokens", {V, H});
  whole("model.embed_tokens.weight", "embed_tokens", V);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string k = "layers." + std::to_string(i) + ".";
    const std::string p = "model.layers." + std::to_string(i) + ".";
    fused(k + "input_norm", {H});
    whole(p + "input_layernorm.weight", k + "input_norm", H);
    fused(k + "qkv_proj", {qkv_rows, H});
    part(p + "self_attn.q_proj.weight", k + "qkv_proj", 0, q_rows);
    part(p + "self_attn.k_proj.weight", k + "qkv_proj", q_rows, q_rows + kv_rows);
    part(p + "self_attn.v_proj.weight", k + "qkv_proj", q_rows + kv_rows, qkv_rows);
    if (c.attention_bias) {
      fused(k + "qkv_bias", {qkv_rows});
      part(p + "self_attn.q_proj.bias", k + "qkv_bias", 0, q_rows);
      part(p + "self_attn.k_proj.bias", k + "qkv_bias", q_rows, q_rows + kv_rows);
      part(p + "self_attn.v_proj.bias", k + "qkv_bias", q_rows + kv_rows, qkv_rows);
    }
    if (c.qk_norm) {
      fused(k + "q_norm", {D});
      whole(p + "self_attn.q_norm.weight", k + "q_norm", D);
      fused(k + "k_norm", {D});
      whole(p + "self_attn.k_norm.weight", k + "k_norm", D);
    }
    fused(k + "o_proj", {H, q_rows});
    whole(p + "self_attn.o_proj.weight", k + "o_proj", H);
    if (c.o_proj_bias) {
      fused(k + "o_bias", {H});
      whole(p + "self_attn.o_proj.bias", k + "o_bias", H);
    }
    fused(k + "post_norm", {H});
    whole(p + "post_attention_layernorm.weight", k + "post_norm", H);
    fused(k + "gate_up_proj", {2 * I, H});
    part(p + "mlp.gate_proj.weight", k + "gate_up_proj", 0, I);
    part(p + "mlp.up_proj.weight", k + "gate_up_proj", I, 2 * I);
    if (c.mlp_bias) {
      fused(k + "gate_up_bias", {2 * I});
      part(p + "mlp.gate_proj.bias", k + "gate_up_bias", 0, I);
      part(p + "mlp.up_proj.bias", k + "gate_up_bias", I, 2 * I);
    }
    fused(k + "down_proj", {H, I});
    whole(p + "mlp.down_proj.weight", k + "down_proj", H);
    if (c.mlp_bias) {
      fused(k + "down_bias", {H});
      whole(p + "mlp.down_proj.bias", k + "down_bias", H);
    }
  }
  fused("final_norm", {H});
  whole("model.norm.weight", "final_norm", H);
  if (!c.tie_word_embeddings) {
    fused("lm_head", {V, H});
    whole("lm_head.weight", "lm_head", V);
  }
  return out;
}

Result<ParameterSet> ParameterSet::create(Backend& be, const ModelConfig& config, const std::string& no_decay_regex,
                                          bool mixed_precision) {
  ParameterSet set;
  set.layout_ = model_tensor_layout(config);
  std::regex no_decay;
  try {
    if (!no_decay_regex.empty()) no_decay = std::regex(no_decay_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return invalid_argument("--no-decay: '" + no_decay_regex + "' is not a valid regular expression (" +
                                   e.what() + ")");
  }
  // Decay per fused tensor: every Hugging Face part must agree.
  std::map<std::string, std::string> first_part;  // fused -> the hf name that decided it
  for (const HfTensor& t : set.layout_.hf) {
    const bool decayed = no_decay_regex.empty() || !std::regex_search(t.name, no_decay);
    auto it = set.decayed_.find(t.fused);
    if (it == set.decayed_.end()) {
      set.decayed_[t.fused] = decayed;
      first_part[t.fused] = t.name;
    } else if (it->second != decayed) {
      return invalid_argument("--no-decay '" + no_decay_regex + "' exempts " +
                                     (decayed ? first_part[t.fused] : t.name) + " but not " +
                                     (decayed ? t.name : first_part[t.fused]) +
                                     "; kiln stores them as one tensor, so name both or neither");
    }
  }
  // Decayed tensors first, then the exempt ones.
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [name, shape] : set.layout_.fused) {
      if (set.decayed_[name] != (pass == 0)) continue;
      set.offsets_[name] = {set.size_, shape};
      set.size_ += align_up(shape.numel());
      set.count_ += shape.numel();
    }
    if (pass == 0) set.decay_end_ = set.size_;
  }
  KILN_ASSIGN_OR_RETURN(set.master_, empty(be, {set.size_}, DType::f32));
  KILN_ASSIGN_OR_RETURN(set.grads_, empty(be, {set.size_}, DType::f32));
  be.zero(set.master_);
  be.zero(set.grads_);
  if (mixed_precision) {
    KILN_ASSIGN_OR_RETURN(set.compute_, empty(be, {set.size_}, DType::bf16));
    be.zero(set.compute_);
  }
  return set;
}

Tensor ParameterSet::slice(Tensor flat, const std::string& fused_name) const {
  auto it = offsets_.find(fused_name);
  KILN_ASSERT(it != offsets_.end() && "unknown parameter");
  const auto& [offset, shape] = it->second;
  return flat.rows(offset, offset + shape.numel()).view(shape);
}

std::vector<std::string> ParameterSet::no_decay_names() const {
  std::vector<std::string> out;
  for (const HfTensor& t : layout_.hf)
    if (!decayed_.at(t.fused)) out.push_back(t.name);
  return out;
}

void ParameterSet::sync_compute(Backend& be) const {
  if (mixed_precision()) ops::cast(be, compute_.view(), master_.view());
}

}  // namespace kiln
