// Transformer: a step of one request's one token on the single decode-step kernel
// (ops::decode_step_kernel_forward), where the model and the backend take it. An experiment beside
// the layered forward (transformer.cpp), which is its reference: on only with KILN_DECODE_STEP_KERNEL=1.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "model/transformer.h"

namespace kiln {

bool Transformer::decode_step_kernel_wanted() const {
  const char* env = std::getenv("KILN_DECODE_STEP_KERNEL");
  if (env == nullptr || std::strcmp(env, "1") != 0) return false;
  const ModelConfig& c = config_;
  for (const LayerWeights& L : layers_)
    if (L.qkv_bias.data || L.o_bias.data || L.gate_up_bias.data || L.down_bias.data || L.q_norm.data || L.k_norm.data)
      return false;
  return ops::decode_step_kernel_supported(backend_, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                           c.head_dim, c.intermediate_size, c.num_hidden_layers, dtype_);
}

bool Transformer::uses_decode_step_kernel(const ForwardBatch& batch) const {
  return decode_step_kernel_ && batch.ids.numel() == 1 && batch.logit_rows.numel() == 1 && batch.bounds.batch == 1 &&
         batch.bounds.max_q_len == 1 && batch.kv.page_size > 0;
}

Tensor Transformer::forward_decode_step(const ForwardBatch& batch, KVCache& cache, ForwardWorkspace& ws) const {
  const ModelConfig& c = config_;
  KILN_ASSERT(ws.decode_step_sync.allocated());
  std::vector<ops::DecodeStepLayer> layers(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& L = layers_[i];
    layers[i] = {L.input_norm, L.qkv_proj,    L.o_proj,           L.post_norm,
                 L.gate_up_proj, L.down_proj, cache.k[i].view(), cache.v[i].view()};
  }
  const int64_t H = c.hidden_size, HqD = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
  ops::DecodeStepArgs a;
  a.layers = layers.data();
  a.num_layers = c.num_hidden_layers;
  a.embed = embed_tokens_, a.final_norm = final_norm_, a.head = lm_head_;
  a.ids = batch.ids, a.positions = batch.positions, a.slots = batch.slots, a.kv = batch.kv;
  a.max_kv_len = batch.bounds.max_kv_len;
  a.inv_freq = rope_.inv_freq.view(), a.rope_scaling = rope_.attention_scaling;
  a.eps = static_cast<float>(c.rms_norm_eps);
  a.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.x = ws.residual.view().rows(0, 1).view({H});
  a.q = ws.q.view().rows(0, 1).view({HqD});
  a.attn = ws.attn.view().rows(0, 1).view({HqD});
  a.act = ws.act.view().rows(0, 1).view({c.intermediate_size});
  Tensor logits = ws.logits.view().rows(0, 1);
  a.logits = logits.view({c.vocab_size});
  if (batch.greedy_tokens.data) a.token = batch.greedy_tokens;
  a.sync = ws.decode_step_sync.view();
  if (ws.decode_step_trace.allocated()) a.trace = ws.decode_step_trace.view();
  ops::decode_step_kernel_forward(backend_, a);
  return logits;
}

}  // namespace kiln
