// The training ops: backward passes of the model's ops, dense 4-D training attention with an
// explicit mask, the fused cross-entropy row kernel, and the optimizer updates. Each has a CPU twin
// (kernels/cpu/, f32 math, the reference) and a CUDA twin (kernels/cuda/), like kernels/ops.h, and
// follows its conventions: every tensor on the backend's device, shapes checked with KILN_ASSERT,
// f32 accumulation, activations in f32 or bf16.
//
// Layouts: training batches are dense, B rows of S tokens. Token-wise tensors are [B*S, ...] in
// (b, s) order, so the GEMMs see plain matrices; the attention core works on [B, H, S, D].
//
// Gradient convention: weight gradients (dw, db, dtable, dq_norm, ...) are f32 and ACCUMULATED
// (+=), so gradient accumulation over micro-batches and the tied embedding/head need no extra pass;
// activation gradients are OVERWRITTEN unless an `accumulate` flag says otherwise.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace kiln::ops {

// ---- Normalisation -------------------------------------------------------------------------------

// Backward of y = x / sqrt(mean(x^2) + eps) * w over the last dimension (rmsnorm_forward).
// dy, x: [..., H] (f32 or bf16; x is the forward input), w: [H].
// dx: [..., H] f32 or bf16: dx = d loss / dx, added to dx's contents when accumulate_dx.
// dw: [H] f32: dw += sum over rows of dy * x / rms(x).
// dx_copy: absent, or [..., H] of any float dtype that also receives the new dx (rounded): the
// compute-dtype copy of the residual gradient the next GEMMs read, without another pass.
void rmsnorm_backward(Backend& be, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, float eps, bool accumulate_dx,
                      Tensor dx_copy = {});

// ---- MLP, embedding, biases ----------------------------------------------------------------------

// Backward of swiglu_forward: out[t, i] = silu(g) * u with g = gate_up[t, i], u = gate_up[t, I + i].
// dout: [T, I], gate_up: [T, 2I] (the forward input); d_gate_up: [T, 2I] overwritten.
void swiglu_backward(Backend& be, Tensor d_gate_up, Tensor dout, Tensor gate_up);

// Backward of embedding_forward: dtable[ids[t], :] += dy[t, :]. dtable: [V, H] f32, dy: [T, H], ids: [T] i32.
void embedding_backward(Backend& be, Tensor dtable, Tensor dy, Tensor ids);

// Bias gradient: db[n] += sum over m of dy[m, n]. db: [N] f32, dy: [M, N].
void bias_backward(Backend& be, Tensor db, Tensor dy);

// ---- Attention input stage -----------------------------------------------------------------------

// Training twin of qkv_rope_cache_write: splits the packed projection into dense per-head tensors,
// applies the optional per-head RMSNorm of q and k (Qwen3), then rotary embedding to q and k.
// qkv:       [B*S, (Hq + 2 Hkv) * D]  rows in (b, s) order; each row Hq q heads, Hkv k heads, Hkv v heads
// positions: [B*S] i32; inv_freq: [D/2] f32; q_norm, k_norm: [D] or absent (data == nullptr)
// q: [B, Hq, S, D]; k, v: [B, Hkv, S, D] (B and S are read from q's shape).
void qkv_split_rope_forward(Backend& be, Tensor q, Tensor k, Tensor v, Tensor qkv, Tensor positions, Tensor inv_freq,
                            float attention_scaling, Tensor q_norm, Tensor k_norm, float eps);

// Its backward: d_qkv [B*S, (Hq + 2 Hkv) * D] (overwritten) from dq [B, Hq, S, D], dk, dv [B, Hkv, S, D].
// qkv is the forward input (needed to recompute the norms); dq_norm, dk_norm: [D] f32, accumulated,
// absent when the norms are.
void qkv_split_rope_backward(Backend& be, Tensor d_qkv, Tensor dq_norm, Tensor dk_norm, Tensor dq, Tensor dk, Tensor dv,
                             Tensor qkv, Tensor positions, Tensor inv_freq, float attention_scaling, Tensor q_norm,
                             Tensor k_norm, float eps);

// ---- Attention core ------------------------------------------------------------------------------

// Grouped-query attention over dense tensors with an explicit mask, for training.
// q: [B, Hq, S, D]; k, v: [B, Hkv, S, D]; query head h reads kv head h / (Hq / Hkv).
// Mask: query i of row b sees key j iff (!causal || j <= i) and, when segment_ids ([B, S] i32) is
// given, segment_ids[b, j] == segment_ids[b, i] >= 0. Segments are documents of a packed row
// (consecutive runs); -1 marks padding, whose queries see nothing and whose keys nobody sees.
// out: [B, S, Hq, D] (the o-projection's input layout, same dtype as q);
// lse: [B, Hq, S] f32, log of the softmax denominator of the scaled scores (log sum_j exp(scale q.k_j)).
// A query that sees no key gets out = 0 and lse = -inf, and contributes no gradient.
// The S x S score matrix is never stored in device memory (flash-style tiling on CUDA).
void attention_train_forward(Backend& be, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor segment_ids,
                             bool causal, float scale);

// Backward: dout [B, S, Hq, D]; q, k, v, out, lse from the forward.
// dq: [B, Hq, S, D], dk, dv: [B, Hkv, S, D] overwritten (dk, dv summed over the heads of a group).
void attention_train_backward(Backend& be, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                              Tensor out, Tensor lse, Tensor segment_ids, bool causal, float scale);

// ---- Loss ----------------------------------------------------------------------------------------

// Token cross-entropy over rows of logits, PyTorch's semantics (label_smoothing as in
// torch.nn.functional.cross_entropy), generalised for reinforcement-learning losses (a sampling
// temperature, per-row weights such as advantages, the policy entropy). For row r with target
// t = targets[r] >= 0, z = logit_scale * logits[r] and p = softmax(z):
//   losses[r]    = (1 - ls) * (-log p[t]) + ls * mean_v(-log p[v])
//   logprobs[r]  = log p[t]
//   entropies[r] = -sum_v p[v] log p[v]                                    (only when given)
//   logits[r]   <- grad_scale * row_scale_r * logit_scale * (p - (1 - ls) * onehot(t) - ls / V)
//                  (only when write_grad; row_scale_r = row_scales[r], or 1 without row_scales)
// so the gradient written is exactly d(grad_scale * row_scale_r * losses[r]) / d logits[r]; the
// losses themselves are not multiplied by row_scale_r.
// A row with a negative target (-100) is ignored: loss 0, logprob 0, entropy 0, gradient row 0.
// logits: [R, V] f32 or bf16 (turned into the gradient in place: the fused head never stores fp32
// logits for the whole batch); targets: [R] i32 (< V); losses, logprobs: [R] f32, each may be absent
// (data == nullptr). With logit_scale == 1 and neither row_scales nor entropies the results are those
// of plain cross-entropy, bit for bit.
struct CrossEntropyOptions {
  float label_smoothing = 0.0f;
  float grad_scale = 1.0f;
  bool write_grad = false;
  float logit_scale = 1.0f;  // z = logits * logit_scale (1 / temperature), finite and > 0
  Tensor row_scales;         // optional [R] f32 in: multiplies row r's gradient (not its loss)
  Tensor entropies;          // optional [R] f32 out: the entropy of softmax(z) per row (0 when ignored)
};
void cross_entropy_forward_backward(Backend& be, Tensor logits, Tensor losses, Tensor logprobs, Tensor targets,
                                    const CrossEntropyOptions& o);

// ---- Optimizers ----------------------------------------------------------------------------------

// One AdamW step over a flat parameter vector, torch.optim.AdamW's arithmetic:
//   g = grads * grad_scale                  (grad_scale: clipping and/or averaging)
//   p -= lr * weight_decay * p              (only for elements i < decay_end)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// params, grads, m, v: [N] f32. params_lowp: absent or [N] bf16/f16, set to the rounded new params
// (the compute copy the model reads). step is 1-based.
struct AdamWStep {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;
  float grad_scale = 1.0f;
  int64_t decay_end = 0;
};
void adamw_step(Backend& be, Tensor params, Tensor grads, Tensor m, Tensor v, Tensor params_lowp, const AdamWStep& s);

// Plain SGD (torch.optim.SGD without momentum): g = grads * grad_scale (+ weight_decay * p for
// i < decay_end); p -= lr * g. Same tensors as adamw_step.
void sgd_step(Backend& be, Tensor params, Tensor grads, Tensor params_lowp, float lr, float weight_decay,
              float grad_scale, int64_t decay_end);

// One Muon step (torch.optim.Muon, PyTorch 2.9+) over the weight matrices inside a flat range. Per
// matrix [A, B] of `matrices` (its elements of params, grads, momentum; row-major):
//   g   = grads * grad_scale                               (clipping)
//   buf = lerp(buf, g, 1 - momentum)                       (momentum: [M] f32, zero at the start)
//   u   = nesterov ? lerp(g, buf, momentum) : buf
//   X   = u, or u^T when A > B (so X is a x b with a <= b)
//   X = X / max(||X||_F, eps);  ns_steps times:  G = X X^T;  X = ns_a X + (ns_b G + ns_c G G) X
//   p = p * (1 - lr * weight_decay)                        (decayed matrices only; the plain lr)
//   p = p - lr' * X (transposed back),  lr' = lr * sqrt(max(1, A / B))   (adjust_lr original)
//                                        or lr * 0.2 * sqrt(max(A, B))  (match_rms_adamw)
// lerp is ATen's (a + w (b - a) for |w| < 0.5, else b - (b - a)(1 - w)). Elements of the range
// outside every matrix (alignment padding) are not touched.
// Precision: the CPU twin runs everything in f32 (Newton-Schulz as f32 GEMMs); the CUDA twin
// casts u to bf16 and runs Newton-Schulz as bf16 GEMMs with f32 accumulation, rounding every
// product to bf16 (what torch does), with the master weights and the momentum in f32.
// params, grads, momentum: [M] f32; params_lowp: absent or [M] bf16/f16, set to the rounded new
// params of every matrix. Matrices must lie inside [0, M) and not overlap.
struct MuonMatrix {
  int64_t offset = 0, rows = 0, cols = 0;  // elements [offset, offset + rows * cols), row-major
  bool decay = true;
};
enum class MuonAdjustLr { original, match_rms_adamw };
struct MuonStep {
  float lr = 1e-3f, weight_decay = 0.0f, momentum = 0.95f;
  bool nesterov = true;
  int ns_steps = 5;
  float ns_a = 3.4445f, ns_b = -4.7750f, ns_c = 2.0315f;
  float eps = 1e-7f;
  MuonAdjustLr adjust_lr = MuonAdjustLr::original;
  float grad_scale = 1.0f;
};
void muon_step(Backend& be, Tensor params, Tensor grads, Tensor momentum, Tensor params_lowp,
               const std::vector<MuonMatrix>& matrices, const MuonStep& s);

namespace detail {
// The f32 scalars of a Muon step, shared by the twins: each hyper-parameter widened to the double
// of its shortest decimal (as in adamw_scalars.h), the factors formed in double as Python does,
// then rounded to f32 as torch rounds a Python scalar for an f32 tensor.
struct MuonScalars {
  float grad_scale;
  float buf_weight;         // 1 - momentum   (buf.lerp_(g, 1 - momentum))
  float nesterov_weight;    // momentum       (g.lerp(buf, momentum))
  bool nesterov;
  float decay;              // 1 - lr * weight_decay
  float ns_a, ns_b, ns_c;   // Newton-Schulz coefficients (f32, the GEMM alpha / beta)
  float eps;
  int ns_steps;
};
MuonScalars muon_scalars(const MuonStep& s);
// -lr' for a [rows, cols] matrix, rounded to f32 (param.add_(update, alpha=-adjusted_lr)).
float muon_neg_adjusted_lr(const MuonStep& s, int64_t rows, int64_t cols);
}  // namespace detail

// sum_i x[i]^2 of an f32 vector, accumulated in f64 where it matters; returned on the host (the CUDA
// twin synchronises the stream). NaN/inf in x give a non-finite result.
double sum_squares(Backend& be, Tensor x);

}  // namespace kiln::ops
