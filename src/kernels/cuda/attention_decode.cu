// The decode / short-query split-KV kernel and its combine pass (family 1 of attention.cu's
// description), with the host choice of the split count.
#include <cooperative_groups.h>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/programmatic_launch.cuh"

namespace kiln::cuda::attn {
namespace {

// ------------------------------------------------------------------------------------------------
// 1. Decode / short-query split-KV kernel.
//
// Fragment layouts (g = lane / 4, t = lane % 4; mma m16n8k16 A row-major, B "col", C 16x8):
//  QK: S[16 rows x 16 keys] as two n8 tiles; n tile nt holds keys key0 + nt*8 + n. Thread (g,t)
//      loads K rows key0+g and key0+8+g, the 16-byte chunks at dims c*32 + t*8 (c < D/32). K-step
//      j (j < D/16) uses words (j%2)*2, (j%2)*2+1 of chunk j/2 as b0, b1; Q's A fragment uses the
//      same dims (rows g, g+8), so the head dimension is permuted identically on both sides.
//  PV: P is S's C fragment reused as the A fragment (k = key). Output n tile i, column n maps to
//      dim (i/8)*64 + n*8 + i%8, so thread (g,t) needs V at dims vc*64 + g*8 + [0,8) (one 16-byte
//      chunk vc < D/64) of keys key0 + 2t, 2t+1, 2t+8, 2t+9; b0/b1 pair two keys per dim via
//      byte_perm. Thread (g,t) then owns out rows g, g+8 at dims (i/8)*64 + (2t+e)*8 + i%8.
template <int D>
struct DecodeFrag {
  uint4 k[2][D / 32];  // K rows key0+g, key0+8+g
  uint4 v[4][D / 64];  // V rows key0+2t, +2t+1, +2t+8, +2t+9
};

constexpr int kDecodeMinKeysPerSplit = 64;

// The splits merged inside the decode kernel, through distributed shared memory (a cluster of one
// block per split): two (prefer_merged_pair says why).
constexpr int kClusterMergeMaxSplits = 2;

// kMerge: the splits of a tile are one cluster, merged in the kernel (below); otherwise a single
// split writes the output and more write partials for the combine pass.
template <typename T, int D, bool kPingPong, int kMinBlocks, bool kMerge>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    attn_decode_kernel(T* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_lse,
                       const T* __restrict__ q, const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                       const int* __restrict__ q_indptr, PagedArgs kv, int Hq, int Hkv, int G, int max_q_len,
                       int num_splits, float sl) {
  constexpr int KC = D / 32;  // K chunks per row per thread
  constexpr int VC = D / 64;  // V chunks per row per thread
  constexpr int NT = D / 8;   // PV n tiles
  constexpr int KS = D / 16;  // QK k steps
  constexpr int kPad = 4;
  __shared__ __align__(16) float sm_acc[kWarps][16][D + kPad];
  __shared__ float sm_m[kWarps][16];
  __shared__ float sm_l[kWarps][16];
  __shared__ __align__(16) float sm_part[16][D + kPad];  // this split's output (cluster merge)
  __shared__ float sm_lse[16];
  hopper::launch_dependents();  // a programmatically launched consumer may start its weight stream
  hopper::grid_dependency_wait();  // for the kernel that wrote q and the new key (programmatic launch)

  const int split = blockIdx.x;
  const int kvh = blockIdx.y % Hkv;
  const int rt = blockIdx.y / Hkv;
  const int b = blockIdx.z;
  const int q_start = q_indptr[b];
  const int q_len = q_indptr[b + 1] - q_start;
  const int rows = q_len * G;
  const int r0 = rt * 16;
  if (r0 >= rows) return;  // every block of a request without queries (padding) exits here
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

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int kv_stride = Hkv * D;  // elements per pool row (row * kv_stride: one widening multiply)

  // This thread's query rows (tile rows g and g+8), their key limits, and Q's A fragments.
  int lim[2];
  uint4 qv[2][KC];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int R = r0 + g + 8 * hf;
    const int i = R / G;
    const int hq = kvh * G + (R - i * G);
    const bool valid = R < rows;
    lim[hf] = valid ? min(key_end, delta + i + 1) : 0;
    const T* qrow = q + (static_cast<int64_t>(q_start + (valid ? i : 0)) * Hq + hq) * D + t * 8;
#pragma unroll
    for (int c = 0; c < KC; ++c) qv[hf][c] = valid ? ldg_stream(qrow + c * 32) : make_uint4(0, 0, 0, 0);
  }
  uint32_t qa[KS][4];
#pragma unroll
  for (int j = 0; j < KS; ++j) {
    const int c = j / 2, w = (j % 2) * 2;
    qa[j][0] = word(qv[0][c], w);
    qa[j][1] = word(qv[1][c], w);
    qa[j][2] = word(qv[0][c], w + 1);
    qa[j][3] = word(qv[1][c], w + 1);
  }

  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};

  const T* kbase = k_cache + static_cast<int64_t>(kvh) * D;
  const T* vbase = v_cache + static_cast<int64_t>(kvh) * D;

  // Page id of the first key of this warp's next step, read one step ahead (steps are loaded in
  // the order warp, warp + 4, ...), so that the page-table latency hides behind a step of compute.
  int next_pid = 0;
  auto prefetch_page = [&](int step) {
    if (step < n_steps) next_pid = keys.page_id(keys.page(key_begin + step * 16));
  };
  prefetch_page(warp);

  // Keys key0 .. key0 + 15 of a step (key0 is a multiple of 16). When they lie in one page (always
  // when the page size is a multiple of 16) they are consecutive pool rows from that page's row of
  // key0; otherwise (small pages, or a step across a page boundary) each row is looked up, keys
  // past the step's range as the last key of the range (in bounds; nothing is loaded for them), so
  // that no lookup depends on a per-lane branch.
  auto load = [&](DecodeFrag<D>& f, int step) {
    const int key0 = key_begin + step * 16;
    const int p0 = keys.page(key0);
    const int in0 = key0 - p0 * keys.size;
    const int row0 = next_pid * keys.size + in0;
    prefetch_page(step + kWarps);
    int krow[2], vrow[4];  // pool rows of this thread's K rows (key0 + g + 8 hf) and V rows
    if (in0 + 16 <= keys.size) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) krow[hf] = row0 + g + 8 * hf;
#pragma unroll
      for (int kq = 0; kq < 4; ++kq) vrow[kq] = row0 + 2 * t + (kq & 1) + (kq >> 1) * 8;
    } else {
      const int last = key_end - 1;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) krow[hf] = keys.row(min(key0 + g + 8 * hf, last));
#pragma unroll
      for (int kq = 0; kq < 4; ++kq) vrow[kq] = keys.row(min(key0 + 2 * t + (kq & 1) + (kq >> 1) * 8, last));
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const bool ok = key0 + g + 8 * hf < key_end;
      const T* p = kbase + row_offset(krow[hf], kv_stride) + t * 8;
#pragma unroll
      for (int c = 0; c < KC; ++c) f.k[hf][c] = ok ? ldg_stream(p + c * 32) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int kq = 0; kq < 4; ++kq) {
      const bool ok = key0 + 2 * t + (kq & 1) + (kq >> 1) * 8 < key_end;
      const T* p = vbase + row_offset(vrow[kq], kv_stride) + g * 8;
#pragma unroll
      for (int c = 0; c < VC; ++c) f.v[kq][c] = ok ? ldg_stream(p + c * 64) : make_uint4(0, 0, 0, 0);
    }
  };

  auto compute = [&](const DecodeFrag<D>& f, int step) {
    const int key0 = key_begin + step * 16;
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int c = j / 2, w = (j % 2) * 2;
      Mma<T>::mma(s[0], qa[j], word(f.k[0][c], w), word(f.k[0][c], w + 1));
      Mma<T>::mma(s[1], qa[j], word(f.k[1][c], w), word(f.k[1][c], w + 1));
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
    for (int i = 0; i < NT; ++i) {
      const int vc = i / 8, wi = (i % 8) / 2;
      const uint32_t sel = (i & 1) ? 0x7632u : 0x5410u;
      const uint32_t b0 = __byte_perm(word(f.v[0][vc], wi), word(f.v[1][vc], wi), sel);
      const uint32_t b1 = __byte_perm(word(f.v[2][vc], wi), word(f.v[3][vc], wi), sel);
      Mma<T>::mma(acc[i], pa, b0, b1);
      if constexpr (kSplitP) Mma<T>::mma(acc[i], pl, b0, b1);
    }
  };

  if constexpr (kPingPong) {
    // Two register buffers: the loads of the next step are in flight while this one computes.
    DecodeFrag<D> fa, fb;
    int st = warp;
    if (st < n_steps) load(fa, st);
    while (st < n_steps) {
      const int st2 = st + kWarps;
      if (st2 < n_steps) load(fb, st2);
      compute(fa, st);
      if (st2 >= n_steps) break;
      const int st3 = st2 + kWarps;
      if (st3 < n_steps) load(fa, st3);
      compute(fb, st2);
      st = st3;
    }
  } else {
    for (int st = warp; st < n_steps; st += kWarps) {
      DecodeFrag<D> fa;
      load(fa, st);
      compute(fa, st);
    }
  }

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
      const int dim = (i / 8) * 64 + (2 * t + (e & 1)) * 8 + (i % 8);
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
    // The splits of this tile are the blocks of one cluster (rank = split). Each publishes its
    // normalised output and log-sum-exp in shared memory; rank s then finishes the rows r with
    // r % num_splits == s, reading every active split's share in split order (weights 2^(lse -
    // max), the largest exactly 1): the sums depend only on the active splits, so calls that
    // differ in num_splits alone agree bit for bit, and a single active split passes through.
#pragma unroll
    for (int d = 0; d < kDimsPerThread; d += 4)
      *reinterpret_cast<float4*>(&sm_part[r][d0 + d]) = make_float4(o[d], o[d + 1], o[d + 2], o[d + 3]);
    if ((tid & 7) == 0) sm_lse[r] = lse;
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (row_valid && r % num_splits == split) {
      float lses[kClusterMergeMaxSplits];
      float mx = -INFINITY;
#pragma unroll
      for (int s = 0; s < kClusterMergeMaxSplits; ++s) {
        lses[s] = s < active_splits ? *cluster.map_shared_rank(&sm_lse[r], s) : -INFINITY;
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
        const float* src = cluster.map_shared_rank(&sm_part[r][d0], s);
#pragma unroll
        for (int d = 0; d < kDimsPerThread; d += 4) {
          const float4 a = *reinterpret_cast<const float4*>(src + d);
          acc_o[d] = fmaf(w, a.x, acc_o[d]);
          acc_o[d + 1] = fmaf(w, a.y, acc_o[d + 1]);
          acc_o[d + 2] = fmaf(w, a.z, acc_o[d + 2]);
          acc_o[d + 3] = fmaf(w, a.w, acc_o[d + 3]);
        }
      }
      const float inv_den = den > 0.0f ? 1.0f / den : 0.0f;
#pragma unroll
      for (int d = 0; d < kDimsPerThread; ++d) acc_o[d] *= inv_den;
      store_out(acc_o);
    }
    cluster.sync();  // every rank has read this block's share
  } else if (row_valid) {
    const int64_t idx = ((static_cast<int64_t>(b) * max_q_len + i) * Hq + hq) * num_splits + split;
    float* dst = part_o + idx * D + d0;
#pragma unroll
    for (int d = 0; d < kDimsPerThread; d += 4)
      *reinterpret_cast<float4*>(dst + d) = make_float4(o[d], o[d + 1], o[d + 2], o[d + 3]);
    if ((tid & 7) == 0) part_lse[idx] = lse;
  }
}

constexpr int kDecodeMaxSplits = 256;

// Merges the splits of the decode kernel: one block per (request, query row, head); warp w sums
// splits w, w+4, ... (independent loads in flight), then the warps' sums are added.
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    attn_combine_kernel(T* __restrict__ out, const float* __restrict__ part_o, const float* __restrict__ part_lse,
                        const int* __restrict__ q_indptr, int Hq, int max_q_len, int num_splits) {
  constexpr int PER = D / 32;  // dims per lane
  __shared__ float sm_w[kDecodeMaxSplits];
  __shared__ __align__(16) float sm_o[kWarps][D];
  __shared__ float sm_red[2][kWarps];
  hopper::launch_dependents();
  hopper::grid_dependency_wait();
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int64_t p = blockIdx.x;  // (b * max_q_len + i) * Hq + h
  const int h = static_cast<int>(p % Hq);
  const int64_t bi = p / Hq;
  const int i = static_cast<int>(bi % max_q_len);
  const int b = static_cast<int>(bi / max_q_len);
  const int q_start = q_indptr[b];
  if (i >= q_indptr[b + 1] - q_start) return;  // uniform over the block
  const int64_t base = p * num_splits;
  // The partial outputs of this warp's first kPrefetch splits are loaded before their weights are
  // known (they do not depend on them), so that their latency overlaps the lse loads and reductions
  // (same sums in the same order; measured in one call, B=1 at 1K: astrai-1b 1.025 -> 1.007 ms per
  // step, llama-1b 0.941 -> 0.930; B=8 at 30K 0.5% slower).
  constexpr int kPrefetch = 8;
  using Part = std::conditional_t<PER == 2, float2, float4>;
  Part pre[kPrefetch];
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    const int s = warp + k * kWarps;
    pre[k] = s < num_splits ? *reinterpret_cast<const Part*>(part_o + (base + s) * D + lane * PER) : Part{};
  }

  float mx = -INFINITY;
  for (int s = tid; s < num_splits; s += kThreads) {
    const float v = part_lse[base + s];
    sm_w[s] = v;
    mx = fmaxf(mx, v);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) sm_red[0][warp] = mx;
  __syncthreads();
  mx = fmaxf(fmaxf(sm_red[0][0], sm_red[0][1]), fmaxf(sm_red[0][2], sm_red[0][3]));
  float den = 0.0f;
  for (int s = tid; s < num_splits; s += kThreads) {
    const float v = sm_w[s];
    // Empty splits (lse = -inf) weigh 0; the largest weighs exactly 1, so a single active split
    // passes through unchanged (bit-identical to the one-split direct write).
    const float w = (v == -INFINITY) ? 0.0f : (v == mx ? 1.0f : exp2f(v - mx));
    sm_w[s] = w;
    den += w;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffffu, den, off);
  if (lane == 0) sm_red[1][warp] = den;
  __syncthreads();
  den = sm_red[1][0] + sm_red[1][1] + sm_red[1][2] + sm_red[1][3];

  float o[PER];
#pragma unroll
  for (int d = 0; d < PER; ++d) o[d] = 0.0f;
  auto accumulate = [&](float w, const Part& v) {  // empty splits hold zeros in part_o: no branch
    if constexpr (PER == 2) {
      o[0] = fmaf(w, v.x, o[0]);
      o[1] = fmaf(w, v.y, o[1]);
    } else {
      o[0] = fmaf(w, v.x, o[0]);
      o[1] = fmaf(w, v.y, o[1]);
      o[2] = fmaf(w, v.z, o[2]);
      o[3] = fmaf(w, v.w, o[3]);
    }
  };
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    const int s = warp + k * kWarps;
    if (s < num_splits) accumulate(sm_w[s], pre[k]);
  }
#pragma unroll(PER == 2 ? 8 : 4)
  for (int s = warp + kPrefetch * kWarps; s < num_splits; s += kWarps)
    accumulate(sm_w[s], *reinterpret_cast<const Part*>(part_o + (base + s) * D + lane * PER));
#pragma unroll
  for (int d = 0; d < PER; ++d) sm_o[warp][lane * PER + d] = o[d];
  __syncthreads();
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  T* dst = out + (static_cast<int64_t>(q_start + i) * Hq + h) * D;
  for (int d = 2 * tid; d < D; d += 2 * kThreads) {
    const float a = sm_o[0][d] + sm_o[1][d] + sm_o[2][d] + sm_o[3][d];
    const float c = sm_o[0][d + 1] + sm_o[1][d + 1] + sm_o[2][d + 1] + sm_o[3][d + 1];
    store2(dst + d, a * inv, c * inv);
  }
}

// Resident blocks per SM of a decode kernel on the backend's device (queried once per backend).
int decode_blocks_per_sm(CudaBackend& be, const void* kernel) {
  AttentionState& st = state_of(be);
  auto it = st.blocks_per_sm.find(kernel);
  if (it != st.blocks_per_sm.end()) return it->second;
  int n = 0;
  with_device(st.device, [&] { CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0)); });
  n = std::max(n, 1);
  st.blocks_per_sm.emplace(kernel, n);
  return n;
}

// Splits so that the decode grid fills whole waves of resident blocks, within two waves: from
// floor(W / base) (at least 1) up to 2W / base, the count whose last wave is fullest (fewest splits
// on ties). B=32 (base 128, W 396): 3 splits, one full wave, where ceil(W / base) = 4 made 1.3
// waves; B=64: 3 (1.94 waves). Grids of two waves and more keep one split: the combine pass costs
// more there than the last wave's idle slots (measured: three splits at B=256 took 10% longer).
// Without the length cap this is the most any max_kv_len can ask for (used to size the scratch).
// (prefer_merged_pair below then trades B=32's three splits for two merged in the kernel.)
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
// every batch size (B=32: 1.662, 1.628, 1.751). The D=128 build follows the same rule unmeasured.
int prefer_merged_pair(int max_splits, int base_blocks, int sm_count, int blocks_per_sm) {
  return max_splits > 2 && 4 * base_blocks >= std::max(sm_count, 1) * blocks_per_sm ? 2 : max_splits;
}

// Waves of resident blocks a grid of base_blocks x max_splits takes.
double decode_waves(int base_blocks, int max_splits, int sm_count, int blocks_per_sm) {
  return static_cast<double>(base_blocks) * max_splits / (std::max(sm_count, 1) * blocks_per_sm);
}

template <typename T, int D, int kMinBlocks>
void launch_decode_d(CudaBackend& be, const Args& a, int base_blocks, int max_splits) {
  const int row_tiles = (a.max_q_len * a.G + 15) / 16;
  const int splits = decode_num_splits(max_splits, a.max_kv_len);
  // Two splits are merged inside the kernel (a cluster of two blocks), more by the combine pass
  // (prefer_merged_pair): B=64 in two splits took 1.749 ms per step merged in clusters against
  // 1.892 with the combine pass. The choice depends on the launch shape only, never on max_kv_len,
  // so eager calls and graphs captured with larger bounds agree bit for bit.
  const bool merge_in_cluster = max_splits == kClusterMergeMaxSplits;
  auto kernel = merge_in_cluster ? attn_decode_kernel<T, D, D <= 64, kMinBlocks, true>
                                 : attn_decode_kernel<T, D, D <= 64, kMinBlocks, false>;
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
  detail::launch_programmatic(be, kernel, grid, dim3(kThreads), 0, cluster, static_cast<T*>(a.out), part_o, part_lse,
                              static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                              a.q_indptr, a.kv, a.Hq, a.Hkv, a.G, a.max_q_len, splits, a.sl);
  if (splits > 1 && !merge_in_cluster) {
    const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(a.B) * a.max_q_len * a.Hq);
    detail::launch_programmatic(be, attn_combine_kernel<T, D>, dim3(blocks), dim3(kThreads), 0, 1,
                                static_cast<T*>(a.out), static_cast<const float*>(part_o),
                                static_cast<const float*>(part_lse), a.q_indptr, a.Hq, a.max_q_len, splits);
  }
}

}  // namespace

// D=128 runs 2 blocks per SM (no spills). D=64 has two builds: 3 blocks per SM (<= 170 registers,
// no spills) and 4 (128 registers, a few spilled bytes). The 4-block build is taken where it puts
// the grid in one wave and the 3-block build needs more, or fills under 90% of its one wave:
// measured (bench_decode_step, astrai-1b, 1K context, ms per step 3 -> 4 blocks) B=64 1.885 ->
// 1.749 and B=128 2.426 -> 2.272, where B=1 / 8 / 32 / 256 were 1-2% slower with 4 (1.011 ->
// 1.030, 1.154 -> 1.176, 1.529 -> 1.595, 3.398 -> 3.441).
template <typename T>
void launch_decode(CudaBackend& be, const Args& a) {
  const int row_tiles = (a.max_q_len * a.G + 15) / 16;
  const int base_blocks = a.B * a.Hkv * row_tiles;
  const int sms = be.multiprocessor_count();
  if (a.D != 64) {
    const int blocks = decode_blocks_per_sm(be, kernel_key(attn_decode_kernel<T, 128, false, 2, false>));
    const int splits = decode_max_splits(base_blocks, sms, blocks);
    return launch_decode_d<T, 128, 2>(be, a, base_blocks, prefer_merged_pair(splits, base_blocks, sms, blocks));
  }
  const int blocks3 = decode_blocks_per_sm(be, kernel_key(attn_decode_kernel<T, 64, true, 3, false>));
  const int blocks4 = decode_blocks_per_sm(be, kernel_key(attn_decode_kernel<T, 64, true, 4, false>));
  const int splits3 = decode_max_splits(base_blocks, sms, blocks3);
  const int splits4 = decode_max_splits(base_blocks, sms, blocks4);
  const double waves3 = decode_waves(base_blocks, splits3, sms, blocks3);
  const double waves4 = decode_waves(base_blocks, splits4, sms, blocks4);
  if (blocks4 > blocks3 && waves4 <= 1.0 && (waves3 > 1.0 || waves3 < 0.9))
    return launch_decode_d<T, 64, 4>(be, a, base_blocks, prefer_merged_pair(splits4, base_blocks, sms, blocks4));
  launch_decode_d<T, 64, 3>(be, a, base_blocks, prefer_merged_pair(splits3, base_blocks, sms, blocks3));
}

template void launch_decode<__nv_bfloat16>(CudaBackend&, const Args&);
template void launch_decode<__half>(CudaBackend&, const Args&);

}  // namespace kiln::cuda::attn
