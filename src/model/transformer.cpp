#include "model/transformer.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "model/safetensors.h"
#include "model/weights.h"

namespace kiln {
namespace {

std::string layer_prefix(int i) { return "model.layers." + std::to_string(i) + "."; }

}  // namespace

Transformer::Transformer(Backend& backend, ModelConfig config)
    : backend_(backend), config_(std::move(config)), dtype_(backend.device().is_cpu() ? DType::f32 : DType::bf16) {}

Status Transformer::allocate_weights() {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  auto alloc = [&](TensorBuffer& dst, Shape s) -> Status {
    KILN_ASSIGN_OR_RETURN(dst, empty(backend_, s, dtype_));
    parameter_count_ += s.numel();
    return Status::Ok();
  };
  KILN_RETURN_IF_ERROR(alloc(embed_tokens_, {V, H}));
  KILN_RETURN_IF_ERROR(alloc(final_norm_, {H}));
  if (!c.tie_word_embeddings) KILN_RETURN_IF_ERROR(alloc(lm_head_, {V, H}));
  layers_.resize(c.num_hidden_layers);
  for (LayerWeights& L : layers_) {
    KILN_RETURN_IF_ERROR(alloc(L.input_norm, {H}));
    KILN_RETURN_IF_ERROR(alloc(L.qkv_proj, {(Hq + 2 * Hkv) * D, H}));
    if (c.attention_bias) KILN_RETURN_IF_ERROR(alloc(L.qkv_bias, {(Hq + 2 * Hkv) * D}));
    if (c.o_proj_bias) KILN_RETURN_IF_ERROR(alloc(L.o_bias, {H}));
    if (c.qk_norm) {
      KILN_RETURN_IF_ERROR(alloc(L.q_norm, {D}));
      KILN_RETURN_IF_ERROR(alloc(L.k_norm, {D}));
    }
    KILN_RETURN_IF_ERROR(alloc(L.o_proj, {H, Hq * D}));
    KILN_RETURN_IF_ERROR(alloc(L.post_norm, {H}));
    KILN_RETURN_IF_ERROR(alloc(L.gate_up_proj, {2 * I, H}));
    if (c.mlp_bias) {
      KILN_RETURN_IF_ERROR(alloc(L.gate_up_bias, {2 * I}));
      KILN_RETURN_IF_ERROR(alloc(L.down_bias, {H}));
    }
    KILN_RETURN_IF_ERROR(alloc(L.down_proj, {H, I}));
  }
  RopeTables rope = compute_rope_inv_freq(c.rope, static_cast<int>(D));
  TensorBuffer host = host_empty(Shape{D / 2}, DType::f32);
  for (int64_t i = 0; i < D / 2; ++i) host.ptr<float>()[i] = rope.inv_freq[i];
  KILN_ASSIGN_OR_RETURN(inv_freq_, to_device(backend_, host));
  rope_attention_scaling_ = rope.attention_scaling;
  return Status::Ok();
}

// HF names of every weight with the tensor it fills. The fused projections appear as their parts:
// qkv_proj as q_proj, k_proj, v_proj rows; gate_up_proj as gate_proj then up_proj rows; likewise
// their biases.
std::vector<std::pair<std::string, Tensor>> Transformer::named_weights() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back("model.embed_tokens.weight", embed_tokens_);
  for (int i = 0; i < static_cast<int>(layers_.size()); ++i) {
    const LayerWeights& L = layers_[i];
    const std::string p = layer_prefix(i);
    const int64_t I = config_.intermediate_size;
    out.emplace_back(p + "input_layernorm.weight", L.input_norm);
    const int64_t q_rows = config_.num_attention_heads * config_.head_dim;
    const int64_t kv_rows = config_.num_key_value_heads * config_.head_dim;
    const Tensor qkv = L.qkv_proj.view();
    out.emplace_back(p + "self_attn.q_proj.weight", qkv.rows(0, q_rows));
    out.emplace_back(p + "self_attn.k_proj.weight", qkv.rows(q_rows, q_rows + kv_rows));
    out.emplace_back(p + "self_attn.v_proj.weight", qkv.rows(q_rows + kv_rows, q_rows + 2 * kv_rows));
    if (L.qkv_bias.allocated()) {
      const Tensor b = L.qkv_bias.view();
      out.emplace_back(p + "self_attn.q_proj.bias", b.rows(0, q_rows));
      out.emplace_back(p + "self_attn.k_proj.bias", b.rows(q_rows, q_rows + kv_rows));
      out.emplace_back(p + "self_attn.v_proj.bias", b.rows(q_rows + kv_rows, q_rows + 2 * kv_rows));
    }
    if (L.q_norm.allocated()) {
      out.emplace_back(p + "self_attn.q_norm.weight", L.q_norm);
      out.emplace_back(p + "self_attn.k_norm.weight", L.k_norm);
    }
    out.emplace_back(p + "self_attn.o_proj.weight", L.o_proj);
    if (L.o_bias.allocated()) out.emplace_back(p + "self_attn.o_proj.bias", L.o_bias);
    out.emplace_back(p + "post_attention_layernorm.weight", L.post_norm);
    out.emplace_back(p + "mlp.gate_proj.weight", L.gate_up_proj.view().rows(0, I));
    out.emplace_back(p + "mlp.up_proj.weight", L.gate_up_proj.view().rows(I, 2 * I));
    if (L.gate_up_bias.allocated()) {
      out.emplace_back(p + "mlp.gate_proj.bias", L.gate_up_bias.view().rows(0, I));
      out.emplace_back(p + "mlp.up_proj.bias", L.gate_up_bias.view().rows(I, 2 * I));
    }
    out.emplace_back(p + "mlp.down_proj.weight", L.down_proj);
    if (L.down_bias.allocated()) out.emplace_back(p + "mlp.down_proj.bias", L.down_bias);
  }
  out.emplace_back("model.norm.weight", final_norm_);
  if (lm_head_.allocated()) out.emplace_back("lm_head.weight", lm_head_);
  return out;
}

Status Transformer::load_weights(const std::string& model_dir) {
  KILN_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::open(model_dir));
  for (auto& [name, dst] : named_weights()) KILN_RETURN_IF_ERROR(load_tensor_into(backend_, ckpt, name, dst));
  return Status::Ok();
}

void Transformer::randomize_weights(uint64_t seed) {
  uint64_t index = 0;
  for (auto& [name, t] : named_weights()) {
    ++index;
    bool is_norm = name.find("norm") != std::string::npos;
    bool is_bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (is_norm)
      ops::fill_constant(backend_, t, 1.0f);
    else if (is_bias)
      ops::fill_constant(backend_, t, 0.0f);
    else
      ops::fill_normal(backend_, t, 0.02f, seed * 1000003ull + index);
  }
}

Result<std::unique_ptr<Transformer>> Transformer::load(Backend& backend, const std::string& model_dir,
                                                       const ModelLoadOptions& options) {
  KILN_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  if (config.sliding_window > 0)
    std::fprintf(stderr,
                 "kiln: warning: %s asks for sliding-window attention (%lld tokens), which kiln does not implement "
                 "yet: contexts longer than the window attend to every earlier token\n",
                 config.source.c_str(), static_cast<long long>(config.sliding_window));
  if (options.random_weights) return random(backend, config, options.seed);
  std::unique_ptr<Transformer> m(new Transformer(backend, std::move(config)));
  KILN_RETURN_IF_ERROR(m->allocate_weights());
  KILN_RETURN_IF_ERROR(m->load_weights(model_dir));
  KILN_RETURN_IF_ERROR(backend.synchronize());
  return m;
}

Result<std::unique_ptr<Transformer>> Transformer::random(Backend& backend, const ModelConfig& config, uint64_t seed) {
  std::unique_ptr<Transformer> m(new Transformer(backend, config));
  KILN_RETURN_IF_ERROR(m->allocate_weights());
  m->randomize_weights(seed);
  KILN_RETURN_IF_ERROR(backend.synchronize());
  return m;
}

Result<KVCache> Transformer::make_kv_cache(int32_t slots) const {
  KVCache cache;
  cache.slots = slots;
  Shape s{slots, config_.num_key_value_heads, config_.head_dim};
  for (int i = 0; i < config_.num_hidden_layers; ++i) {
    KILN_ASSIGN_OR_RETURN(TensorBuffer k, empty(backend_, s, dtype_));
    KILN_ASSIGN_OR_RETURN(TensorBuffer v, empty(backend_, s, dtype_));
    cache.k.push_back(std::move(k));
    cache.v.push_back(std::move(v));
  }
  return cache;
}

Result<ForwardWorkspace> Transformer::make_workspace(int64_t max_tokens, int64_t max_logit_rows) const {
  const ModelConfig& c = config_;
  const int64_t T = max_tokens, R = max_logit_rows, H = c.hidden_size, D = c.head_dim;
  ForwardWorkspace ws;
  ws.max_tokens = T;
  ws.max_logit_rows = R;
  KILN_ASSIGN_OR_RETURN(ws.hidden, empty(backend_, {T, H}, dtype_));
  // The residual stream stays f32 on every device: it accumulates every sublayer's output, and
  // rounding it to bf16 after each add costs more accuracy than its bandwidth is worth.
  KILN_ASSIGN_OR_RETURN(ws.residual, empty(backend_, {T, H}, DType::f32));
  KILN_ASSIGN_OR_RETURN(ws.normed, empty(backend_, {T, H}, dtype_));
  KILN_ASSIGN_OR_RETURN(ws.qkv, empty(backend_, {T, (c.num_attention_heads + 2 * c.num_key_value_heads) * D}, dtype_));
  KILN_ASSIGN_OR_RETURN(ws.q, empty(backend_, {T, c.num_attention_heads, D}, dtype_));
  KILN_ASSIGN_OR_RETURN(ws.attn, empty(backend_, {T, c.num_attention_heads * D}, dtype_));
  KILN_ASSIGN_OR_RETURN(ws.proj, empty(backend_, {T, H}, dtype_));
  KILN_ASSIGN_OR_RETURN(ws.gate_up, empty(backend_, {T, 2 * c.intermediate_size}, dtype_));
  KILN_ASSIGN_OR_RETURN(ws.act, empty(backend_, {T, c.intermediate_size}, dtype_));
  KILN_ASSIGN_OR_RETURN(ws.gathered, empty(backend_, {R, H}, dtype_));
  KILN_ASSIGN_OR_RETURN(ws.logits, empty(backend_, {R, c.vocab_size}, DType::f32));
  KILN_ASSIGN_OR_RETURN(ws.last_q, empty(backend_, {R, c.num_attention_heads * D}, dtype_));
  KILN_ASSIGN_OR_RETURN(ws.last_residual, empty(backend_, {R, H}, DType::f32));
  return ws;
}

Tensor Transformer::forward(const ForwardBatch& batch, KVCache& cache, ForwardWorkspace& ws) const {
  const ModelConfig& c = config_;
  const int64_t T = batch.ids.numel(), R = batch.logit_rows.numel();
  const int64_t D = c.head_dim, Hq = c.num_attention_heads;
  KILN_ASSERT(T > 0 && T <= ws.max_tokens && R > 0 && R <= ws.max_logit_rows);
  KILN_ASSERT(static_cast<int>(cache.k.size()) == c.num_hidden_layers);
  Backend& be = backend_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  Tensor residual = ws.residual.view().rows(0, T);  // the residual stream x
  Tensor hidden = ws.hidden.view().rows(0, T);      // a sublayer's output, added into x
  Tensor normed = ws.normed.view().rows(0, T);
  Tensor qkv = ws.qkv.view().rows(0, T), q = ws.q.view().rows(0, T);
  Tensor attn = ws.attn.view().rows(0, T), proj = ws.proj.view().rows(0, T);
  Tensor gate_up = ws.gate_up.view().rows(0, T), act = ws.act.view().rows(0, T);

  const bool trim_last_layer = batch.last_rows_indptr.data != nullptr;
  int64_t rows = T;  // rows the current layer's attention output and MLP run on
  Tensor q_indptr = batch.q_indptr;
  ops::AttentionBounds attention_bounds = batch.bounds;

  ops::embedding_forward(be, residual, embed_tokens_, batch.ids);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& L = layers_[i];
    if (i == 0)
      ops::rmsnorm_forward(be, normed, residual, L.input_norm, eps);
    else
      ops::add_rmsnorm_forward(be, normed, residual, hidden, L.input_norm, eps);
    ops::linear_forward(be, qkv, normed, L.qkv_proj, L.qkv_bias);
    ops::qkv_rope_cache_write(be, q, cache.k[i], cache.v[i], qkv, batch.positions, batch.slots, inv_freq_,
                              rope_attention_scaling_, L.q_norm, L.k_norm, eps);
    if (trim_last_layer && i == c.num_hidden_layers - 1) {
      // Only the logit rows go on: gather their queries and residuals (row gathers), attend as the
      // last query of each request, and run the rest of the layer on R rows.
      Tensor last_q = ws.last_q.view().rows(0, R);
      ops::embedding_forward(be, last_q, q.view({T, Hq * D}), batch.logit_rows);
      ops::embedding_forward(be, ws.last_residual.view().rows(0, R), residual, batch.logit_rows);
      residual = ws.last_residual.view().rows(0, R);
      q = last_q.view({R, Hq, D});
      q_indptr = batch.last_rows_indptr;
      attention_bounds.max_q_len = 1;
      rows = R;
      attn = attn.rows(0, R), proj = proj.rows(0, R), normed = normed.rows(0, R);
      gate_up = gate_up.rows(0, R), act = act.rows(0, R), hidden = hidden.rows(0, R);
    }
    ops::attention_forward(be, attn.view({rows, Hq, D}), q, cache.k[i], cache.v[i], q_indptr, batch.kv,
                           attention_bounds, scale);
    ops::linear_forward(be, proj, attn, L.o_proj, L.o_bias);
    ops::add_rmsnorm_forward(be, normed, residual, proj, L.post_norm, eps);
    ops::linear_forward(be, gate_up, normed, L.gate_up_proj, L.gate_up_bias);
    ops::swiglu_forward(be, act, gate_up);
    ops::linear_forward(be, hidden, act, L.down_proj, L.down_bias);
  }
  ops::add_rmsnorm_forward(be, normed, residual, hidden, final_norm_, eps);
  Tensor final_rows = normed;
  if (!trim_last_layer) {  // gather the logit rows
    final_rows = ws.gathered.view().rows(0, R);
    ops::embedding_forward(be, final_rows, normed, batch.logit_rows);
  }
  Tensor logits = ws.logits.view().rows(0, R);
  ops::linear_forward(be, logits, final_rows, lm_head_.allocated() ? lm_head_.view() : embed_tokens_.view());
  return logits;
}

}  // namespace kiln
