// The decode / short-query split-KV kernel (family 1 of attention.cu's description), with the host
// choice of its blocks per SM and split count; the combine pass of its splits is attention_combine.cu.
#include <cooperative_groups.h>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/programmatic_launch.cuh"
#include "kernels/ops.h"

namespace kiln::cuda::attn {
namespace {

// ------------------------------------------------------------------------------------------------
// 1. Decode / short-query split-KV kernel.
//
// A block takes 16 query rows (the G heads of one request's queries that share a KV head) and one
// split of their keys. Its K/V rows stream through a ring of NS shared-memory stages of
// kStageKeys keys, filled by cp.async from the paged pool (each thread copies one 16-byte chunk of
// every RS-th row, looking up its own rows' pages a stage ahead), so that NS - 1 stages of every
// block are in flight while one is computed: a decode step is bound by reading the cache, and a
// block of a few warps keeps more bytes in flight this way than in registers. Warp w computes the
// 16 keys w * 16.. of each stage (mma m16n8k16: Q in registers, K and V by ldmatrix from the
// swizzled tiles), keeping its own running max, sum and output; the warps' states meet at the end.
//
// Fragment layouts (g = lane / 4, t = lane % 4): Q's A fragment holds rows g, g + 8 at dims
// 16 kk + 2t (+1, +8, +9); S [16 rows x 16 keys] is two n8 tiles; P (S's C fragment) is PV's A
// fragment; output n tile i holds dims 8 i + 2t, 8 i + 2t + 1 of rows g, g + 8.
constexpr int kStageKeys = kWarps * 16;

// Three stages: two in flight while one is computed (more in flight measured no faster; the block
// count per SM matters more, and the host sets it through the shared memory it asks for).
constexpr int kStages = 3;

template <int D>
struct DecodeRing {
  static constexpr int kTileElems = kStageKeys * D;  // one K or V tile of a stage
  static constexpr int kAccStride = D + 4;           // floats per row of the merge tiles
  // The ring; after the loop the same bytes hold the warps' outputs.
  static constexpr int kSmem = std::max(kStages * 2 * kTileElems * 2, kWarps * 16 * kAccStride * 4);
};

constexpr int kDecodeMinKeysPerSplit = 64;

// The splits merged inside the decode kernel, through distributed shared memory (a cluster of one
// block per split): two (prefer_merged_pair says why).
constexpr int kClusterMergeMaxSplits = 2;

// kMerge: the splits of a tile are one cluster, merged in the kernel (below); otherwise a single
// split writes the output and more write partials for the combine pass. kInput: the block makes
// its queries from the q/k/v projection's rows and the block holding the new key writes it and its
// value to the cache (DecodeInput; one query per request, one row tile), so that no kernel of its
// own runs between the projection and the attention.
// At most 128 registers for D=64, so that 4 blocks fit an SM (the host asks for 2, 3 or 4 through the
// shared memory; a register cap, not __launch_bounds__, whose block hint was once suspected of
// slowing small batches: perf-notes says what did).
template <typename T, int D, bool kMerge, bool kInput>
__global__ void __maxnreg__(D == 64 ? 128 : 255)
    attn_decode_kernel(T* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_lse,
                       const T* __restrict__ q, T* __restrict__ k_cache, T* __restrict__ v_cache,
                       const int* __restrict__ q_indptr, PagedArgs kv, int Hq, int Hkv, int G, int max_q_len,
                       int num_splits, float sl, DecodeInput in) {
  using Ring = DecodeRing<D>;
  constexpr int NS = kStages;
  constexpr int NT = D / 8;           // PV n tiles
  constexpr int KS = D / 16;          // QK k steps
  constexpr int NC = D / 8;           // 16-byte chunks per K/V row
  constexpr int RS = kThreads / NC;   // rows one pass of the block's copies covers
  constexpr int kPasses = kStageKeys / RS;
  constexpr int kAcc = Ring::kAccStride;
  static_assert(kThreads % NC == 0 && RS % 8 == 0 && kStageKeys % RS == 0, "copy mapping");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* const ring = reinterpret_cast<T*>(smem_raw);  // stage s: K tile, then V tile
  auto sm_acc = reinterpret_cast<float (*)[16][kAcc]>(smem_raw);                      // [kWarps], after the loop
  __shared__ float sm_m[kWarps][16];
  __shared__ float sm_l[kWarps][16];
  __shared__ __align__(16) T sm_q[kInput ? 16 : 1][D];  // kInput: the tile's rotated query rows
  hopper::launch_dependents();  // a programmatically launched consumer may start its weight stream
  if constexpr (kMerge) hopper::cluster_arrive_relaxed();  // this block has started (waited for in the merge)

  const int split = blockIdx.x;
  const int kvh = blockIdx.y % Hkv;
  const int rt = blockIdx.y / Hkv;
  const int b = blockIdx.z;
  const int q_start = q_indptr[b];  // (the step's inputs: copied before the step's first kernel)
  const int q_len = q_indptr[b + 1] - q_start;
  const int rows = q_len * G;
  const int r0 = rt * 16;
  if (r0 >= rows) {  // every block of a request without queries (padding) exits here
    hopper::grid_dependency_wait();
    return;
  }
  const int kv_len = request_kv_len(kv, b);
  const PagedKeys keys = request_keys(kv, b);

  const int delta = kv_len - q_len;  // position of query i is delta + i
  const int i_max = min(q_len - 1, (r0 + 15) / G);
  const int n_keys = max(0, min(kv_len, delta + i_max + 1));
  // The key partition depends only on n_keys and min(num_splits, ceil(n_keys / 64)), so calls whose
  // bounds differ only in max_kv_len (eager vs. a graph captured for a larger context) split alike
  // and give bit-identical results.
  const int steps_total = (n_keys + 15) / 16;
  const int active_splits = min(num_splits, max(1, (n_keys + kDecodeMinKeysPerSplit - 1) / kDecodeMinKeysPerSplit));
  const int steps_per_split = (steps_total + active_splits - 1) / active_splits;
  const int key_begin = split * steps_per_split * 16;
  const int key_end = min(n_keys, key_begin + steps_per_split * 16);
  const int n_steps = key_end > key_begin ? (key_end - key_begin + 15) / 16 : 0;
  const int n_stages = (n_steps + kWarps - 1) / kWarps;

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int kv_stride = Hkv * D;  // elements per pool row (row * kv_stride: one widening multiply)

  // Copies: thread tid brings chunk tc of the stage rows tr0 + i * RS (i < kPasses); the page ids
  // of those rows' keys are read one stage ahead (pid), so that the page-table latency hides behind
  // a stage of compute. Rows past the split's keys are zero-filled (never read from the pool).
  const int tr0 = tid / NC, tc = tid % NC;
  const T* const k_chunk = k_cache + static_cast<int64_t>(kvh) * D + tc * 8;
  const T* const v_chunk = v_cache + static_cast<int64_t>(kvh) * D + tc * 8;
  int pid[kPasses];
  auto fetch_pages = [&](int stage) {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int key = key_begin + stage * kStageKeys + tr0 + i * RS;
      pid[i] = key < key_end ? keys.page_id(keys.page(key)) : 0;
    }
  };
  auto issue = [&](int stage) {  // one commit group per stage, empty past the last
    if (stage < n_stages) {
      T* const sk = ring + (stage % NS) * 2 * Ring::kTileElems;
      T* const sv = sk + Ring::kTileElems;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const int r = tr0 + i * RS;
        const int key = key_begin + stage * kStageKeys + r;
        const bool ok = key < key_end;
        const int row = pid[i] * keys.size + (key - keys.page(key) * keys.size);
        const int64_t off = ok ? row_offset(row, kv_stride) : 0;
        cp_async16(smem_u32(sk + swz<D>(r, tc)), k_chunk + off, ok);
        cp_async16(smem_u32(sv + swz<D>(r, tc)), v_chunk + off, ok);
      }
      fetch_pages(stage + 1);
    }
    cp_async_commit();
  };
  // The first NS - 1 stages. Those holding only keys cached before this step (below delta) are
  // issued before the wait for the kernel that wrote q and the new keys, so that they overlap its
  // tail (the pool rows of older keys and the page table are not written during the step).
  fetch_pages(0);
  int issued = 0;
  while (issued < NS - 1 && key_begin + (issued + 1) * kStageKeys <= delta) issue(issued++);
  // kInput: the new token's slot and this lane's rotations (the same for every head of the token),
  // from the step's inputs and the model's frequencies, before the wait: the double-precision
  // sincos leaves the path from the q/k/v projection's end to the first stage's compute.
  constexpr int P = D / 32;  // elements of a head row a lane holds (lane + 32 j)
  int slot = -1;
  float2 cs[P / 2];
  if constexpr (kInput) {
    slot = in.slots[q_start];
    const float pos = static_cast<float>(in.positions[q_start]);
#pragma unroll
    for (int j = 0; j < P / 2; ++j) cs[j] = detail::rope_cos_sin(pos, in.inv_freq[lane + 32 * j], in.scaling);
  }
  hopper::grid_dependency_wait();
  if constexpr (kInput) {
    // The input stage of the request's one query token (qkv_rope_cache_write's arithmetic): warp w
    // takes heads w, w + 4, .. of the tile's G query heads (rotated into sm_q), then its KV head's
    // key and value (into the pool, by the block whose split holds the new key). Lane l holds
    // elements l + 32 j of a row; the rotation pairs (i, i + D/2) are x[j], x[j + P/2]. (A
    // non-inlined function for it measured slower: astrai-1b B=128 at 1K 2.183 ms per step
    // against 2.096 inlined.)
    const int tok = q_start;
    const bool writes_kv = slot >= 0 && key_begin <= delta && delta < key_end;  // the new key's split
    const T* row = static_cast<const T*>(in.qkv) + static_cast<int64_t>(tok) * (Hq + 2 * Hkv) * D;
    const DType dt = std::is_same_v<T, __nv_bfloat16> ? DType::bf16 : DType::f16;
    for (int hl = warp; hl < G + 2; hl += kWarps) {
      const bool is_q = hl < G, is_k = hl == G;
      if (!is_q && !writes_kv) continue;  // uniform over the warp
      const int h = is_q ? kvh * G + hl : (is_k ? Hq + kvh : Hq + Hkv + kvh);
      float x[P];
#pragma unroll
      for (int j = 0; j < P; ++j) x[j] = static_cast<float>(row[h * D + lane + 32 * j]);
      const int64_t dst = (static_cast<int64_t>(slot) * Hkv + kvh) * D;
      if (!is_q && !is_k) {
#pragma unroll
        for (int j = 0; j < P; ++j) v_cache[dst + lane + 32 * j] = static_cast<T>(x[j]);
        continue;
      }
      const void* w = is_q ? in.q_norm : in.k_norm;
      if (w) detail::head_rms_norm(x, D, lane, w, is_q ? in.q_norm_dt : in.k_norm_dt, dt, in.eps);
#pragma unroll
      for (int j = 0; j < P / 2; ++j) {
        const int i = lane + 32 * j;
        const float2 rot = detail::rope_rotate(x[j], x[j + P / 2], cs[j]);
        T* const dst_row = is_q ? &sm_q[hl][0] : k_cache + dst;
        dst_row[i] = static_cast<T>(rot.x);
        dst_row[i + D / 2] = static_cast<T>(rot.y);
      }
    }
    __syncthreads();  // the query rows in shared memory, the new key and value in the pool
  }
  while (issued < NS - 1) issue(issued++);

  // This thread's query rows (tile rows g and g+8), their key limits, and Q's A fragments.
  int lim[2];
  uint32_t qa[KS][4];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int R = r0 + g + 8 * hf;
    const int i = R / G;
    const int hq = kvh * G + (R - i * G);
    const bool valid = R < rows;
    lim[hf] = valid ? min(key_end, delta + i + 1) : 0;
    const T* qrow = kInput ? &sm_q[valid ? R - r0 : 0][2 * t]
                           : q + (static_cast<int64_t>(q_start + (valid ? i : 0)) * Hq + hq) * D + 2 * t;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      qa[kk][hf] = valid ? *reinterpret_cast<const uint32_t*>(qrow + kk * 16) : 0u;
      qa[kk][2 + hf] = valid ? *reinterpret_cast<const uint32_t*>(qrow + kk * 16 + 8) : 0u;
    }
  }

  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};

  // This warp's 16 keys of a stage: key0 = key_begin + step * 16 (step = stage * kWarps + warp).
  auto compute = [&](const T* sk, const T* sv, int step) {
    const int key0 = key_begin + step * 16;
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint32_t bk[4];
      const int r = warp * 16 + (lane & 7) + (lane >> 4) * 8;
      ldmatrix_x4(bk, smem_u32(sk + swz<D>(r, 2 * kk + ((lane >> 3) & 1))));
      Mma<T>::mma(s[0], qa[kk], bk[0], bk[1]);
      Mma<T>::mma(s[1], qa[kk], bk[2], bk[3]);
    }
    // Mask keys at or past each row's limit (causal position and end of this split).
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + nt * 8 + 2 * t + (e & 1);
        if (key >= lim[e >> 1]) s[nt][e] = -INFINITY;
      }
      // Online softmax (rows g: elements 0,1; row g+8: elements 2,3).
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = fmaxf(fmaxf(s[0][2 * hf], s[0][2 * hf + 1]), fmaxf(s[1][2 * hf], s[1][2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[hf], mx * sl);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = fast_exp2(m[hf] - m_use);
      m[hf] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = fast_exp2(fmaf(s[nt][2 * hf + e], sl, -m_use));
          s[nt][2 * hf + e] = p;
          sum += p;
        }
      l[hf] = l[hf] * alpha + sum;
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        acc[i][2 * hf] *= alpha;
        acc[i][2 * hf + 1] *= alpha;
      }
    }
    const uint32_t pa[4] = {Mma<T>::pack(s[0][0], s[0][1]), Mma<T>::pack(s[0][2], s[0][3]),
                            Mma<T>::pack(s[1][0], s[1][1]), Mma<T>::pack(s[1][2], s[1][3])};
    // bf16 keeps 8 bits of P; decode is bound by memory, not by the tensor cores, so P is carried
    // as hi + lo (the rounding error, rounded again) in two products: ~16 bits, at no visible cost.
    constexpr bool kSplitP = std::is_same_v<T, __nv_bfloat16>;
    uint32_t pl[4] = {0, 0, 0, 0};
    if constexpr (kSplitP) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float* src = &s[w >> 1][(w & 1) * 2];
        const float hi_first = __uint_as_float(pa[w] << 16), hi_second = __uint_as_float(pa[w] & 0xffff0000u);
        pl[w] = Mma<T>::pack(src[0] - hi_first, src[1] - hi_second);
      }
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t bv[4];
      const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      ldmatrix_x4_trans(bv, smem_u32(sv + swz<D>(r, 2 * dp + (lane >> 4))));
      Mma<T>::mma(acc[2 * dp], pa, bv[0], bv[1]);
      Mma<T>::mma(acc[2 * dp + 1], pa, bv[2], bv[3]);
      if constexpr (kSplitP) {
        Mma<T>::mma(acc[2 * dp], pl, bv[0], bv[1]);
        Mma<T>::mma(acc[2 * dp + 1], pl, bv[2], bv[3]);
      }
    }
  };

  // Stage s is complete once at most NS - 2 later groups are pending; the barrier also says every
  // warp is done with stage s - 1, whose buffer the copies of stage s + NS - 1 then refill.
  for (int st = 0; st < n_stages; ++st) {
    cp_async_wait<NS - 2>();
    __syncthreads();
    issue(st + NS - 1);
    const int step = st * kWarps + warp;
    const T* sk = ring + (st % NS) * 2 * Ring::kTileElems;
    if (step < n_steps) compute(sk, sk + Ring::kTileElems, step);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring's bytes become the merge tiles

  // Merge the four warps' states through shared memory.
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
  }
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1);
      const int dim = i * 8 + 2 * t + (e & 1);
      sm_acc[warp][row][dim] = acc[i][e];
    }
  if (t == 0) {
    sm_m[warp][g] = m[0];
    sm_m[warp][g + 8] = m[1];
    sm_l[warp][g] = l[0];
    sm_l[warp][g + 8] = l[1];
  }
  __syncthreads();

  constexpr int kDimsPerThread = D / 8;  // 16 rows x 8 threads
  const int r = tid >> 3;
  const int d0 = (tid & 7) * kDimsPerThread;
  const int R = r0 + r;
  if (!kMerge && R >= rows) return;  // (cluster ranks stay for the merge's barriers)
  const bool row_valid = R < rows;
  const int i = row_valid ? R / G : 0;
  const int hq = kvh * G + (R - i * G);
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][r]);
  float wt[kWarps];
  float L = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float mw = sm_m[w][r];
    wt[w] = mw == -INFINITY ? 0.0f : fast_exp2(mw - M);
    L += wt[w] * sm_l[w][r];
  }
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  float o[kDimsPerThread];
#pragma unroll
  for (int d = 0; d < kDimsPerThread; d += 4) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 a = *reinterpret_cast<const float4*>(&sm_acc[w][r][d0 + d]);
      sum.x += wt[w] * a.x;
      sum.y += wt[w] * a.y;
      sum.z += wt[w] * a.z;
      sum.w += wt[w] * a.w;
    }
    o[d] = sum.x * inv;
    o[d + 1] = sum.y * inv;
    o[d + 2] = sum.z * inv;
    o[d + 3] = sum.w * inv;
  }
  const float lse = L > 0.0f ? M + log2f(L) : -INFINITY;
  auto store_out = [&](const float* v) {
    T* dst = out + (static_cast<int64_t>(q_start + i) * Hq + hq) * D + d0;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; d += 8) {
      uint4 u;
      u.x = Mma<T>::pack(v[d], v[d + 1]);
      u.y = Mma<T>::pack(v[d + 2], v[d + 3]);
      u.z = Mma<T>::pack(v[d + 4], v[d + 5]);
      u.w = Mma<T>::pack(v[d + 6], v[d + 7]);
      *reinterpret_cast<uint4*>(dst + d) = u;
    }
  };
  if (num_splits == 1) {
    if (row_valid) store_out(o);
  } else if constexpr (kMerge) {
    // The splits of this tile are the blocks of one cluster (rank = split; num_splits is
    // kClusterMergeMaxSplits here), and rank s finishes the rows r with r % num_splits == s. Each
    // block stores its normalised output and log-sum-exp of the rows it does not finish into their
    // finisher's inbox (distributed shared memory: remote stores, no round trip, after the wait for
    // the start barrier every block arrived on at the kernel's start) and keeps its own
    // rows' in registers; after one cluster barrier no block touches another's shared memory, so each
    // finishes its rows and exits on its own. The finisher adds every active split's share in split
    // order (weights 2^(lse - max), the largest exactly 1): the sums depend only on the active splits,
    // so calls that differ in num_splits alone agree bit for bit, and a single active split passes
    // through. Measured against remote loads between two barriers in docs/perf-notes.md.
    static_assert(kClusterMergeMaxSplits == 2, "a finisher's inbox holds its one partner's rows");
    constexpr int kInboxRows = 16 / kClusterMergeMaxSplits;
    __shared__ __align__(16) float inbox_o[kInboxRows][D];
    __shared__ float inbox_lse[kInboxRows];
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int finisher = r % kClusterMergeMaxSplits;
    hopper::cluster_wait();  // the partner has started: its inbox may be written
    if (finisher != split) {
      float* dst = cluster.map_shared_rank(&inbox_o[r / kClusterMergeMaxSplits][d0], finisher);
#pragma unroll
      for (int d = 0; d < kDimsPerThread; d += 4)
        *reinterpret_cast<float4*>(dst + d) = make_float4(o[d], o[d + 1], o[d + 2], o[d + 3]);
      if ((tid & 7) == 0) *cluster.map_shared_rank(&inbox_lse[r / kClusterMergeMaxSplits], finisher) = lse;
    }
    cluster.sync();
    if (row_valid && finisher == split) {
      const float* theirs = &inbox_o[r / kClusterMergeMaxSplits][d0];
      float lses[kClusterMergeMaxSplits];
      float mx = -INFINITY;
#pragma unroll
      for (int s = 0; s < kClusterMergeMaxSplits; ++s) {
        lses[s] = s >= active_splits ? -INFINITY : s == split ? lse : inbox_lse[r / kClusterMergeMaxSplits];
        mx = fmaxf(mx, lses[s]);
      }
      float den = 0.0f, acc_o[kDimsPerThread];
#pragma unroll
      for (int d = 0; d < kDimsPerThread; ++d) acc_o[d] = 0.0f;
#pragma unroll
      for (int s = 0; s < kClusterMergeMaxSplits; ++s) {
        if (lses[s] == -INFINITY) continue;  // inactive or empty split
        const float w = lses[s] == mx ? 1.0f : exp2f(lses[s] - mx);
        den += w;
#pragma unroll
        for (int d = 0; d < kDimsPerThread; ++d) acc_o[d] = fmaf(w, s == split ? o[d] : theirs[d], acc_o[d]);
      }
      const float inv_den = den > 0.0f ? 1.0f / den : 0.0f;
#pragma unroll
      for (int d = 0; d < kDimsPerThread; ++d) acc_o[d] *= inv_den;
      store_out(acc_o);
    }
  } else if (row_valid) {
    const int64_t idx = ((static_cast<int64_t>(b) * max_q_len + i) * Hq + hq) * num_splits + split;
    float* dst = part_o + idx * D + d0;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; d += 4)
      *reinterpret_cast<float4*>(dst + d) = make_float4(o[d], o[d + 1], o[d + 2], o[d + 3]);
    if ((tid & 7) == 0) part_lse[idx] = lse;
  }
}

// Shared memory of each SM left to the neighbouring kernels' blocks. Under programmatic launch the
// blocks of the kernel before (q/k/v) are still resident when the decode blocks arrive, and the
// next kernel's arrive while they run; a decode grid sized for slots those blocks hold waits for
// them in a second wave. Asking 112 KB per block for 2 per SM (no room left) cost 0.27 ms per
// step at B = 1 and 8 (astrai-1b, 1K: 1.186 / 1.303 against 0.918 / 1.037), serial launches equal;
// with this much left it costs nothing (docs/perf-notes.md).
constexpr int kNeighbourSmem = 32 * 1024;

// The dynamic shared memory to ask for so that `blocks` decode blocks share an SM with
// kNeighbourSmem to spare (at least the kernel's own `min_bytes`; beyond them as much as leaves no
// room for one more block), and how many are then resident (occupancy query), on the backend's
// device; computed once per backend.
std::pair<int, int> decode_fit(CudaBackend& be, const void* kernel, int min_bytes, int blocks) {
  AttentionState& st = state_of(be);
  const std::pair<const void*, int> key{kernel, blocks};
  auto it = st.decode_fit.find(key);
  if (it != st.decode_fit.end()) return it->second;
  int per_sm = 0, reserved = 0, optin = 0, n = 0;
  cudaFuncAttributes fa{};
  with_device(st.device, [&] {
    CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, st.device));
    CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, st.device));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, st.device));
    CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));
  });
  const int room = optin - static_cast<int>(fa.sharedSizeBytes);
  const int fill =
      ((per_sm - kNeighbourSmem) / std::max(blocks, 1) - reserved - static_cast<int>(fa.sharedSizeBytes)) / 128 * 128;
  const int smem = std::min(std::max(fill, min_bytes), std::max(room, min_bytes));
  attention_allow_smem(be, kernel, smem);
  with_device(st.device, [&] { CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem)); });
  const std::pair<int, int> fit{smem, std::max(n, 1)};
  st.decode_fit.emplace(key, fit);
  return fit;
}

// Splits so that the decode grid fills whole waves of resident blocks, within two waves: from
// floor(W / base) (at least 1) up to 2W / base, the count whose last wave is fullest (fewest splits
// on ties). astrai-1b (4 KV heads) B=32 at 2 blocks per SM (base 128, W 264): 2 splits, one
// wave (merged in the kernel); B=64: 1 (0.97 waves); B=128 at 4 per SM (W 528): 1. Grids
// of two waves and more keep one split: the combine pass costs more there than the last wave's
// idle slots (measured: three splits at B=256 took 10% longer). Without the length cap this is the
// most any max_kv_len can ask for (used to size the scratch).
int decode_max_splits(int base_blocks, int sm_count, int blocks_per_sm) {
  const int target = blocks_per_sm * std::max(sm_count, 1);
  const int lo = std::clamp(target / base_blocks, 1, kDecodeMaxSplits);
  const int hi = std::clamp(2 * target / base_blocks, lo, kDecodeMaxSplits);
  int best = lo;
  double best_eff = 0.0;
  for (int s = lo; s <= hi; ++s) {
    const double waves = static_cast<double>(base_blocks) * s / target;
    const double eff = waves / std::ceil(waves);
    if (eff > best_eff + 0.02) best = s, best_eff = eff;
  }
  return best;
}

int decode_num_splits(int max_splits, int max_kv_len) {
  const int by_len = std::max(1, (max_kv_len + kDecodeMinKeysPerSplit - 1) / kDecodeMinKeysPerSplit);
  return std::clamp(by_len, 1, max_splits);
}

// Two splits merged inside the kernel (a cluster of two blocks) in place of more splits and the
// combine pass, once two splits make at least half a wave. Measured on the H200 (bench_decode_step,
// astrai-1b, 1K context, ms per step), B=32: 2 splits merged 1.496, 3 splits and the combine pass
// 1.531, 2 splits and the combine pass 1.556; merging 3, 4 or 8 splits in clusters was slower at
// every batch size (B=32: 1.662, 1.628, 1.751). D=128 follows the same rule unmeasured.
int prefer_merged_pair(int max_splits, int base_blocks, int sm_count, int blocks_per_sm) {
  return max_splits > 2 && 4 * base_blocks >= std::max(sm_count, 1) * blocks_per_sm ? 2 : max_splits;
}

template <typename T, int D, bool kInput>
void launch_decode_d(CudaBackend& be, const Args& a, int max_splits, int smem) {
  const int row_tiles = (a.max_q_len * a.G + 15) / 16;
  const int splits = decode_num_splits(max_splits, a.max_kv_len);
  // Two splits are merged inside the kernel (a cluster of two blocks), more by the combine pass
  // (prefer_merged_pair): B=64 in two splits took 1.749 ms per step merged in clusters against
  // 1.892 with the combine pass. The choice depends on the launch shape only, never on max_kv_len,
  // so eager calls and graphs captured with larger bounds agree bit for bit.
  const bool merge_in_cluster = max_splits == kClusterMergeMaxSplits;
  auto kernel = merge_in_cluster ? attn_decode_kernel<T, D, true, kInput> : attn_decode_kernel<T, D, false, kInput>;
  attention_allow_smem(be, kernel_key(kernel), smem);
  float* part_o = nullptr;
  float* part_lse = nullptr;
  if (splits > 1 && !merge_in_cluster) {
    // Sized for max_splits, not splits: the scratch request does not depend on max_kv_len, so
    // graphs captured for different context buckets never make the scratch grow (and move).
    const int64_t n_part = static_cast<int64_t>(a.B) * a.max_q_len * a.Hq * max_splits;
    const int64_t bytes = n_part * D * 4 + n_part * 4;
    char* scratch = static_cast<char*>(be.scratch(bytes));
    part_o = reinterpret_cast<float*>(scratch);
    part_lse = reinterpret_cast<float*>(scratch + n_part * D * 4);
  }
  const dim3 grid(splits, a.Hkv * row_tiles, a.B);
  const dim3 cluster(splits > 1 && merge_in_cluster ? splits : 1);
  detail::launch_programmatic(be, kernel, grid, dim3(kThreads), smem, cluster, static_cast<T*>(a.out), part_o,
                              part_lse, static_cast<const T*>(a.q), static_cast<T*>(const_cast<void*>(a.k)),
                              static_cast<T*>(const_cast<void*>(a.v)), a.q_indptr, a.kv, a.Hq, a.Hkv, a.G, a.max_q_len,
                              splits, a.sl, a.input);
  if (splits > 1 && !merge_in_cluster) {
    launch_decode_combine<T>(be, static_cast<T*>(a.out), part_o, part_lse, a.q_indptr, a.B, a.max_q_len, a.Hq, D,
                             splits);
  }
}

// A decode grid at some blocks per SM: the shared memory each block asks for (decode_fit), the
// blocks then resident per SM, and the splits before the length cap.
struct DecodeLayout {
  int smem = 0;
  int blocks_per_sm = 0;
  int max_splits = 0;
};

template <typename T, int D>
DecodeLayout decode_layout(CudaBackend& be, int base_blocks, int blocks) {
  const int sms = be.multiprocessor_count();
  const auto [smem, resident] =
      decode_fit(be, kernel_key(attn_decode_kernel<T, D, true, false>), DecodeRing<D>::kSmem, blocks);
  const int splits = decode_max_splits(base_blocks, sms, resident);
  return {smem, resident, prefer_merged_pair(splits, base_blocks, sms, resident)};
}

// Blocks per SM: of 2, 3 and 4 (those the shared memory allows: D=128's 96 KB ring only 2), the
// one whose grid (base_blocks times its splits) fills its waves of resident slots best; on equal
// fill the fewer waves, then the fewer blocks per SM. Like the splits, it depends on the launch
// shape only. At 4 per SM the blocks take the whole register file, so no block of the kernel
// before can stay beside them: that count is left out where the q/k/v projection before is the
// fused small-batch kernel (at most ops::kNormLinearMaxRows rows), whose blocks are still resident
// under programmatic launch (B=8 on 4 per SM in two full waves took 1.313 ms against 1.021 on 2 per
// SM; from 40 rows on it measured no loss). Measured (bench_decode_step, astrai-1b, 1K, ms
// per step with programmatic launch, two alternations in one call; each count forced; the best
// is the rule's choice everywhere):
//   B      40     48     64     80     96     112    128    160    192
//   2    1.702  1.565  1.604  1.989  2.033  2.106  2.202  2.606  2.812
//   3    1.543  1.552  1.794  1.789  1.885  2.220  2.341  2.494  2.740
//   4    1.569  1.575  1.648  1.992  1.962  2.073  2.159  2.718  2.838
// (the rule before, 4 per SM once one split filled 90% of their wave and else 2, took 1.702 /
// 1.564 / 1.605 / 1.988 / 2.032 / 2.104 / 2.160 / 2.719 / 2.839). Against that rule in another
// call: equal at B = 1 to 32, 64, 128 and 256 but for B=24 (1.460 against 1.428: 3 per SM, four
// splits and the combine pass, where 2 per SM merged two); at 30K B=24 5.446 against 6.210;
// llama-1b 1K B = 48 / 96 1.465 / 1.926 against 1.563 / 1.985.
template <typename T, int D>
DecodeLayout choose_decode_layout(CudaBackend& be, int base_blocks, int64_t rows) {
  const int64_t sms = be.multiprocessor_count();
  const int max_blocks = rows > ops::kNormLinearMaxRows ? 4 : 3;
  // fill = grid / (waves * slots); 2 per SM (or what the device gives for it) is the start.
  auto grid_of = [&](const DecodeLayout& l) { return static_cast<int64_t>(base_blocks) * l.max_splits; };
  DecodeLayout best = decode_layout<T, D>(be, base_blocks, 2);
  int64_t best_grid = grid_of(best), best_slots = sms * best.blocks_per_sm;
  int64_t best_waves = (best_grid + best_slots - 1) / best_slots;
  for (int blocks = 3; blocks <= max_blocks; ++blocks) {
    const DecodeLayout l = decode_layout<T, D>(be, base_blocks, blocks);
    if (l.blocks_per_sm != blocks) continue;
    const int64_t grid = grid_of(l), slots = sms * blocks, waves = (grid + slots - 1) / slots;
    const int64_t lhs = grid * best_waves * best_slots, rhs = best_grid * waves * slots;
    if (lhs > rhs || (lhs == rhs && waves < best_waves))
      best = l, best_grid = grid, best_slots = slots, best_waves = waves;
  }
  return best;
}

}  // namespace

template <typename T>
void launch_decode(CudaBackend& be, const Args& a) {
  const int row_tiles = (a.max_q_len * a.G + 15) / 16;
  const int base_blocks = a.B * a.Hkv * row_tiles;
  const int64_t rows = static_cast<int64_t>(a.B) * a.max_q_len;
  // The layout (splits, their merge, blocks per SM) is the same with and without the input stage,
  // so both split the keys alike and give the same bits (test_qkv_gpu.cpp checks).
  auto run = [&](auto d, auto input) {
    constexpr int D = decltype(d)::value;
    const DecodeLayout l = choose_decode_layout<T, D>(be, base_blocks, rows);
    launch_decode_d<T, D, decltype(input)::value>(be, a, l.max_splits, l.smem);
  };
  using D64 = std::integral_constant<int, 64>;
  using D128 = std::integral_constant<int, 128>;
  const bool input = a.input.qkv != nullptr;
  KILN_ASSERT(!input || (a.max_q_len <= 1 && a.G <= 16));
  if (a.D == 64) return input ? run(D64{}, std::true_type{}) : run(D64{}, std::false_type{});
  input ? run(D128{}, std::true_type{}) : run(D128{}, std::false_type{});
}

template void launch_decode<__nv_bfloat16>(CudaBackend&, const Args&);
template void launch_decode<__half>(CudaBackend&, const Args&);

}  // namespace kiln::cuda::attn
