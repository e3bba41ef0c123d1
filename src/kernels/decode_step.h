// The whole forward of a small decode step in one persistent kernel (CUDA, Hopper): embedding, every
// layer's norms, projections, rotary embedding, KV write and attention, the final norm and the head,
// for at most kDecodeStepMaxRows token rows of one query each. It exists because such a step is
// bound by reading the weights once: as separate kernels it loses a few microseconds of ramp and
// drain at every one of ~170 launches, and the attention at short contexts is latency-bound. Here one
// block per SM streams its share of every weight matrix, in the step's order, through a ring of
// shared-memory stages (a producer warp, bulk copies completing on mbarriers) while its consumer
// warps compute; the weight stream runs ahead across the dependency barriers between stages, so the
// attention, the barriers and the epilogues overlap the next matrices' loads.
//
// Semantics: exactly Transformer::forward's on a batch of T <= 8 token rows, each the only query of
// its request (bounds.max_q_len == 1), R <= 8 logit rows: the residual stream in f32; RMSNorm as
// the fused small-batch layers do it (ops.h: r * ((x * norm_w) @ w^T), x * norm_w rounded to bf16);
// q/k norm, rope and the cache write with qkv_rope_cache_write's arithmetic; SwiGLU of the gate and
// up outputs rounded to bf16; logits f32. Deterministic: every sum has a fixed order (no float
// atomics), so a replayed graph is bit-exact.
// Thread safety: none (the backend's stream); the scratch belongs to one workspace.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "kernels/ops.h"

namespace kiln::ops {

constexpr int32_t kDecodeStepMaxRows = 8;

// Model dimensions the kernel is specialised for.
struct DecodeStepShape {
  int32_t layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
};

// Views of one layer's weights (bf16; absent optional ones empty).
struct DecodeStepLayer {
  Tensor input_norm, qkv_proj, qkv_bias, q_norm, k_norm, o_proj, o_bias, post_norm, gate_up_proj, gate_up_bias,
      down_proj, down_bias;
};

struct DecodeStepModel {
  DecodeStepShape shape;
  std::vector<DecodeStepLayer> layers;
  Tensor embed, final_norm, lm_head;  // [V, H], [H], [V, H]
  Tensor inv_freq;                    // [D/2] f32
  float attention_scaling = 1.0f, eps = 1e-6f;
  // The weights' TMA descriptors in device memory (decode_step_tensor_maps), valid while the weight
  // tensors stay where they are.
  Tensor tensor_maps;
};

// One step: the batch (ForwardBatch's arrays) and the activations it writes.
struct DecodeStepIo {
  Tensor ids, positions, slots, q_indptr, logit_rows;  // [T], [T], [T], [B+1], [R] i32
  PagedKV kv;
  AttentionBounds bounds;
  const std::vector<TensorBuffer>* k_cache = nullptr;  // per layer [S, Hkv, D] bf16
  const std::vector<TensorBuffer>* v_cache = nullptr;
  Tensor residual;  // [>= T, H] f32
  Tensor qkv;       // [>= T, (Hq + 2 Hkv) D] bf16
  Tensor attn;      // [>= T, Hq D] bf16
  Tensor act;       // [>= T, I] bf16
  Tensor logits;    // [R, V] f32
  Tensor scratch;   // decode_step_scratch_bytes(shape) bytes, zeroed once before the first step
  // Optional (profiling), i64 [1 + ops, SMs] with ops = 2 + 5 layers: each block's globaltimer (ns)
  // at its start, then when it finished op k (0 embedding; 1 + 5 l + {qkv, attention, o, gate/up,
  // down}; the head last).
  Tensor timings;
};

// Whether this backend runs the kernel for a model of `shape` in `dtype` (any T <= 8). Sets the
// kernel's launch attributes: call it once before capturing a graph of steps.
bool decode_step_available(Backend& be, const DecodeStepShape& shape, DType dtype);
// Whether a step of T token rows, R logit rows and these bounds takes the kernel, where it is
// available (host arithmetic only: safe while a graph is being captured).
bool decode_step_takes(int64_t T, int64_t R, const AttentionBounds& bounds);
int64_t decode_step_scratch_bytes(Backend& be, const DecodeStepShape& shape);
// The descriptors the kernel streams the weights of `model` (layers and head; no caches) through.
Result<TensorBuffer> decode_step_tensor_maps(Backend& be, const DecodeStepModel& model);
void decode_step_forward(Backend& be, const DecodeStepModel& model, const DecodeStepIo& io);

}  // namespace kiln::ops
