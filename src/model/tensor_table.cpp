#include "model/tensor_table.h"

#include <map>

#include "kernels/ops.h"
#include "model/safetensors.h"
#include "model/weights.h"

namespace kiln {

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

Tensor ModelWeights::get(const std::string& fused_name) const {
  auto it = views_.find(fused_name);
  KILN_ASSERT(it != views_.end() && "unknown model tensor");
  return it->second;
}

Status ModelWeights::check(const ModelTensorLayout& layout, DType dtype, Device device) const {
  for (const auto& [name, shape] : layout.fused) {
    if (!has(name)) return invalid_argument("model weights: tensor " + name + " is missing");
    const Tensor t = get(name);
    if (!(t.shape == shape) || t.dtype != dtype || !(t.device == device) || t.data == nullptr)
      return invalid_argument("model weights: tensor " + name + " has the wrong shape, dtype or device");
  }
  return Status::Ok();
}

void randomize_weights(Backend& be, const ModelTensorLayout& layout, const ModelWeights& w, uint64_t seed) {
  uint64_t index = 0;
  for (const auto& [name, shape] : layout.fused) {
    ++index;
    const Tensor t = w.get(name);
    if (name.find("norm") != std::string::npos)
      ops::fill_constant(be, t, 1.0f);
    else if (name.find("bias") != std::string::npos)
      ops::fill_constant(be, t, 0.0f);
    else
      ops::fill_normal(be, t, 0.02f, seed * 1000003ull + index);
  }
}

Status check_checkpoint(const ModelTensorLayout& layout, const std::string& model_dir) {
  KILN_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::open(model_dir));
  std::map<std::string, Shape> fused(layout.fused.begin(), layout.fused.end());
  for (const HfTensor& t : layout.hf) {
    Shape shape = fused.at(t.fused);
    shape.dims[0] = t.row_end - t.row_begin;
    KILN_RETURN_IF_ERROR(check_tensor(ckpt, t.name, shape));
  }
  return Status::Ok();
}

Status load_weights(Backend& be, const ModelTensorLayout& layout, const ModelWeights& w, const std::string& model_dir) {
  KILN_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::open(model_dir));
  for (const HfTensor& t : layout.hf) KILN_RETURN_IF_ERROR(load_tensor_into(be, ckpt, t.name, w.hf_view(t)));
  return Status::Ok();
}

Result<DeviceRope> make_device_rope(Backend& be, const ModelConfig& config) {
  const int64_t D = config.head_dim;
  RopeTables rope = compute_rope_inv_freq(config.rope, static_cast<int>(D));
  TensorBuffer host = host_empty(Shape{D / 2}, DType::f32);
  for (int64_t i = 0; i < D / 2; ++i) host.ptr<float>()[i] = rope.inv_freq[i];
  DeviceRope out;
  KILN_ASSIGN_OR_RETURN(out.inv_freq, to_device(be, host));
  out.attention_scaling = rope.attention_scaling;
  return out;
}

}  // namespace kiln
