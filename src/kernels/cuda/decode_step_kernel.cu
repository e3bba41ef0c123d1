// One decode step of one request as a single persistent kernel (ops.h: decode_step_kernel_forward):
// the embedding, every layer (RMSNorm, q/k/v with the rotation and the KV write, attention over the
// paged cache, o with the residual add, RMSNorm, gate/up with SwiGLU, down with the residual add),
// the final norm, the head into the logits and the greedy token.
//
// Why: a launch per op pays at each edge the grid's ramp and drain, the dependency wait and the
// input's round trip; a plain GEMV chain with one launch per projection stays near 77% of an H100's
// bandwidth (bench_gemv_floor), where kiln's one-row step already is. Here the weights stream across
// the ops' dependencies (docs/perf-notes.md, twenty-fourth session; bench/bench_persistent_chain.cu
// is the probe of the same structure).
//
// Grid: one block per SM, all resident (cooperative launch). Block: 12 consumer warps and a producer
// warp. Every weight op (q/k/v, o, gate/up, down, the head) is cut in units of a page's R weight rows
// (q/k/v: R / 2 rotation pairs (i, i + D/2) of a head; gate/up: R / 2 outputs' gate and up rows), and
// each block takes a contiguous range of every op's units. A unit's rows stream through a ring of
// shared-memory pages of 4 rows x 768 or 6 rows x 512 columns (6 KB; Pages; as many as the shared
// memory holds beside the staging area, up to kMaxRingPages), by 1-D bulk
// copies (TMA) completing on the
// page's mbarrier: the producer warp walks the block's pages of every layer in order and waits only
// for free pages, never for data, so the next ops' weights load while the consumers wait for the op
// before. The consumers of a weight op: wait (acquire) until every block has counted the previous
// step done, read the op's input vector into shared memory (normed where a norm comes first: f32
// x * inv_rms * w rounded to bf16, as rmsnorm_forward), dot one 16-byte weight vector a thread a page,
// sum four units' rows at a time in a fixed order (shuffles, then the row's warps) and run the op's
// epilogue; then count the step done (release).
// The attention: units (KV head, split) over the blocks; a split's keys go to the warps 32 at a time
// (a lane a key for the scores of the G query heads, the lanes over the dims for P V), online softmax
// in the log2 domain, the warps merged in shared memory into the split's (o, m, l); a merge step (a
// unit a query head) combines the splits into the attention output (bf16-rounded, as the layered
// path's). Deterministic: fixed unit ranges and summation orders, no float atomics.
// The counters and the argmax word are zero between launches: the last block to finish (a ticket)
// writes the greedy token and zeroes them, so a captured graph replays.
//
// Scope (decode_step_kernel_supported): bf16, no biases, no q/k norms, head_dim 64 or 128, at most
// 8 query heads a KV head, hidden size, q width and intermediate size multiples of 768 (pages of 4
// rows) or 512 (pages of 6 rows).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/decode_step_kernel.cuh"
#include "kernels/cuda/fused_linear.cuh"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"

namespace kiln::cuda {
namespace {

using namespace decode_step;
using fused::argmax_key;
using fused::argmax_token;
using hopper::bulk_load_1d;
using hopper::load_acquire_gpu;
using hopper::mbar_arrive;
using hopper::mbar_arrive_expect_tx;
using hopper::mbar_init;
using hopper::mbar_wait;

struct WeightOp {
  const T* w;
  int units, K, kind;
};

// A position in the ring: the slot of the next page and the parity of its use (its fill count & 1).
struct RingPos {
  int slot = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance(int pages) {
    if (++slot == pages) slot = 0, phase ^= 1u;
  }
};

// The model's dimensions as the layout functions take them (kernels/decode_step_layout.h).
__device__ __forceinline__ decode_layout::ModelDims dims_of(const Params& a) {
  return {a.H, a.Hq, a.Hkv, a.D, a.I, a.V};
}
// An op's weights, units (of pages of Pg::kRows rows) and reduction length.
template <class Pg>
__device__ __forceinline__ WeightOp weight_op(const Params& a, int l, int step) {
  const decode_layout::ModelDims m = dims_of(a);
  auto op = [&](const T* w, int kind) {
    return WeightOp{w, decode_layout::op_units(m, kind, Pg::kRows), decode_layout::op_k(m, kind), kind};
  };
  if (l == a.L) return op(a.head, kHead);
  const Layer& y = a.layers[l];
  switch (step) {
    case kQkv: return op(y.qkv, kQkv);
    case kO: return op(y.o, kO);
    case kGateUp: return op(y.gate_up, kGateUp);
    default: return op(y.down, kDown);
  }
}
__device__ __forceinline__ bool is_weight_step(int l, int L, int step) {
  return l == L ? step == 0 : (step == kQkv || step == kO || step == kGateUp || step == kDown);
}
__device__ __forceinline__ int steps_of(int l, int L) { return l == L ? 1 : kSteps; }
// The weight row of page row r of unit u (-1: none, past the op's rows).
template <class Pg>
__device__ __forceinline__ int unit_row(const Params& a, int kind, int u, int r) {
  return decode_layout::unit_row(dims_of(a), kind, Pg::kRows, u, r);
}
// The op's input vector into xs (K floats). x-reading ops: RMSNorm by norm_w (layer 0's q/k/v reads
// the token's embedding row, and its block writes its share of x).
__device__ __forceinline__ void stage_input(const Params& a, int l, int kind, float* xs, float* red) {
  const int tid = threadIdx.x;
  if (kind == kO || kind == kDown) {
    const T* src = kind == kO ? a.attn : a.act;
    const int K = kind == kO ? a.Hq * a.D : a.I;
#pragma unroll 3  // the loads of a thread's vectors issued together (K = I: up to three a thread)
    for (int i = tid * 8; i < K; i += kConsumers * 8) {
      float v[8];
      detail::unpack_bf16x8(__ldcg(reinterpret_cast<const uint4*>(src + i)), v);
#pragma unroll
      for (int e = 0; e < 8; ++e) xs[i + e] = v[e];
    }
    consumer_sync();
    return;
  }
  const T* norm_w = kind == kHead ? a.final_norm : kind == kQkv ? a.layers[l].input_norm : a.layers[l].post_norm;
  const bool embed = kind == kQkv && l == 0;
  const int b = blockIdx.x, H = a.H;
  const int own0 = unit_begin(H, b, gridDim.x), own1 = unit_begin(H, b + 1, gridDim.x);
  const T* erow = a.embed + static_cast<int64_t>(a.ids[0]) * H;
  // Thread tid's elements: 4 at tid * 4 + i * kConsumers * 4 (i < kNormChunks), with their norm
  // weights, all loaded before the sum of squares so that no load waits behind another.
  float4 xv[kNormChunks];
  uint2 wv[kNormChunks];  // four bf16 norm weights
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c) {
    const int i = (tid + c * kConsumers) * 4;
    if (i >= H) break;
    if (embed) {
      const uint2 e = *reinterpret_cast<const uint2*>(erow + i);
      const float2 e0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&e.x));
      const float2 e1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&e.y));
      xv[c] = make_float4(e0.x, e0.y, e1.x, e1.y);
    } else {
      xv[c] = __ldcg(reinterpret_cast<const float4*>(a.x + i));
    }
    wv[c] = *reinterpret_cast<const uint2*>(norm_w + i);
  }
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c) {
    const int i = (tid + c * kConsumers) * 4;
    if (i >= H) break;
    const float4 v = xv[c];
    if (embed)
#pragma unroll
      for (int e2 = 0; e2 < 4; ++e2)
        if (i + e2 >= own0 && i + e2 < own1) __stcg(a.x + i + e2, (&v.x)[e2]);
    ss = fmaf(v.x, v.x, ss);
    ss = fmaf(v.y, v.y, ss);
    ss = fmaf(v.z, v.z, ss);
    ss = fmaf(v.w, v.w, ss);
  }
  const float inv_rms = 1.0f / sqrtf(consumer_sum(ss, red) / static_cast<float>(H) + a.eps);
  auto normed = [&](float x, float w) { return bf16r(__fmul_rn(__fmul_rn(x, inv_rms), w)); };
#pragma unroll
  for (int c = 0; c < kNormChunks; ++c) {
    const int i = (tid + c * kConsumers) * 4;
    if (i >= H) break;
    const float2 w0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wv[c].x));
    const float2 w1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wv[c].y));
    *reinterpret_cast<float4*>(xs + i) =
        make_float4(normed(xv[c].x, w0.x), normed(xv[c].y, w0.y), normed(xv[c].z, w1.x), normed(xv[c].w, w1.y));
  }
  consumer_sync();
}

// The epilogue of page row pr, weight row `row` (unit_row: it exists), whose sum is v; v1 and v2: the
// sums of page rows pr + 1 and pr + R / 2 (q/k/v: the rotation partner; gate/up: the up row). best:
// this thread's largest argmax_key of the head's logits so far.
template <class Pg>
__device__ __forceinline__ void epilogue(const Params& a, int l, int kind, int row, int pr, float v, float v1, float v2,
                                         unsigned long long& best) {
  constexpr int P = Pg::kRows / 2;
  switch (kind) {
    case kQkv: {  // page rows pr, pr + 1 (pr even): dims i, i + D/2 of a head; as store_qkv_rope does
      if (pr & 1) return;
      const int half = a.D / 2, head = row / a.D, i = row % a.D;
      const float x0 = bf16r(v), x1 = bf16r(v1);
      const int slot = a.slots[0];
      const Layer& y = a.layers[l];
      if (head >= a.Hq + a.Hkv) {
        if (slot < 0) return;
        T* dst = y.v_cache + (static_cast<int64_t>(slot) * a.Hkv + (head - a.Hq - a.Hkv)) * a.D + i;
        __stcg(dst, __float2bfloat16_rn(x0));
        __stcg(dst + half, __float2bfloat16_rn(x1));
        return;
      }
      const float2 cs =
          detail::rope_cos_sin(static_cast<float>(a.positions[0]), a.inv_freq[i], a.rope_scaling);
      const float2 r = detail::rope_rotate(x0, x1, cs);
      T* dst;
      if (head < a.Hq) {
        dst = a.q + static_cast<int64_t>(head) * a.D + i;
      } else {
        if (slot < 0) return;
        dst = y.k_cache + (static_cast<int64_t>(slot) * a.Hkv + (head - a.Hq)) * a.D + i;
      }
      __stcg(dst, __float2bfloat16_rn(r.x));
      __stcg(dst + half, __float2bfloat16_rn(r.y));
      return;
    }
    case kGateUp: {  // page rows 0 .. P - 1: the gate rows (weight row = output); P ..: their up rows
      if (pr >= P) return;
      __stcg(a.act + row, __float2bfloat16_rn(v / (1.0f + expf(-v)) * v2));
      return;
    }
    case kHead:
      __stcg(a.logits + row, v);
      best = max(best, argmax_key(v, row));
      return;
    default:  // o, down: into the residual stream
      __stcg(a.x + row, __ldcg(a.x + row) + v);
  }
}

// One weight op's units [u0, u1) of this block: pages n.. of the ring.
template <class Pg>
__device__ __forceinline__ void run_weight_op(const Params& a, int l, const WeightOp& op, int u0, int u1, const T* ring,
                              uint64_t* full, uint64_t* empty, const float* xs, float (*red)[kUnitBatch][kConsumerWarps],
                              RingPos& pos, uint32_t& batches, unsigned long long& best) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  constexpr int R = Pg::kRows, W = Pg::kWarpsPerRow;
  const int r = tid / Pg::kThreadsPerRow, c = tid % Pg::kThreadsPerRow;
  const int pages = op.K / Pg::kCols;
  for (int u = u0; u < u1; u += kUnitBatch, ++batches) {
    const int nb = min(kUnitBatch, u1 - u);
    float acc[kUnitBatch];
#pragma unroll
    for (int j = 0; j < kUnitBatch; ++j) {
      acc[j] = 0.0f;
      if (j >= nb) continue;
      for (int p = 0; p < pages; ++p, pos.advance(a.ring_pages)) {
        mbar_wait(&full[pos.slot], pos.phase);
        const uint4 wv = *reinterpret_cast<const uint4*>(ring + pos.slot * kPageElems + r * Pg::kCols + c * 8);
        acc[j] += detail::dot_bf16x8_f32(wv, xs + p * Pg::kCols + c * 8);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[pos.slot]);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int j = 0; j < kUnitBatch; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    float(*rb)[kConsumerWarps] = red[batches & 1];
    if (lane == 0)
#pragma unroll
      for (int j = 0; j < kUnitBatch; ++j) rb[j][warp] = acc[j];
    consumer_sync();
    if (tid < R * nb) {  // page row pr of unit u + j: the sum of its warps, in order
      const int j = tid / R, pr = tid % R;
      auto row_sum = [&](int q) {
        float v = 0.0f;
        if (q < R)
#pragma unroll
          for (int w = 0; w < W; ++w) v += rb[j][W * q + w];
        return v;
      };
      const int row = unit_row<Pg>(a, op.kind, u + j, pr);
      if (row >= 0) epilogue<Pg>(a, l, op.kind, row, pr, row_sum(pr), row_sum(pr + 1), row_sum(pr + R / 2), best);
    }
  }
}

template <int D, int PC>
__global__ void __maxnreg__(152) decode_step_kernel(const __grid_constant__ Params a) {
  using Pg = Pages<PC>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ring = reinterpret_cast<T*>(smem);                                         // [ring_pages][kPageElems]
  float* xs = reinterpret_cast<float*>(smem + a.ring_pages * kPageElems * 2);  // [xs_floats]
  __shared__ uint64_t full[kMaxRingPages], empty[kMaxRingPages];
  __shared__ float red[2][kUnitBatch][kConsumerWarps];
  __shared__ float sum_red[kConsumerWarps];
  __shared__ unsigned long long block_best[kConsumerWarps];
  const int tid = threadIdx.x, b = blockIdx.x, grid = gridDim.x;
  if (tid == 0) {
    for (int i = 0; i < a.ring_pages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kConsumerWarps);
    }
    hopper::mbar_fence_init();
  }
  __syncthreads();

  if (tid >= kConsumers) {  // the producer warp: every weight page of this block, in order
    const int lane = tid - kConsumers;
    RingPos pos;
    bool refill = false;  // the ring has gone round once: a slot is free only once its page is read
    for (int l = 0; l <= a.L; ++l)
      for (int step = 0; step < steps_of(l, a.L); ++step) {
        if (!is_weight_step(l, a.L, step)) continue;
        const WeightOp op = weight_op<Pg>(a, l, step);
        const int pages = op.K / Pg::kCols;
        const int u1 = unit_begin(op.units, b + 1, grid);
        for (int u = unit_begin(op.units, b, grid); u < u1; ++u) {
          const int64_t row = lane < Pg::kRows ? unit_row<Pg>(a, op.kind, u, lane) : -1;  // this lane's row
          const int rows = __popc(__ballot_sync(0xffffffffu, row >= 0));
          for (int p = 0; p < pages; ++p) {
            if (refill) mbar_wait(&empty[pos.slot], pos.phase ^ 1u);  // the previous use's reads
            if (lane == 0) mbar_arrive_expect_tx(&full[pos.slot], rows * Pg::kCols * 2);
            __syncwarp();
            if (row >= 0)
              bulk_load_1d(ring + pos.slot * kPageElems + lane * Pg::kCols, op.w + row * op.K + p * Pg::kCols,
                           Pg::kCols * 2, &full[pos.slot]);
            pos.advance(a.ring_pages);
            refill = refill || pos.slot == 0;
          }
        }
      }
    return;
  }

  RingPos pos;
  uint32_t batches = 0;
  unsigned long long best = 0;
  int prev = -1;  // the counter of the step before
  for (int l = 0; l <= a.L; ++l)
    for (int step = 0; step < steps_of(l, a.L); ++step) {
      if (tid == 0 && prev >= 0)
        while (load_acquire_gpu(a.counters + prev) < static_cast<unsigned>(grid)) {
        }
      prev = l * kSteps + step;
      unsigned long long* trace = a.trace ? a.trace + 2 * (static_cast<int64_t>(b) * (a.L * kSteps + 1) + prev) : nullptr;
      if (trace && tid == 0) trace[0] = hopper::global_timer_ns();
      consumer_sync();
      if (is_weight_step(l, a.L, step)) {
        const WeightOp op = weight_op<Pg>(a, l, step);
        stage_input(a, l, op.kind, xs, sum_red);
        run_weight_op<Pg>(a, l, op, unit_begin(op.units, b, grid), unit_begin(op.units, b + 1, grid), ring, full, empty,
                      xs, red, pos, batches, best);
      } else if (step == kAttn) {
        const int units = a.Hkv * a.splits;
        for (int u = unit_begin(units, b, grid); u < unit_begin(units, b + 1, grid); ++u) run_attention<D>(a, l, u, xs);
      } else {
        for (int h = unit_begin(a.Hq, b, grid); h < unit_begin(a.Hq, b + 1, grid); ++h) run_merge(a, h, xs);
      }
      consumer_sync();  // every output of the step stored by this block
      if (trace && tid == 0) trace[1] = hopper::global_timer_ns();
      if (tid == 0 && l < a.L) {
        __threadfence();
        atomicAdd(a.counters + prev, 1u);
      }
    }

  // The greedy token: the block's largest key, then the last block to arrive decodes the largest of
  // all and leaves the counters and the word zero for the next launch.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  if (tid % 32 == 0) block_best[tid / 32] = best;
  consumer_sync();
  if (tid == 0) {
    for (int w = 0; w < kConsumerWarps; ++w) best = max(best, block_best[w]);
    atomicMax(a.best, best);
    __threadfence();
    unsigned* ticket = a.counters + a.L * kSteps;
    if (atomicAdd(ticket, 1u) == static_cast<unsigned>(grid) - 1) {
      __threadfence();
      const unsigned long long key = atomicExch(a.best, 0ull);
      if (a.token) *a.token = argmax_token(key);
      for (int i = 0; i <= a.L * kSteps; ++i) a.counters[i] = 0;
    }
  }
}

}  // namespace

namespace {

// Staging floats: the widest input vector, or the attention's q, warp states and outputs.
int64_t staging_floats(int64_t H, int64_t Hq, int64_t D, int64_t I) {
  const int64_t attention = kMaxGroup * D + 2 * kConsumerWarps * kMaxGroup + kConsumerWarps * kMaxGroup * D;
  return std::max({H, Hq * D, I, attention});
}
// The static shared memory (barriers, sums) beside the dynamic ring and staging area, rounded up.
constexpr int64_t kStaticSmem = 2048;
// Ring pages: as many as fit beside the staging area in `optin` bytes (at most kMaxRingPages; at
// least 8, else the kernel does not take the model).
int ring_pages(int64_t optin, int64_t H, int64_t Hq, int64_t D, int64_t I) {
  const int64_t room = (optin - kStaticSmem - staging_floats(H, Hq, D, I) * 4) / (kPageElems * 2);
  return static_cast<int>(std::clamp<int64_t>(room, 0, kMaxRingPages));
}
int64_t smem_bytes(int ring, int64_t H, int64_t Hq, int64_t D, int64_t I) {
  return static_cast<int64_t>(ring) * kPageElems * 2 + staging_floats(H, Hq, D, I) * 4;
}
int optin_smem(CudaBackend& be) {
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, be.device().index));
  return optin;
}
using decode_layout::page_cols;

}  // namespace

bool decode_step_kernel_supported(CudaBackend& be, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I,
                                  int64_t num_layers, DType dtype) {
  if (dtype != DType::bf16 || !attention_device_has_wgmma(be)) return false;  // sm_90 (bulk copies)
  if (D != 64 && D != 128) return false;
  if (Hkv <= 0 || Hq % Hkv != 0 || Hq / Hkv > kMaxGroup) return false;
  if (page_cols(H, Hq * D, I) == 0 || num_layers <= 0 || num_layers > kMaxLayers) return false;
  if (H > kNormChunks * 4 * kConsumers) return false;
  return ring_pages(optin_smem(be), H, Hq, D, I) >= 8;
}

void decode_step_kernel_forward(CudaBackend& be, const ops::DecodeStepArgs& in) {
  const int L = in.num_layers;
  const ops::DecodeStepLayer& l0 = in.layers[0];
  const int64_t H = l0.qkv_proj.size(1), D = l0.k_cache.size(2), Hkv = l0.k_cache.size(1);
  const int64_t Hq = l0.o_proj.size(1) / D, I = l0.down_proj.size(1), V = in.head.size(0);
  KILN_ASSERT(decode_step_kernel_supported(be, H, Hq, Hkv, D, I, L, l0.qkv_proj.dtype));
  KILN_ASSERT(in.sync.numel() >= ops::kDecodeStepSyncWords(L) && in.logits.numel() == V && V < (int64_t(1) << 31));
  KILN_ASSERT(in.x.numel() == H && in.q.numel() == Hq * D && in.attn.numel() == Hq * D && in.act.numel() == I);
  Params a{};
  auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; };
  KILN_ASSERT(aligned(in.head) && aligned(in.embed) && aligned(in.act) && aligned(in.attn) && aligned(in.x));
  for (int l = 0; l < L; ++l) {
    const ops::DecodeStepLayer& y = in.layers[l];
    // The bulk copies read 16-byte aligned rows.
    KILN_ASSERT(aligned(y.qkv_proj) && aligned(y.o_proj) && aligned(y.gate_up_proj) && aligned(y.down_proj));
    a.layers[l] = Layer{y.input_norm.ptr<const T>(), y.qkv_proj.ptr<const T>(),     y.o_proj.ptr<const T>(),
                        y.post_norm.ptr<const T>(),  y.gate_up_proj.ptr<const T>(), y.down_proj.ptr<const T>(),
                        y.k_cache.ptr<T>(),          y.v_cache.ptr<T>()};
  }
  const int grid = be.multiprocessor_count();
  // Splits per KV head: a unit a block where the bound's keys allow (32 keys a split at least).
  const int splits = static_cast<int>(std::clamp<int64_t>(grid / Hkv, 1, std::max(1, (in.max_kv_len + 31) / 32)));
  a.L = L, a.H = static_cast<int>(H), a.Hq = static_cast<int>(Hq), a.Hkv = static_cast<int>(Hkv);
  a.D = static_cast<int>(D), a.I = static_cast<int>(I), a.V = static_cast<int>(V), a.splits = splits;
  a.xs_floats = static_cast<int>(staging_floats(H, Hq, D, I));
  KILN_ASSERT(2 * splits + kConsumers <= a.xs_floats);  // the merge's staging (run_merge)
  a.ring_pages = ring_pages(optin_smem(be), H, Hq, D, I);
  a.embed = in.embed.ptr<const T>(), a.final_norm = in.final_norm.ptr<const T>(), a.head = in.head.ptr<const T>();
  a.ids = in.ids.ptr<const int32_t>(), a.positions = in.positions.ptr<const int32_t>();
  a.slots = in.slots.ptr<const int32_t>();
  a.page_indptr = in.kv.page_indptr.ptr<const int32_t>(), a.page_indices = in.kv.page_indices.ptr<const int32_t>();
  a.last_page_len = in.kv.last_page_len.ptr<const int32_t>(), a.page_size = in.kv.page_size;
  a.inv_freq = in.inv_freq.ptr<const float>(), a.rope_scaling = in.rope_scaling, a.eps = in.eps;
  a.attn_scale = in.attn_scale;
  a.x = in.x.ptr<float>(), a.q = in.q.ptr<T>(), a.attn = in.attn.ptr<T>(), a.act = in.act.ptr<T>();
  float* scratch = static_cast<float*>(be.scratch(static_cast<int64_t>(splits) * Hq * (D + 2) * 4));
  a.part = scratch, a.part_ml = scratch + static_cast<int64_t>(splits) * Hq * D;
  a.logits = in.logits.ptr<float>();
  a.token = in.token.data ? in.token.ptr<int32_t>() : nullptr;
  a.trace = nullptr;
  if (in.trace.data) {
    KILN_ASSERT(in.trace.numel() >= static_cast<int64_t>(grid) * (6 * L + 1) * 2 && in.trace.dtype == DType::i64);
    a.trace = reinterpret_cast<unsigned long long*>(in.trace.data);
  }
  a.best = reinterpret_cast<unsigned long long*>(in.sync.data);  // words 0-1 (8-byte aligned)
  a.counters = reinterpret_cast<unsigned*>(in.sync.ptr<int32_t>() + 2);
  KILN_ASSERT(reinterpret_cast<uintptr_t>(in.sync.data) % 8 == 0);

  const int pc = page_cols(H, Hq * D, I);
  auto kernel = D == 64 ? (pc == 768 ? decode_step_kernel<64, 768> : decode_step_kernel<64, 512>)
                        : (pc == 768 ? decode_step_kernel<128, 768> : decode_step_kernel<128, 512>);
  const int smem = static_cast<int>(smem_bytes(a.ring_pages, H, Hq, D, I));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = static_cast<cudaStream_t>(be.stream());
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // every block resident: they wait on each other
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a));
}

}  // namespace kiln::cuda
