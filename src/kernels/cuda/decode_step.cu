// The persistent decode-step kernel (kernels/decode_step.h; constants, parameters and the stage
// barrier in decode_step_internal.cuh, the attention stage in decode_step_attention.cuh).
//
// Grid: one block per SM (a cooperative launch, so all are resident), 8 consumer warps and a producer
// warp. Matrix-vector stages: a weight matrix [N, K] is cut into units of 32 rows x 256 columns (a
// SwiGLU unit: 16 gate rows and the 16 up rows of the same outputs), numbered tile-major; block g
// takes units [g U / G, (g + 1) U / G) of the U units (stream-K: every block streams the same number
// of bytes). The producer walks the block's units of every stage of the step in order, each unit two
// TMA boxes of 16 rows into a ring slot, and waits only for free slots, so it runs ahead of the
// consumers across stage barriers, attention included.
// Consumers: warp w multiplies k columns [32 w, 32 w + 32) of a unit on tensor cores (mma m16n8k16:
// 16 weight rows x the token rows as n; A read from the slot, B from the token rows' x, staged in
// shared memory once per stage for the chunks the block touches). A run of consecutive units of one
// tile ends in a fixed-order reduction of the warps' sums; a tile split between blocks leaves each
// block's piece in scratch and the last to arrive (a counter per tile) adds the pieces in block order
// and runs the epilogue: store (+ bias), residual add with the tile's sum of squares for the next
// norm, SwiGLU, or logits. Normed inputs: x * norm_w rounded to bf16 in the B operand, the row's
// 1 / rms (from the tile sums of squares the residual's producer left) applied to the product.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/decode_step_attention.cuh"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/decode_step.h"

namespace kiln::cuda {
namespace decode {
namespace {

enum Epilogue { kStore, kAddResidual, kSwiglu, kLogits };

// One matrix-vector stage of the step.
struct Gemv {
  const CUtensorMap* map;         // of w
  const bf16 *w, *bias, *norm_w;  // norm_w: x is the f32 residual stream, normed; else x is bf16
  const void* x;                  // [rows, K]
  const int32_t* rows;            // x row of output column c (nullptr: c)
  int N, K, M, epilogue;          // N: weight rows (SwiGLU: outputs I, weight rows 2I)
  int tiles, chunks;
  int64_t units;
  bool whole_tiles;  // block g takes tile g whole (no split tiles to add up)
};

__device__ __forceinline__ bool is_gemv(int op, int layers) { return op == 1 + 5 * layers || (op > 0 && (op - 1) % 5 != 1); }

__device__ Gemv gemv_of(const Params& p, int op) {
  Gemv m{};
  if (op == 1 + 5 * p.layers) {
    m = Gemv{p.maps + 4 * p.layers, p.lm_head, nullptr, p.final_norm, p.residual, p.logit_rows, p.V, p.H, p.R, kLogits};
  } else {
    const int l = (op - 1) / 5;
    const LayerPtrs& L = p.layer[l];
    const CUtensorMap* maps = p.maps + 4 * l;
    switch ((op - 1) % 5) {
      case 0:
        m = Gemv{maps, L.qkv_w, L.qkv_b, L.input_norm, p.residual, nullptr, (p.Hq + 2 * p.Hkv) * p.D, p.H, p.T, kStore};
        break;
      case 2: m = Gemv{maps + 1, L.o_w, L.o_b, nullptr, p.attn, nullptr, p.H, p.Hq * p.D, p.T, kAddResidual}; break;
      case 3: m = Gemv{maps + 2, L.gu_w, L.gu_b, L.post_norm, p.residual, nullptr, p.I, p.H, p.T, kSwiglu}; break;
      default: m = Gemv{maps + 3, L.down_w, L.down_b, nullptr, p.act, nullptr, p.H, p.I, p.T, kAddResidual}; break;
    }
  }
  m.tiles = m.epilogue == kSwiglu ? (m.N + 15) / 16 : (m.N + kTileRows - 1) / kTileRows;
  m.chunks = (m.K + kChunk - 1) / kChunk;
  m.units = static_cast<int64_t>(m.tiles) * m.chunks;
  // A matrix of at most a tile per block whose tile fits the ring (q/k/v, o): the producer has it in
  // shared memory before the stage starts, and a whole tile needs no fix-up across blocks.
  m.whole_tiles = m.tiles <= p.blocks && m.chunks <= p.stages;
  return m;
}

// The first unit of block `block`: stream-K shares, or tile `block` whole.
__device__ __forceinline__ int64_t unit_begin(const Gemv& m, int block, int blocks) {
  return m.whole_tiles ? static_cast<int64_t>(min(block, m.tiles)) * m.chunks : m.units * block / blocks;
}
// The block whose range holds unit u.
__device__ __forceinline__ int block_of(int64_t u, int64_t units, int blocks) {
  return static_cast<int>(((u + 1) * blocks - 1) / units);
}

// mbar_wait with a bound: a stalled ring traps (a launch error naming the block) instead of hanging.
__device__ __forceinline__ void ring_wait(uint64_t* bar, uint32_t parity, const char* what) {
  const uint32_t addr = smem_u32(bar);
  for (long long spins = 0;; ++spins) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
    if (done) return;
    if (spins > 20000000ll) {
      printf("kiln decode step: block %d thread %d stalled on the %s ring barrier\n", blockIdx.x, threadIdx.x, what);
      __trap();
    }
  }
}

// Streams the block's units of every matrix-vector stage, in order: each unit two TMA boxes (plain:
// rows 32 t .. + 15 and + 16 .. + 31; SwiGLU: gate rows 16 t .. + 15 and the up rows I + 16 t ..),
// out-of-bounds rows and columns zero-filled.
__device__ void producer(const Params& p, uint8_t* ring, uint64_t* full, uint64_t* empty) {
  if (threadIdx.x % 32 != 0) return;
  uint32_t count = 0;
  for (int op = 1; op < 2 + 5 * p.layers; ++op) {
    if (!is_gemv(op, p.layers)) continue;
    const Gemv m = gemv_of(p, op);
    const int64_t u1 = unit_begin(m, blockIdx.x + 1, p.blocks);
    for (int64_t u = unit_begin(m, blockIdx.x, p.blocks); u < u1; ++u, ++count) {
      const int slot = static_cast<int>(count % p.stages);
      if (count >= static_cast<uint32_t>(p.stages)) ring_wait(&empty[slot], (count / p.stages - 1) & 1, "empty");
      const int tile = static_cast<int>(u / m.chunks), k0 = static_cast<int>(u % m.chunks) * kChunk;
      const int row0 = m.epilogue == kSwiglu ? tile * kBoxRows : tile * kTileRows;
      const int row1 = m.epilogue == kSwiglu ? m.N + tile * kBoxRows : row0 + kBoxRows;
      uint8_t* dst = ring + slot * kSlotBytes;
      hopper::mbar_arrive_expect_tx(&full[slot], kSlotBytes);
      hopper::tma_load_2d(dst, m.map, k0, row0, &full[slot]);
      hopper::tma_load_2d(dst + kSlotBytes / 2, m.map, k0, row1, &full[slot]);
    }
  }
}

// Stages x rows 0..M-1 for the chunks this block's units [u0, u1) touch: the B operand in bf16 (normed
// inputs: x * norm_w rounded), rows of K rounded up to 32, + 8 elements (the padding spreads the
// fragment loads over the banks). Read from L2 once per stage instead of once per unit.
__device__ __forceinline__ int x_stride(int K) { return (K + 31) / 32 * 32 + 8; }

template <bool kNorm>
__device__ void stage_x(const Gemv& m, bf16* xs, int64_t u0, int64_t u1) {
  const int stride = x_stride(m.K);
  if (m.K % 32 != 0)  // the last 32-column slice's missing half: zeros (the weights' are zero-filled)
    for (int i = threadIdx.x; i < 2 * m.M; i += kConsumers)
      *reinterpret_cast<uint4*>(xs + (i / 2) * stride + m.K + 8 * (i % 2)) = uint4{};
  auto load_range = [&](int k_begin, int k_end) {  // multiples of 8
    const int per_row = (k_end - k_begin) / 8;
    for (int i = threadIdx.x; i < m.M * per_row; i += kConsumers) {
      const int r = i / per_row, k = k_begin + (i % per_row) * 8;
      const int64_t at = static_cast<int64_t>(m.rows ? m.rows[r] : r) * m.K + k;
      uint4 v;
      if constexpr (kNorm) {
        const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(m.x) + at);
        const float4 a = __ldcg(src), b = __ldcg(src + 1);
        float nw[8];
        detail::unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(m.norm_w + k)), nw);
        const float y[8] = {a.x * nw[0], a.y * nw[1], a.z * nw[2], a.w * nw[3],
                            b.x * nw[4], b.y * nw[5], b.z * nw[6], b.w * nw[7]};
        v = detail::pack_bf16x8(y);
      } else {
        v = __ldcg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(m.x) + at));
      }
      *reinterpret_cast<uint4*>(xs + r * stride + k) = v;
    }
  };
  if (u0 >= u1) return;
  const int C = m.chunks;
  const int t0 = static_cast<int>(u0 / C), t1 = static_cast<int>((u1 - 1) / C);
  const int c0 = static_cast<int>(u0 % C), c1 = static_cast<int>((u1 - 1) % C);
  auto k_of = [&](int c) { return min(m.K, c * kChunk); };
  if (t1 - t0 >= 2 || (t1 == t0 + 1 && c1 + 1 >= c0)) {
    load_range(0, m.K);
  } else if (t1 == t0) {
    load_range(k_of(c0), k_of(c1 + 1));
  } else {  // the end of one tile and the start of the next
    load_range(0, k_of(c1 + 1));
    load_range(k_of(c0), m.K);
  }
}

// The tile's total for (tile row r = lane, token row c = warp) once its pieces are summed, then the
// epilogue. `v` is this block's sum (valid for c < M).
template <bool kNorm>
__device__ void finish_tile(const Params& p, const Gemv& m, Work& w, int tile, float v, bool whole) {
  const int c = threadIdx.x / 32, r = threadIdx.x % 32;
  if (!whole) {
    const int64_t first_unit = static_cast<int64_t>(tile) * m.chunks, last_unit = first_unit + m.chunks - 1;
    const int g_first = block_of(first_unit, m.units, p.blocks), g_last = block_of(last_unit, m.units, p.blocks);
    auto piece = [&](int gb) {  // where block gb leaves its piece of this tile
      const bool first = tile == unit_begin(m, gb, p.blocks) / m.chunks;
      return p.tile_part + (static_cast<int64_t>(gb) * 2 + (first ? 0 : 1)) * (kTileRows * kMaxRows);
    };
    auto has_units = [&](int gb) { return unit_begin(m, gb, p.blocks) < unit_begin(m, gb + 1, p.blocks); };
    if (c < m.M) __stcg(piece(blockIdx.x) + c * kTileRows + r, v);
    consumer_sync();
    if (threadIdx.x == 0) {
      unsigned pieces = 0;
      for (int gb = g_first; gb <= g_last; ++gb) pieces += has_units(gb) ? 1u : 0u;
      fence_acq_rel();
      const bool last = atomicAdd(p.tile_count + tile, 1u) == pieces - 1;
      if (last) p.tile_count[tile] = 0;  // ready for the next stage
      fence_acq_rel();
      w.flag = last;
    }
    consumer_sync();
    if (!w.flag) return;
    if (c < m.M) {
      const float own = v;
      v = 0.0f;
      for (int gb = g_first; gb <= g_last; ++gb) {
        if (!has_units(gb)) continue;
        v += gb == static_cast<int>(blockIdx.x) ? own : ldcg_f32(piece(gb) + c * kTileRows + r);
      }
    }
  }
  if (c >= m.M) return;  // warp-uniform
  const float rinv = kNorm ? w.rinv[c] : 1.0f;
  switch (m.epilogue) {
    case kStore: {
      const int n = tile * kTileRows + r;
      if (n < m.N) {
        float y = v * rinv;
        if (m.bias) y += __bfloat162float(m.bias[n]);
        p.qkv[static_cast<int64_t>(c) * m.N + n] = __float2bfloat16_rn(y);
      }
      break;
    }
    case kLogits: {
      const int n = tile * kTileRows + r;
      if (n < m.N) p.logits[static_cast<int64_t>(c) * m.N + n] = v * rinv;
      break;
    }
    case kAddResidual: {
      const int n = tile * kTileRows + r;
      float y = 0.0f;
      if (n < m.N) {
        float* res = p.residual + static_cast<int64_t>(c) * m.N + n;
        y = ldcg_f32(res) + (m.bias ? v + __bfloat162float(m.bias[n]) : v);
        *res = y;
      }
      const float ss = detail::warp_reduce(y * y, detail::SumOp{});
      if (r == 0) p.ss_part[tile * kMaxRows + c] = ss;
      break;
    }
    default: {  // SwiGLU: lanes 0-15 gate rows, 16-31 the up rows of the same outputs
      const float up = __shfl_down_sync(0xffffffffu, v, 16);
      const int j = tile * 16 + r;
      if (r < 16 && j < m.N) {
        const float gv = round_bf16(v * rinv + (m.bias ? __bfloat162float(m.bias[j]) : 0.0f));
        const float uv = round_bf16(up * rinv + (m.bias ? __bfloat162float(m.bias[m.N + j]) : 0.0f));
        p.act[static_cast<int64_t>(c) * m.N + j] = __float2bfloat16_rn(gv / (1.0f + expf(-gv)) * uv);
      }
      break;
    }
  }
}

template <bool kNorm>
__device__ void gemv_stage(const Params& p, const Gemv& m, const uint8_t* ring, bf16* xs, uint64_t* full,
                           uint64_t* empty, Work& w, uint32_t& count) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t u0 = unit_begin(m, blockIdx.x, p.blocks), u1 = unit_begin(m, blockIdx.x + 1, p.blocks);
  if constexpr (kNorm) {  // 1 / rms of each token row, from the residual's tile sums of squares
    if (warp < m.M) {
      const int row = m.rows ? m.rows[warp] : warp;
      float ss = 0.0f;
      for (int tile = lane; tile < (p.H + kTileRows - 1) / kTileRows; tile += 32)
        ss += ldcg_f32(p.ss_part + tile * kMaxRows + row);
      ss = detail::warp_reduce(ss, detail::SumOp{});
      if (lane == 0) w.rinv[warp] = 1.0f / sqrtf(ss / static_cast<float>(p.H) + p.eps);
    }
  }
  stage_x<kNorm>(m, xs, u0, u1);
  consumer_sync();
  // Weight rows and x share one permutation of each warp's 32 columns: thread (g, t) reads the 16
  // bytes at columns 32 warp + 8 t of weight rows g, g + 8 (of each 16-row half) and of token row g;
  // words 0-1 feed the first k16 product, words 2-3 the second.
  const bool has_row = g < m.M;
  const bf16* xrow = xs + g * x_stride(m.K) + warp * 32 + 8 * t;
  const uint8_t* a_base = ring + g * (kChunk * 2) + (warp * 32 + 8 * t) * 2;
  int64_t u = u0;
  while (u < u1) {
    const int tile = static_cast<int>(u / m.chunks);
    const int64_t tile_end = static_cast<int64_t>(tile + 1) * m.chunks, run_end = min(u1, tile_end);
    const bool whole = u == static_cast<int64_t>(tile) * m.chunks && run_end == tile_end;
    float acc[2][4] = {};
    for (; u < run_end; ++u, ++count) {
      const int k0 = static_cast<int>(u % m.chunks) * kChunk, kw = min(kChunk, m.K - k0);
      const int slot = static_cast<int>(count % p.stages);
      ring_wait(&full[slot], (count / p.stages) & 1, "full");
      if (warp * 32 < kw) {
        const uint4 xv = has_row ? *reinterpret_cast<const uint4*>(xrow + k0) : uint4{};
        const uint8_t* a_slot = a_base + slot * kSlotBytes;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 lo = *reinterpret_cast<const uint4*>(a_slot + (h * 16) * (kChunk * 2));
          const uint4 hi = *reinterpret_cast<const uint4*>(a_slot + (h * 16 + 8) * (kChunk * 2));
          const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y}, a1[4] = {lo.z, hi.z, lo.w, hi.w};
          Mma<bf16>::mma(acc[h], a0, xv.x, xv.y);
          Mma<bf16>::mma(acc[h], a1, xv.z, xv.w);
        }
      }
      __syncwarp();
      if (lane == 0) hopper::mbar_arrive(&empty[slot]);
    }
    // acc[h]: rows 16 h + g (+ 8), token rows 2t, 2t + 1.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      w.gemv.red[warp][h * 16 + g][2 * t] = acc[h][0];
      w.gemv.red[warp][h * 16 + g][2 * t + 1] = acc[h][1];
      w.gemv.red[warp][h * 16 + g + 8][2 * t] = acc[h][2];
      w.gemv.red[warp][h * 16 + g + 8][2 * t + 1] = acc[h][3];
    }
    consumer_sync();
    float v = 0.0f;
    if (warp < m.M)
      for (int wv = 0; wv < kConsumerWarps; ++wv) v += w.gemv.red[wv][lane][warp];
    finish_tile<kNorm>(p, m, w, tile, v, whole);
    consumer_sync();  // red and flag free for the next run
  }
}

__device__ void embed_stage(const Params& p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int tile = blockIdx.x; tile < (p.H + kTileRows - 1) / kTileRows; tile += p.blocks) {
    if (warp >= p.T) continue;
    const int n = tile * kTileRows + lane;
    float v = 0.0f;
    if (n < p.H) {
      v = __bfloat162float(p.embed[static_cast<int64_t>(p.ids[warp]) * p.H + n]);
      p.residual[static_cast<int64_t>(warp) * p.H + n] = v;
    }
    const float ss = detail::warp_reduce(v * v, detail::SumOp{});
    if (lane == 0) p.ss_part[tile * kMaxRows + warp] = ss;
  }
}

// Shared memory: the ring's mbarriers, Work, the staged x rows (from Work's gemv member on), the ring.
static_assert(kMaxOps + 1 < 1024, "a launch's progress must stay below the next launch's base");
constexpr int kBarrierBytes = 2 * kMaxStages * 8;
constexpr int kWorkOffset = kBarrierBytes;

struct SmemLayout {
  int x_offset, ring_offset, stages, bytes;
};

// T token rows of x at most `max_k` wide, within `optin` bytes of shared memory.
SmemLayout smem_layout(int T, int max_k, int optin) {
  SmemLayout l;
  l.x_offset = kWorkOffset + static_cast<int>(offsetof(Work, gemv) + sizeof(Work::gemv) + 15) / 16 * 16;
  const int end = std::max(kWorkOffset + static_cast<int>(sizeof(Work)), l.x_offset + T * ((max_k + 31) / 32 * 32 + 8) * 2);
  l.ring_offset = (end + 127) / 128 * 128;
  l.stages = std::min(kMaxStages, (optin - l.ring_offset) / kSlotBytes);
  l.bytes = l.ring_offset + std::max(0, l.stages) * kSlotBytes;
  return l;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1) decode_step_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxStages;
  Work& w = *reinterpret_cast<Work*>(smem + kWorkOffset);
  uint8_t* ring = smem + p.ring_offset;
  bf16* xs = reinterpret_cast<bf16*>(smem + p.x_offset);
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      hopper::mbar_init(&full[s], 1);
      hopper::mbar_init(&empty[s], kConsumerWarps);
    }
    hopper::mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    producer(p, ring, full, empty);
    return;
  }
  const int n_ops = 2 + 5 * p.layers;
  uint32_t count = 0;
  if (threadIdx.x == 0) w.base = __ldcg(p.launch);
  record_time(p, 0);
  embed_stage(p);
  signal_done(p, w, 0);  // its barrier also publishes w.base
  for (int op = 1; op < n_ops; ++op) {
    wait_done(p, w, op - 1);
    if (op == n_ops - 1 || (op - 1) % 5 == 0 || (op - 1) % 5 == 3) {
      gemv_stage<true>(p, gemv_of(p, op), ring, xs, full, empty, w, count);
    } else if ((op - 1) % 5 == 1) {
      attention_stage<D>(p, p.layer[(op - 1) / 5], w);
    } else {
      gemv_stage<false>(p, gemv_of(p, op), ring, xs, full, empty, w, count);
    }
    signal_done(p, w, op);
  }
  if (threadIdx.x == 0) {  // the last block out advances the base for the next launch
    __threadfence();
    if (atomicAdd(p.launch + 1, 1ull) == static_cast<unsigned long long>(p.blocks - 1)) {
      p.launch[1] = 0;
      p.launch[0] = w.base + 1024;
      __threadfence();
    }
  }
}

// Scratch layout in bytes, 256-byte aligned sections.
struct ScratchLayout {
  int64_t progress = 0, launch = 0, tile_count = 0, attn_count = 0, ss_part = 0, tile_part = 0, attn_part = 0, total = 0;
};

ScratchLayout scratch_layout(const ops::DecodeStepShape& s, int blocks) {
  const int64_t G = s.heads / std::max(1, s.kv_heads);
  const int64_t max_tiles = std::max({detail::ceil_div(s.vocab, kTileRows),
                                      detail::ceil_div(static_cast<int64_t>(s.heads + 2 * s.kv_heads) * s.head_dim, kTileRows),
                                      detail::ceil_div(s.hidden, kTileRows), detail::ceil_div(s.intermediate, 16)});
  ScratchLayout l;
  int64_t at = 0;
  auto section = [&](int64_t bytes) {
    const int64_t start = at;
    at += (bytes + 255) / 256 * 256;
    return start;
  };
  l.progress = section(8 * int64_t(blocks));
  l.launch = section(16);
  l.tile_count = section(4 * max_tiles);
  l.attn_count = section(4 * int64_t(kMaxRows) * s.kv_heads);
  l.ss_part = section(4 * detail::ceil_div(s.hidden, kTileRows) * kMaxRows);
  l.tile_part = section(4 * int64_t(blocks) * 2 * kTileRows * kMaxRows);
  l.attn_part = section(4 * int64_t(kMaxRows) * s.kv_heads * kMaxSplits * G * (s.head_dim + 2));
  l.total = at;
  return l;
}

int max_k(const ops::DecodeStepShape& s) {
  return std::max({s.hidden, s.heads * s.head_dim, s.intermediate});
}

}  // namespace
}  // namespace decode

bool decode_step_available(CudaBackend& be, const ops::DecodeStepShape& s, DType dtype) {
  using namespace decode;
  if (!attention_device_has_wgmma(be) || dtype != DType::bf16) return false;
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, be.device().index));
  const int64_t qkv_rows = static_cast<int64_t>(s.heads + 2 * s.kv_heads) * s.head_dim;
  const bool ok = s.heads >= 1 && smem_layout(kMaxRows, max_k(s), optin).stages >= 3 && s.layers >= 1 && s.layers <= kMaxLayers && (s.head_dim == 64 || s.head_dim == 128) &&
         s.kv_heads >= 1 && s.heads % s.kv_heads == 0 && s.heads / s.kv_heads <= kMaxGroup && s.hidden % 16 == 0 &&
         s.intermediate % 16 == 0 && (static_cast<int64_t>(s.heads) * s.head_dim) % 16 == 0 && s.vocab >= 1 &&
         qkv_rows < (int64_t(1) << 30) && 2 * static_cast<int64_t>(s.intermediate) < (int64_t(1) << 30) &&
         static_cast<int64_t>(s.vocab) * s.hidden < (int64_t(1) << 40);
  if (!ok) return false;
  // Set here, never while a graph is captured: launches use at most this.
  CUDA_CHECK(cudaFuncSetAttribute(decode_step_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  CUDA_CHECK(cudaFuncSetAttribute(decode_step_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  return true;
}

int64_t decode_step_scratch_bytes(CudaBackend& be, const ops::DecodeStepShape& s) {
  return decode::scratch_layout(s, be.multiprocessor_count()).total;
}

Result<TensorBuffer> decode_step_tensor_maps(CudaBackend& be, const ops::DecodeStepModel& model) {
  using namespace decode;
  const ops::DecodeStepShape& s = model.shape;
  std::vector<CUtensorMap> maps;
  auto add = [&](const Tensor& w, int64_t rows, int64_t cols) {
    KILN_ASSERT(w.dtype == DType::bf16 && w.numel() == rows * cols && detail::aligned16(w.data));
    maps.push_back(bf16_tile_map(w.data, rows, cols, kBoxRows, kChunk, CU_TENSOR_MAP_SWIZZLE_NONE));
  };
  const int64_t qkv_rows = static_cast<int64_t>(s.heads + 2 * s.kv_heads) * s.head_dim;
  for (const ops::DecodeStepLayer& L : model.layers) {
    add(L.qkv_proj, qkv_rows, s.hidden);
    add(L.o_proj, s.hidden, static_cast<int64_t>(s.heads) * s.head_dim);
    add(L.gate_up_proj, 2 * static_cast<int64_t>(s.intermediate), s.hidden);
    add(L.down_proj, s.hidden, s.intermediate);
  }
  add(model.lm_head, s.vocab, s.hidden);
  const int64_t words = static_cast<int64_t>(maps.size() * sizeof(CUtensorMap) / 8);
  TensorBuffer host = host_empty({words}, DType::i64);
  std::memcpy(host.ptr<int64_t>(), maps.data(), maps.size() * sizeof(CUtensorMap));
  return to_device(be, host);
}

void decode_step_forward(CudaBackend& be, const ops::DecodeStepModel& model, const ops::DecodeStepIo& io) {
  using namespace decode;
  const ops::DecodeStepShape& s = model.shape;
  const int64_t T = io.ids.numel(), R = io.logit_rows.numel();
  KILN_ASSERT(ops::decode_step_takes(T, R, io.bounds));
  KILN_ASSERT(static_cast<int>(model.layers.size()) == s.layers);
  const int blocks = be.multiprocessor_count();
  const ScratchLayout sl = scratch_layout(s, blocks);
  KILN_ASSERT(io.scratch.nbytes() >= sl.total && io.residual.dtype == DType::f32 && io.logits.dtype == DType::f32);
  KILN_ASSERT(io.residual.size(-1) == s.hidden && io.residual.numel() >= T * s.hidden);
  KILN_ASSERT(io.qkv.numel() >= T * (s.heads + 2 * s.kv_heads) * s.head_dim && io.attn.numel() >= T * s.heads * s.head_dim);
  KILN_ASSERT(io.act.numel() >= T * s.intermediate && io.logits.numel() >= R * s.vocab);
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, be.device().index));

  Params p{};
  p.layers = s.layers, p.T = static_cast<int>(T), p.R = static_cast<int>(R), p.B = io.bounds.batch;
  p.H = s.hidden, p.I = s.intermediate, p.Hq = s.heads, p.Hkv = s.kv_heads, p.D = s.head_dim, p.V = s.vocab;
  p.page_size = io.kv.page_size;
  p.blocks = blocks;
  const SmemLayout sm = smem_layout(static_cast<int>(T), max_k(s), optin);
  KILN_ASSERT(sm.stages >= 3);
  p.stages = sm.stages, p.x_offset = sm.x_offset, p.ring_offset = sm.ring_offset;
  const int64_t pairs = static_cast<int64_t>(io.bounds.batch) * s.kv_heads;
  p.num_splits = static_cast<int>(std::clamp<int64_t>(detail::ceil_div(2 * blocks, pairs), 1,
                                                      std::min<int64_t>(kMaxSplits, detail::ceil_div(io.bounds.max_kv_len, 64))));
  p.eps = model.eps;
  p.scale_log2 = 1.4426950408889634f / std::sqrt(static_cast<float>(s.head_dim));
  p.rope_scaling = model.attention_scaling;
  p.ids = io.ids.ptr<const int32_t>(), p.positions = io.positions.ptr<const int32_t>();
  p.slots = io.slots.ptr<const int32_t>(), p.q_indptr = io.q_indptr.ptr<const int32_t>();
  p.logit_rows = io.logit_rows.ptr<const int32_t>();
  p.page_indptr = io.kv.page_indptr.ptr<const int32_t>(), p.page_indices = io.kv.page_indices.ptr<const int32_t>();
  p.last_page_len = io.kv.last_page_len.ptr<const int32_t>();
  auto w = [](const Tensor& t) { return t.data ? static_cast<const bf16*>(t.data) : nullptr; };
  p.embed = w(model.embed), p.final_norm = w(model.final_norm), p.lm_head = w(model.lm_head);
  KILN_ASSERT(model.tensor_maps.nbytes() >= static_cast<int64_t>(sizeof(CUtensorMap)) * (4 * s.layers + 1));
  p.maps = static_cast<const CUtensorMap*>(model.tensor_maps.data);
  p.inv_freq = model.inv_freq.ptr<const float>();
  p.residual = io.residual.ptr<float>(), p.qkv = static_cast<bf16*>(io.qkv.data), p.attn = static_cast<bf16*>(io.attn.data);
  p.act = static_cast<bf16*>(io.act.data), p.logits = io.logits.ptr<float>();
  uint8_t* scratch = static_cast<uint8_t*>(io.scratch.data);
  p.progress = reinterpret_cast<unsigned long long*>(scratch + sl.progress);
  p.launch = reinterpret_cast<unsigned long long*>(scratch + sl.launch);
  p.tile_count = reinterpret_cast<unsigned*>(scratch + sl.tile_count);
  p.attn_count = reinterpret_cast<unsigned*>(scratch + sl.attn_count);
  p.ss_part = reinterpret_cast<float*>(scratch + sl.ss_part);
  p.tile_part = reinterpret_cast<float*>(scratch + sl.tile_part);
  p.attn_part = reinterpret_cast<float*>(scratch + sl.attn_part);
  if (io.timings.data) {
    KILN_ASSERT(io.timings.dtype == DType::i64 && io.timings.numel() >= int64_t(3 + 5 * s.layers) * blocks);
    p.timings = static_cast<unsigned long long*>(io.timings.data);
  }
  KILN_ASSERT(io.k_cache && io.v_cache && static_cast<int>(io.k_cache->size()) == s.layers &&
              static_cast<int>(io.v_cache->size()) == s.layers);
  for (int l = 0; l < s.layers; ++l) {
    const ops::DecodeStepLayer& L = model.layers[l];
    const Tensor k_cache = (*io.k_cache)[l].view(), v_cache = (*io.v_cache)[l].view();
    for (const Tensor* t : {&L.qkv_proj, &L.o_proj, &L.gate_up_proj, &L.down_proj})
      KILN_ASSERT(t->dtype == DType::bf16 && detail::aligned16(t->data));
    KILN_ASSERT(k_cache.dtype == DType::bf16 && k_cache.size(-1) == s.head_dim && v_cache.shape == k_cache.shape);
    p.layer[l] = LayerPtrs{w(L.input_norm), w(L.qkv_proj), w(L.qkv_bias), w(L.q_norm), w(L.k_norm), w(L.o_proj),
                           w(L.o_bias), w(L.post_norm), w(L.gate_up_proj), w(L.gate_up_bias), w(L.down_proj),
                           w(L.down_bias), static_cast<bf16*>(k_cache.data), static_cast<bf16*>(v_cache.data)};
  }
  KILN_ASSERT(detail::aligned16(p.lm_head));

  const int smem = sm.bytes;
  auto kernel = s.head_dim == 64 ? decode_step_kernel<64> : decode_step_kernel<128>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = detail::stream_of(be);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
}

}  // namespace kiln::cuda
