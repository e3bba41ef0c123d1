#include "model/transformer.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/safetensors.h"
#include "model/weights.h"

namespace kiln {
Transformer::Transformer(Backend& backend, ModelConfig config)
    : backend_(backend),
      config_(std::move(config)),
      dtype_(backend.device().is_cpu() ? DType::f32 : DType::bf16),
      layout_(model_tensor_layout(config_)) {
  for (const auto& [name, shape] : layout_.fused) parameter_count_ += shape.numel();
}

Status Transformer::allocate_weights() {
  for (const auto& [name, shape] : layout_.fused) {
    KILN_ASSIGN_OR_RETURN(TensorBuffer t, empty(backend_, shape, dtype_));
    weights_.set(name, t);
    owned_.push_back(std::move(t));
  }
  return Status::Ok();
}

Status Transformer::bind_weights() {
  KILN_RETURN_IF_ERROR(weights_.check(layout_, dtype_, backend_.device()));
  const ModelWeights& w = weights_;
  embed_tokens_ = w.get("embed_tokens");
  final_norm_ = w.get("final_norm");
  lm_head_ = config_.tie_word_embeddings ? embed_tokens_ : w.get("lm_head");
  layers_.resize(config_.num_hidden_layers);
  for (int i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string k = "layers." + std::to_string(i) + ".";
    LayerWeights& L = layers_[i];
    L.input_norm = w.get(k + "input_norm");
    L.qkv_proj = w.get(k + "qkv_proj");
    L.qkv_bias = w.get_or_empty(k + "qkv_bias");
    L.q_norm = w.get_or_empty(k + "q_norm");
    L.k_norm = w.get_or_empty(k + "k_norm");
    L.o_proj = w.get(k + "o_proj");
    L.o_bias = w.get_or_empty(k + "o_bias");
    L.post_norm = w.get(k + "post_norm");
    L.gate_up_proj = w.get(k + "gate_up_proj");
    L.gate_up_bias = w.get_or_empty(k + "gate_up_bias");
    L.down_proj = w.get(k + "down_proj");
    L.down_bias = w.get_or_empty(k + "down_bias");
  }
  KILN_ASSIGN_OR_RETURN(rope_, make_device_rope(backend_, config_));
  decode_step_kernel_ = decode_step_kernel_wanted();
  return Status::Ok();
}

Result<std::unique_ptr<Transformer>> Transformer::load(Backend& backend, const std::string& model_dir,
                                                       const ModelLoadOptions& options) {
  KILN_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
  if (options.random_weights) return random(backend, config, options.seed);
  std::unique_ptr<Transformer> m(new Transformer(backend, std::move(config)));
  KILN_RETURN_IF_ERROR(check_checkpoint(m->layout_, model_dir));  // before any allocation
  KILN_RETURN_IF_ERROR(m->allocate_weights());
  KILN_RETURN_IF_ERROR(load_weights(backend, m->layout_, m->weights_, model_dir));
  KILN_RETURN_IF_ERROR(m->bind_weights());
  KILN_RETURN_IF_ERROR(backend.synchronize());
  return m;
}

Result<std::unique_ptr<Transformer>> Transformer::random(Backend& backend, const ModelConfig& config, uint64_t seed) {
  std::unique_ptr<Transformer> m(new Transformer(backend, config));
  // Without a checkpoint there are no tensors to check config.json's sizes against: its parameters
  // are checked against the memory there is, before anything is allocated.
  int64_t bytes = 0;
  for (const auto& [name, shape] : m->layout_.fused) bytes += shape.numel() * dtype_size(m->dtype_);
  int64_t available = 0;
  if (backend.device().is_cpu()) {
    available = host_memory_limit();
  } else if (Result<std::pair<int64_t, int64_t>> mem = backend.memory_info(); mem.ok()) {
    available = mem->first;
  }
  if (available > 0 && bytes > available)
    return out_of_memory("--random-weights: the model config.json describes needs " + std::to_string(bytes) +
                         " bytes of weights, and " + backend.device().str() + " has " + std::to_string(available) +
                         " bytes available; use a smaller config (num_hidden_layers, hidden_size, intermediate_size, "
                         "vocab_size)");
  KILN_RETURN_IF_ERROR(m->allocate_weights());
  randomize_weights(backend, m->layout_, m->weights_, seed);
  KILN_RETURN_IF_ERROR(m->bind_weights());
  KILN_RETURN_IF_ERROR(backend.synchronize());
  return m;
}

Result<std::unique_ptr<Transformer>> Transformer::borrow(Backend& backend, const ModelConfig& config,
                                                         const ModelWeights& weights) {
  std::unique_ptr<Transformer> m(new Transformer(backend, config));
  m->weights_ = weights;
  KILN_RETURN_IF_ERROR(m->bind_weights());
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
  const int64_t split_rows = std::min<int64_t>(T, ops::kFusedLinearMaxRows);
  if (ops::qkv_rope_reads_table(backend_, T)) {
    KILN_ASSIGN_OR_RETURN(ws.rope_table, empty(backend_, {T, D / 2, 2}, DType::f32));
  }
  if (ops::linear_k_split_parts(backend_, split_rows, H, c.intermediate_size, dtype_) > 0) {
    KILN_ASSIGN_OR_RETURN(ws.down_partials, empty(backend_, {ops::kMaxKSplitParts * split_rows * H}, DType::f32));
  }
  KILN_ASSIGN_OR_RETURN(ws.argmax_scratch, empty(backend_, {ops::kArgmaxScratchWords}, DType::i32));
  backend_.zero(ws.argmax_scratch.view());
  if (decode_step_kernel_) {
    KILN_ASSIGN_OR_RETURN(ws.decode_step_sync,
                          empty(backend_, {ops::kDecodeStepSyncWords(c.num_hidden_layers)}, DType::i32));
    backend_.zero(ws.decode_step_sync.view());
    const char* trace = std::getenv("KILN_DECODE_STEP_TRACE");
    if (trace && std::string(trace) == "1") {
      const int64_t words = ops::kDecodeStepTraceBlocks * (6 * c.num_hidden_layers + 1) * 2;
      KILN_ASSIGN_OR_RETURN(ws.decode_step_trace, empty(backend_, {words}, DType::i64));
    }
  }
  return ws;
}

bool Transformer::uses_fused_layers(int64_t tokens) const {
  const ModelConfig& c = config_;
  Backend& be = backend_;
  const int64_t H = c.hidden_size, q_width = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
  // The fused CPU twins order their arithmetic otherwise than the separate ops: a batch-invariant
  // backend takes the separate ops at every batch size.
  if (be.batch_invariant()) return false;
  return ops::fused_linear_valid(be, ops::FusedLinear::residual, tokens, q_width, dtype_) &&
         ops::fused_linear_valid(be, ops::FusedLinear::swiglu, tokens, H, dtype_) &&
         ops::fused_linear_valid(be, ops::FusedLinear::residual, tokens, c.intermediate_size, dtype_);
}

int32_t Transformer::down_split_parts(int64_t T) const {
  const ModelConfig& c = config_;
  const LayerWeights& L0 = layers_[0];
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  // Where cuBLASLt runs the down projection (steps of 17 to 128 rows), it is split along K into f32
  // products that the next norm adds into the residual (the split-K reduction, the residual add and
  // the norm in one kernel); the next layer's q/k/v projection then reads the normed rows.
  if (!uses_fused_layers(T) || L0.down_bias.data ||
      ops::fused_linear_preferred(backend_, ops::FusedLinear::residual, T, H, I, dtype_))
    return 0;
  const bool qkv_reads_normed =  // rather than folding the norm into its own kernel
      !ops::fused_linear_preferred(backend_, ops::FusedLinear::norm, T, L0.qkv_proj.size(0), H, dtype_) &&
      (L0.q_norm.data || L0.k_norm.data ||
       !ops::norm_linear_qkv_rope_preferred(backend_, T, L0.qkv_proj.size(0), L0.qkv_proj.size(1), c.head_dim,
                                            dtype_));
  return qkv_reads_normed ? ops::linear_k_split_parts(backend_, T, H, I, dtype_) : 0;
}

bool Transformer::head_takes_greedy(int64_t T, int64_t R) const {
  return uses_fused_layers(T) && down_split_parts(T) == 0 &&
         ops::norm_linear_argmax_preferred(backend_, R, lm_head_.size(0), config_.hidden_size, dtype_);
}

Tensor Transformer::forward(const ForwardBatch& batch, KVCache& cache, ForwardWorkspace& ws) const {
  const ModelConfig& c = config_;
  const int64_t T = batch.ids.numel(), R = batch.logit_rows.numel();
  const int64_t D = c.head_dim, Hq = c.num_attention_heads;
  KILN_ASSERT(T > 0 && T <= ws.max_tokens && R > 0 && R <= ws.max_logit_rows);
  KILN_ASSERT(!batch.logits_of_every_row || (R == T && !batch.last_rows_indptr.data));
  KILN_ASSERT(static_cast<int>(cache.k.size()) == c.num_hidden_layers);
  if (uses_decode_step_kernel(batch)) return forward_decode_step(batch, cache, ws);
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
  // The head's rows: the trimmed final layer's, every row in place, or gathered at the end.
  const bool gather_logit_rows = !trim_last_layer && !batch.logits_of_every_row;
  int64_t rows = T;  // rows the current layer's attention output and MLP run on
  Tensor q_indptr = batch.q_indptr;
  ops::AttentionBounds attention_bounds = batch.bounds;

  // Steps of a few rows (decode) run the fused small-batch layers: the norms folded into the
  // projections that read them, SwiGLU into gate/up, the residual adds into o and down, and (for
  // models without q/k norms) the rotation and the KV write into q/k/v.
  const bool fused = uses_fused_layers(T);
  // The projections of that path: each on the fused kernel where it is the faster choice
  // (ops::fused_linear_preferred), else on the separate ops with the same result. The residual
  // stream stays complete after every sublayer.
  auto preferred = [&](ops::FusedLinear kind, Tensor x, Tensor w, bool swiglu) {
    return ops::fused_linear_preferred(be, kind, x.size(0), swiglu ? w.size(0) / 2 : w.size(0), x.size(-1), dtype_);
  };
  auto norm_project = [&](Tensor y, Tensor x, Tensor norm_w, Tensor w, Tensor bias, Tensor normed_rows) {
    if (preferred(ops::FusedLinear::norm, x, w, false)) return ops::norm_linear_forward(be, y, x, norm_w, eps, w, bias);
    ops::rmsnorm_forward(be, normed_rows, x, norm_w, eps);
    ops::linear_forward(be, y, normed_rows, w, bias);
  };
  auto norm_mlp_in = [&](Tensor act_rows, Tensor x, Tensor norm_w, Tensor w, Tensor bias, Tensor normed_rows,
                         Tensor gate_up_rows) {
    if (preferred(ops::FusedLinear::norm_swiglu, x, w, true))
      return ops::norm_linear_swiglu_forward(be, act_rows, x, norm_w, eps, w, bias);
    ops::rmsnorm_forward(be, normed_rows, x, norm_w, eps);
    if (preferred(ops::FusedLinear::swiglu, x, w, true)) return ops::linear_swiglu_forward(be, act_rows, normed_rows, w, bias);
    ops::linear_forward(be, gate_up_rows, normed_rows, w, bias);
    ops::swiglu_forward(be, act_rows, gate_up_rows);
  };
  auto project_add = [&](Tensor resid, Tensor x, Tensor w, Tensor bias) {
    if (preferred(ops::FusedLinear::residual, x, w, false)) return ops::linear_residual_forward(be, resid, x, w, bias);
    ops::gemm(be, resid, x, false, w, true, 1.0f, 1.0f);
    if (bias.data) ops::bias_add_forward(be, resid, bias);
  };

  const int64_t H = c.hidden_size;
  const int32_t down_parts = down_split_parts(T);  // the down projection split along K (fused path)
  const bool greedy = batch.greedy_tokens.data != nullptr;
  KILN_ASSERT(!greedy || (batch.greedy_tokens.numel() == R && head_takes_greedy(T, R)));
  // Whether `normed` holds this layer's input norm (the previous layer's down projection wrote it).
  bool input_normed = false;

  Tensor rope_table;  // the step's rotary pairs, once for every layer (where the backend reads them)
  if (ops::qkv_rope_reads_table(be, T)) {
    rope_table = ws.rope_table.view().rows(0, T);
    ops::rope_cos_sin_table(be, rope_table, batch.positions, rope_.inv_freq, rope_.attention_scaling);
  }

  ops::embedding_forward(be, residual, embed_tokens_, batch.ids);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& L = layers_[i];
    // Where the rotation and the KV write run: in the q/k/v projection (the fused small-batch
    // kernel, models without q/k norms), in the decode attention kernel (steps of one query per
    // request), or in their own kernel between the two.
    bool rope_in_attention = false;
    if (fused && !input_normed && !L.q_norm.data && !L.k_norm.data &&
        ops::norm_linear_qkv_rope_preferred(be, T, L.qkv_proj.size(0), L.qkv_proj.size(1), D, dtype_)) {
      // The projection writes q, k and v after the rotation itself (no q/k norms to apply).
      ops::norm_linear_qkv_rope_forward(be, q, cache.k[i], cache.v[i], qkv, residual, L.input_norm, eps, L.qkv_proj,
                                        L.qkv_bias, batch.positions, batch.slots, rope_.inv_freq,
                                        rope_.attention_scaling);
    } else {
      if (fused && input_normed) {
        ops::linear_forward(be, qkv, normed, L.qkv_proj, L.qkv_bias);
      } else if (fused) {
        norm_project(qkv, residual, L.input_norm, L.qkv_proj, L.qkv_bias, normed);
      } else {
        if (i == 0)
          ops::rmsnorm_forward(be, normed, residual, L.input_norm, eps);
        else
          ops::add_rmsnorm_forward(be, normed, residual, hidden, L.input_norm, eps);
        ops::linear_forward(be, qkv, normed, L.qkv_proj, L.qkv_bias);
      }
      rope_in_attention = fused && !trim_last_layer &&
                          ops::attention_decode_rope_preferred(be, q, cache.k[i], attention_bounds);
      if (!rope_in_attention)
        ops::qkv_rope_cache_write(be, q, cache.k[i], cache.v[i], qkv, batch.positions, batch.slots, rope_.inv_freq,
                                  rope_.attention_scaling, L.q_norm, L.k_norm, eps, rope_table);
    }
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
    if (rope_in_attention)
      ops::attention_decode_rope_forward(be, attn.view({rows, Hq, D}), q, cache.k[i], cache.v[i], qkv, batch.positions,
                                         batch.slots, rope_.inv_freq, rope_.attention_scaling, L.q_norm, L.k_norm, eps,
                                         q_indptr, batch.kv, attention_bounds, scale);
    else
      ops::attention_forward(be, attn.view({rows, Hq, D}), q, cache.k[i], cache.v[i], q_indptr, batch.kv,
                             attention_bounds, scale);
    if (fused) {
      project_add(residual, attn, L.o_proj, L.o_bias);
      norm_mlp_in(act, residual, L.post_norm, L.gate_up_proj, L.gate_up_bias, normed, gate_up);
      if (down_parts > 0) {
        Tensor partials = ws.down_partials.view().rows(0, down_parts * rows * H).view({down_parts, rows, H});
        ops::linear_k_split_forward(be, partials, act, L.down_proj);
        const Tensor next_norm = i + 1 < c.num_hidden_layers ? layers_[i + 1].input_norm : final_norm_;
        ops::add_rmsnorm_forward(be, normed, residual, partials, next_norm, eps);
        input_normed = true;
      } else {
        project_add(residual, act, L.down_proj, L.down_bias);
      }
      continue;
    }
    ops::linear_forward(be, proj, attn, L.o_proj, L.o_bias);
    ops::add_rmsnorm_forward(be, normed, residual, proj, L.post_norm, eps);
    ops::linear_forward(be, gate_up, normed, L.gate_up_proj, L.gate_up_bias);
    ops::swiglu_forward(be, act, gate_up);
    ops::linear_forward(be, hidden, act, L.down_proj, L.down_bias);
  }
  Tensor logits = ws.logits.view().rows(0, R);
  if (fused && !input_normed) {
    Tensor final_residual = residual;
    if (gather_logit_rows) {  // gather the logit rows
      final_residual = ws.last_residual.view().rows(0, R);
      ops::embedding_forward(be, final_residual, residual, batch.logit_rows);
    }
    if (greedy)
      ops::norm_linear_argmax_forward(be, logits, batch.greedy_tokens, final_residual, final_norm_, eps, lm_head_,
                                      ws.argmax_scratch.view());
    else
      norm_project(logits, final_residual, final_norm_, lm_head_, Tensor{}, ws.gathered.view().rows(0, R));
    return logits;
  }
  // The final norm's rows: written by the last down projection's kernel (fused path), else here.
  if (!fused) ops::add_rmsnorm_forward(be, normed, residual, hidden, final_norm_, eps);
  Tensor final_rows = normed;
  if (gather_logit_rows) {  // gather the logit rows
    final_rows = ws.gathered.view().rows(0, R);
    ops::embedding_forward(be, final_rows, normed, batch.logit_rows);
  }
  ops::linear_forward(be, logits, final_rows, lm_head_);
  return logits;
}

}  // namespace kiln
