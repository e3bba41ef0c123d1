// Internal declarations of the persistent decode-step kernel (decode_step.cu, kernels/decode_step.h):
// its launch constants, its parameter block (passed by value, read from the constant bank), the
// shared-memory work area, and the device helpers its stages share (the consumer barrier, the
// grid-wide stage barrier, coherent loads of data written earlier in the same launch).
//
// Ops of a step, in order: 0 embedding; 1 + 5 l + {0 qkv, 1 attention, 2 o, 3 gate/up, 4 down} for
// layer l; 1 + 5 L the head. Every block finishes op k (its share of it) and publishes its progress
// before any block starts op k + 1: each block has its own progress word (no contended atomics),
// launch base + ops done, where the base grows by 1024 per launch (so nothing is reset); a block
// starts op k once every block's progress is at least base + k. Data
// written in the launch is read with ld.global.cg (L2), never through L1, which is not coherent
// across SMs.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>

namespace kiln::cuda::decode {

using bf16 = __nv_bfloat16;

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // + the producer warp (the last one)
constexpr int kTileRows = 32;              // weight rows per unit (SwiGLU: 16 gate + the 16 up rows)
constexpr int kChunk = 256;                // k elements per unit
constexpr int kBoxRows = 16;               // a unit is two TMA boxes of 16 rows x 256 columns
constexpr int kSlotBytes = kTileRows * kChunk * 2;
constexpr int kMaxRows = 8;                // token rows (the mma's n8)
constexpr int kMaxLayers = 96;
constexpr int kMaxGroup = 8;               // query heads per KV head
constexpr int kMaxHeadDim = 128;
constexpr int kMaxSplits = 64;             // attention splits of one (request, KV head)
constexpr int kMaxStages = 16;
constexpr int kMaxOps = 2 + 5 * kMaxLayers;

struct LayerPtrs {
  const bf16 *input_norm, *qkv_w, *qkv_b, *q_norm, *k_norm, *o_w, *o_b, *post_norm, *gu_w, *gu_b, *down_w, *down_b;
  bf16 *k_cache, *v_cache;
};

struct Params {
  int layers, T, R, B, H, I, Hq, Hkv, D, V;
  int page_size, num_splits, stages, blocks;
  int x_offset, ring_offset;  // shared-memory byte offsets of the staged x rows and of the ring
  float eps, scale_log2, rope_scaling;
  const int32_t *ids, *positions, *slots, *q_indptr, *logit_rows;
  const int32_t *page_indptr, *page_indices, *last_page_len;
  const bf16 *embed, *final_norm, *lm_head;
  const CUtensorMap* maps;  // [4 L + 1]: each layer's qkv, o, gate/up, down, then the head
  const float* inv_freq;
  float* residual;  // [T, H]
  bf16* qkv;        // [T, (Hq + 2 Hkv) D]
  bf16* attn;       // [T, Hq D]
  bf16* act;        // [T, I]
  float* logits;    // [R, V]
  // Scratch (kernels/decode_step.h: zeroed once; every counter is back at zero when a launch ends).
  unsigned long long* progress;  // [blocks]: launch base + ops block g has finished
  unsigned long long* launch;    // [2]: the launch base (advanced by the last block out), blocks out
  unsigned* tile_count;  // [max tiles]: pieces of a split tile that have arrived
  unsigned* attn_count;  // [kMaxRows * Hkv]: splits of a (request, KV head) that have arrived
  float* ss_part;        // [ceil(H / 32), kMaxRows]: sum of squares of the residual per 32-column tile
  float* tile_part;      // [blocks, 2, kTileRows * kMaxRows]: a block's first and last partial tiles
  float* attn_part;      // [kMaxRows * Hkv, kMaxSplits, G, D + 2]: a split's (o, m, l)
  unsigned long long* timings;  // optional [1 + ops, blocks]: globaltimer at the start, after each op
  LayerPtrs layer[kMaxLayers];
};

// Shared memory besides the ring: what the GEMV stages and the attention stage need (a union; the
// GEMV stages' staged x rows follow `gemv` and may reach past the union, see decode_step.cu).
struct Work {
  unsigned long long base;  // this launch's progress base
  float rinv[kMaxRows];
  int flag;
  union alignas(16) {  // float4 reads of the attention rows
    struct {
      float red[kConsumerWarps][kTileRows][kMaxRows + 1];
    } gemv;
    struct {
      float q[kMaxGroup][kMaxHeadDim];
      float k_new[kMaxHeadDim], v_new[kMaxHeadDim];
      float o[kConsumerWarps][kMaxGroup][kMaxHeadDim];
      float m[kConsumerWarps][kMaxGroup], l[kConsumerWarps][kMaxGroup];
    } attn;
  };
};

// Barrier of the consumer warps only (the producer runs ahead on its own).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory"); }

__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// The release / acquire fence of the stage barriers and split-tile counters (lighter than
// __threadfence's fence.sc; with the consumer barrier it orders the whole block's writes).
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

__device__ __forceinline__ void store_release(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;\n" ::"l"(p), "l"(v) : "memory");
}

// This block's share of op `op` is complete (every consumer's writes before the release).
__device__ __forceinline__ void record_time(const Params& p, int row) {
  if (p.timings && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    p.timings[static_cast<int64_t>(row) * p.blocks + blockIdx.x] = t;
  }
}

__device__ __forceinline__ void signal_done(const Params& p, const Work& w, int op) {
  consumer_sync();
  record_time(p, 1 + op);
  if (threadIdx.x == 0) {
    fence_acq_rel();
    store_release(p.progress + blockIdx.x, w.base + op + 1);
  }
}

// Waits until every block has finished op `op` (a warp reads all the progress words at once); traps
// (a launch error, not a hang) after ~10 s.
__device__ __forceinline__ void wait_done(const Params& p, const Work& w, int op) {
  if (threadIdx.x < 32) {
    const unsigned long long target = w.base + op + 1;
    for (long long spins = 0;; ++spins) {
      bool ok = true;  // relaxed loads, all in flight together; the fence below orders what follows
      for (int g = threadIdx.x; g < p.blocks; g += 32) ok &= load_relaxed(p.progress + g) >= target;
      if (__all_sync(0xffffffffu, ok)) break;
      if (spins > 1000) __nanosleep(32);
      if (spins > 100000000ll) {
        if (!ok) printf("kiln decode step: block %d waited too long for op %d\n", blockIdx.x, op);
        __trap();
      }
    }
    fence_acq_rel();
  }
  consumer_sync();
}

__device__ __forceinline__ float ldcg_f32(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float2 ldcg_f32x2(const float* p) { return __ldcg(reinterpret_cast<const float2*>(p)); }
__device__ __forceinline__ uint32_t ldcg_u32(const bf16* p) { return __ldcg(reinterpret_cast<const unsigned*>(p)); }
__device__ __forceinline__ float ldcg_bf16(const bf16* p) {
  const unsigned short u = __ldcg(reinterpret_cast<const unsigned short*>(p));
  return __bfloat162float(__ushort_as_bfloat16(u));
}
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

}  // namespace kiln::cuda::decode
