// Token sampling: tokens[b] = a draw from logits[b] under params[b]. logits: [B, V] (f32; bf16/f16
// read as f32), tokens: [B] i32 on the device, params: B host entries. Mirrors the CPU twin
// (kernels/cpu/sampling.cpp) step for step:
//   0. NaN logits count as -inf.
//   1. Greedy (temperature <= 0, or the largest logit is +inf, or every logit is -inf): the index of
//      the largest logit, lowest index on ties.
//   2. Order: descending logit, ties by ascending index. Probabilities in double:
//      z_i = (double)logit_i / (double)T, m = max z, p_i = exp(z_i - m) / sum_j exp(z_j - m).
//   3. Top-k: keep the first min(top_k, V) of the order when top_k > 0.
//   4. Top-p (top_p < 1): q = p / sum(kept p); keep every token whose cumulative q BEFORE it is
//      < top_p (the first always).
//   5. Draw: r = kept p / sum(kept p); u = rng::uniform(seed, step) (= ops::sampling_uniform); the
//      first kept token whose cumulative r is > u, else the last kept token with r > 0.
// Cumulative sums are double (block scans in order; only the association differs from the CPU).
//
// Kernels:
//   argmax_kernel  one block per row: greedy tokens. When every row is greedy this is the only work:
//                  no allocation, no copy, no synchronisation (CUDA-graph capturable).
//   prepare_kernel one block per sampled row: max/argmax, sum_j exp(z_j - m), and the sort input:
//                  key = (row << 32) | k(logit) where k orders descending logits as ascending
//                  unsigned values, value = index.
//   radix sort     cub::DeviceRadixSort over the composite keys of a chunk of rows at once (the
//                  whole GPU works on it, unlike a per-row segmented sort); radix sort is stable, so
//                  equal logits keep ascending indices.
//   select_kernel  one block per sampled row: steps 3-5 over the sorted row with tiled block scans
//                  that stop at the first hit.
// Sampled rows need a host->device copy of their parameters and temporary buffers (sort keys and
// values for up to 2M elements at a time, ~50 MB, plus CUB's temporary storage) from the backend's
// caching allocator; they are returned to it when sample() returns (stream order makes the reuse
// safe). They do not use the scratch buffer, so growing it cannot invalidate a captured graph.
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cmath>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/rng.h"

namespace kiln::cuda {
namespace {

constexpr int kArgmaxThreads = 1024;
constexpr int kThreads = 512;                       // prepare / select
constexpr int kItems = 8;                           // select: consecutive items per thread per tile
constexpr int64_t kChunkElems = int64_t(1) << 21;  // sorted together: this many elements (at least one row)

struct RowParams {  // one sampled (non-greedy) row
  double u;
  float temperature;
  float top_p;
  int32_t top_k;
  int32_t row;
};

struct RowStats {
  double m;      // max_i z_i
  double total;  // sum_i exp(z_i - m)
  float max_logit;
  int32_t argmax;
};

__device__ __forceinline__ float clean(float v) { return v != v ? -INFINITY : v; }

// Ascending order of the key = descending order of the logit (NaN already -inf; -0 folded into +0
// so that equal logits tie and fall back to the index order).
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t u = __float_as_uint(v);
  const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ascending;
}
__device__ __forceinline__ float key_logit(uint32_t key) {
  const uint32_t ascending = ~key;
  return __uint_as_float((ascending & 0x80000000u) ? (ascending & 0x7fffffffu) : ~ascending);
}

struct ArgMax {
  float v;
  int32_t i;
};
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

template <int kBlock>
__device__ ArgMax block_argmax(ArgMax x, ArgMax* smem /* [32] */) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = better(x, ArgMax{__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)});
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) smem[warp] = x;
  __syncthreads();
  x = lane < kBlock / 32 ? smem[lane] : ArgMax{-INFINITY, INT_MAX};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = better(x, ArgMax{__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)});
  return x;
}

// tokens[b] = argmax of row b (NaN as -inf, lowest index on ties). Grid: B blocks.
template <int N>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(int32_t* tokens, const void* logits, DType dt, int64_t V) {
  __shared__ ArgMax smem[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * V;
  constexpr int kUnroll = 4;  // loads in flight per thread: one block streams a whole row
  constexpr int64_t kStride = static_cast<int64_t>(kArgmaxThreads) * N;
  ArgMax best{-INFINITY, INT_MAX};
  for (int64_t i0 = static_cast<int64_t>(threadIdx.x) * N; i0 < V; i0 += kStride * kUnroll) {
    float v[kUnroll][N];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i0 + u * kStride < V) detail::load_vec<N>(logits, base + i0 + u * kStride, dt, v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * kStride;
      if (i < V) {
#pragma unroll
        for (int k = 0; k < N; ++k) best = better(best, ArgMax{clean(v[u][k]), static_cast<int32_t>(i + k)});
      }
    }
  }
  best = block_argmax<kArgmaxThreads>(best, smem);
  if (threadIdx.x == 0) tokens[blockIdx.x] = best.i;
}

// Grid: the rows of one chunk; block j handles sampled row first + j and writes its V keys/values at
// j * V.
__global__ void __launch_bounds__(kThreads)
    prepare_kernel(const void* logits, DType dt, int64_t V, const RowParams* params, RowStats* stats, int first,
                   uint64_t* keys, int32_t* vals) {
  __shared__ ArgMax smem_arg[32];
  __shared__ double smem_sum[32];
  const int j = blockIdx.x;
  const RowParams P = params[first + j];
  const int64_t base = static_cast<int64_t>(P.row) * V;

  ArgMax best{-INFINITY, INT_MAX};
  for (int64_t i = threadIdx.x; i < V; i += kThreads)
    best = better(best, ArgMax{clean(detail::load1(logits, base + i, dt)), static_cast<int32_t>(i)});
  best = block_argmax<kThreads>(best, smem_arg);

  const double T = static_cast<double>(P.temperature);
  const double m = static_cast<double>(best.v) / T;
  const uint64_t row_bits = static_cast<uint64_t>(j) << 32;
  double total = 0.0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float l = clean(detail::load1(logits, base + i, dt));
    total += exp(static_cast<double>(l) / T - m);
    keys[static_cast<int64_t>(j) * V + i] = row_bits | order_key(l);
    vals[static_cast<int64_t>(j) * V + i] = static_cast<int32_t>(i);
  }
  total = detail::block_reduce<kThreads>(total, detail::SumOp{}, 0.0, smem_sum);
  if (threadIdx.x == 0) stats[first + j] = RowStats{m, total, best.v, best.i};
}

struct MaxI64 {
  __device__ __forceinline__ long long operator()(long long a, long long b) const { return a > b ? a : b; }
};

using BlockScan = cub::BlockScan<double, kThreads>;

struct SelectSmem {
  typename BlockScan::TempStorage scan;
  double sum[32];
  long long pos[32];
  unsigned long long found;
};

struct Found {
  long long index;          // first r with pred, or -1
  long long last_positive;  // largest r < n with q(r) > 0 (0 if none), over the scanned tiles
};

// Scans r = 0 .. n-1 in order with the running sum `before` of q(0..r-1) and returns the first r
// with pred(r, before, q(r)). Tiles of kThreads * kItems items (each thread kItems consecutive
// ones); stops after the tile holding the first hit. All threads get the result.
template <typename Q, typename Pred>
__device__ Found scan_find(long long n, Q q_of, Pred pred, SelectSmem& sm) {
  if (threadIdx.x == 0) sm.found = ULLONG_MAX;
  __syncthreads();
  double carry = 0.0;
  long long last_pos = 0;
  unsigned long long hit = ULLONG_MAX;
  for (long long tile = 0; tile < n; tile += static_cast<long long>(kThreads) * kItems) {
    const long long first = tile + static_cast<long long>(threadIdx.x) * kItems;
    double q[kItems];
    double sum = 0.0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      q[k] = first + k < n ? q_of(first + k) : 0.0;
      sum += q[k];
    }
    double prefix, aggregate;
    BlockScan(sm.scan).ExclusiveSum(sum, prefix, aggregate);
    double before = carry + prefix;
    unsigned long long mine = ULLONG_MAX;
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const long long r = first + k;
      if (r < n) {
        if (q[k] > 0.0) last_pos = r;
        if (mine == ULLONG_MAX && pred(r, before, q[k])) mine = static_cast<unsigned long long>(r);
        before += q[k];
      }
    }
    if (mine != ULLONG_MAX) atomicMin(&sm.found, mine);
    __syncthreads();  // also separates this tile's scan storage from the next tile's
    hit = sm.found;
    if (hit != ULLONG_MAX) break;  // uniform: every thread read the same value
    carry += aggregate;
  }
  Found f;
  f.index = hit == ULLONG_MAX ? -1 : static_cast<long long>(hit);
  f.last_positive = detail::block_reduce<kThreads>(last_pos, MaxI64{}, 0LL, sm.pos);
  return f;
}

template <typename Q>
__device__ double block_sum(long long n, Q q_of, SelectSmem& sm) {
  double s = 0.0;
  for (long long r = threadIdx.x; r < n; r += kThreads) s += q_of(r);
  return detail::block_reduce<kThreads>(s, detail::SumOp{}, 0.0, sm.sum);
}

// Grid: the rows of one chunk, keys/vals sorted (row j at j * V, descending logits).
__global__ void __launch_bounds__(kThreads)
    select_kernel(int32_t* tokens, const RowParams* params, const RowStats* stats, int first, const uint64_t* keys,
                  const int32_t* vals, int64_t V) {
  __shared__ SelectSmem sm;
  const int j = blockIdx.x;
  const RowParams P = params[first + j];
  const RowStats S = stats[first + j];
  if (!isfinite(S.max_logit)) {  // +inf, or every logit -inf: no finite distribution (uniform branch)
    if (threadIdx.x == 0) tokens[P.row] = S.argmax;
    return;
  }
  const uint64_t* key = keys + static_cast<int64_t>(j) * V;
  const int32_t* val = vals + static_cast<int64_t>(j) * V;
  const double T = static_cast<double>(P.temperature);
  auto prob = [&](long long r) {
    return exp(static_cast<double>(key_logit(static_cast<uint32_t>(key[r]))) / T - S.m) / S.total;
  };

  long long kept = (P.top_k > 0 && P.top_k < V) ? P.top_k : V;
  if (P.top_p < 1.0f) {
    const double kept_mass = block_sum(kept, prob, sm);
    const double top_p = static_cast<double>(P.top_p);
    const Found f = scan_find(
        kept, [&](long long r) { return prob(r) / kept_mass; },
        [&](long long r, double before, double) { return r >= 1 && !(before < top_p); }, sm);
    if (f.index >= 0) kept = f.index;
  }
  const double mass = block_sum(kept, prob, sm);
  const double u = P.u;
  const Found f = scan_find(
      kept, [&](long long r) { return prob(r) / mass; },
      [&](long long, double before, double q) { return before + q > u; }, sm);
  if (threadIdx.x == 0) tokens[P.row] = val[f.index >= 0 ? f.index : f.last_positive];
}

int bits_for(int64_t x) {  // bits needed to represent x >= 0
  int b = 0;
  while (x > 0) {
    ++b;
    x >>= 1;
  }
  return b;
}

int64_t align_up(int64_t x) { return (x + 255) / 256 * 256; }

size_t sort_temp_bytes(int64_t items, int end_bit) {
  size_t bytes = 0;
  cub::DoubleBuffer<uint64_t> k(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> v(nullptr, nullptr);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k, v, static_cast<int>(items), 0, end_bit));
  return bytes;
}

}  // namespace

void sample(CudaBackend& be, Tensor tokens, Tensor logits, const std::vector<ops::SamplingParams>& params) {
  detail::check_float(be, logits);
  detail::check_i32(be, tokens);
  KILN_ASSERT(logits.ndim() == 2 && tokens.ndim() == 1);
  const int64_t B = logits.size(0), V = logits.size(1);
  KILN_ASSERT(tokens.size(0) == B && static_cast<int64_t>(params.size()) == B && V > 0);
  KILN_ASSERT(V <= INT32_MAX && B < (int64_t(1) << 31));
  if (B == 0) return;
  cudaStream_t stream = detail::stream_of(be);

  std::vector<RowParams> rows;
  for (int64_t b = 0; b < B; ++b) {
    const ops::SamplingParams& p = params[static_cast<size_t>(b)];
    if (p.temperature > 0.0f)
      rows.push_back(RowParams{rng::uniform(p.seed, p.step), p.temperature, p.top_p, p.top_k, static_cast<int32_t>(b)});
  }

  // Greedy rows (all rows; the sampled ones are overwritten below, in stream order).
  if (static_cast<int64_t>(rows.size()) < B) {
    const bool vec = V % 8 == 0 && detail::aligned16(logits.data);
    if (vec)
      argmax_kernel<8><<<static_cast<unsigned>(B), kArgmaxThreads, 0, stream>>>(tokens.ptr<int32_t>(), logits.data,
                                                                              logits.dtype, V);
    else
      argmax_kernel<1><<<static_cast<unsigned>(B), kArgmaxThreads, 0, stream>>>(tokens.ptr<int32_t>(), logits.data,
                                                                              logits.dtype, V);
    KILN_CUDA_CHECK_LAUNCH();
  }
  if (rows.empty()) return;

  const int64_t n_rows = static_cast<int64_t>(rows.size());
  const int64_t chunk_rows = std::min(n_rows, std::max<int64_t>(1, kChunkElems / V));
  const int64_t last_rows = n_rows - (n_rows - 1) / chunk_rows * chunk_rows;  // rows of the last chunk
  const int64_t chunk_items = chunk_rows * V;
  const size_t temp_bytes = std::max(sort_temp_bytes(chunk_items, 32 + bits_for(chunk_rows - 1)),
                                     sort_temp_bytes(last_rows * V, 32 + bits_for(last_rows - 1)));

  // One temporary allocation: params | stats | keys x2 | values x2 | sort temp.
  const int64_t params_off = 0;
  const int64_t stats_off = params_off + align_up(n_rows * static_cast<int64_t>(sizeof(RowParams)));
  const int64_t keys0_off = stats_off + align_up(n_rows * static_cast<int64_t>(sizeof(RowStats)));
  const int64_t keys1_off = keys0_off + align_up(chunk_items * 8);
  const int64_t vals0_off = keys1_off + align_up(chunk_items * 8);
  const int64_t vals1_off = vals0_off + align_up(chunk_items * 4);
  const int64_t temp_off = vals1_off + align_up(chunk_items * 4);
  const int64_t total_bytes = temp_off + align_up(static_cast<int64_t>(temp_bytes));
  Result<void*> mem = be.allocate(total_bytes);
  if (!mem.ok()) {
    std::fprintf(stderr, "kiln: sampling: %s\n", mem.status().message().c_str());
    std::abort();
  }
  Buffer buffer(&be, *mem, total_bytes);  // back to the cache on return; later users are stream-ordered
  char* base = static_cast<char*>(buffer.data());
  RowParams* d_params = reinterpret_cast<RowParams*>(base + params_off);
  RowStats* d_stats = reinterpret_cast<RowStats*>(base + stats_off);
  uint64_t* keys0 = reinterpret_cast<uint64_t*>(base + keys0_off);
  uint64_t* keys1 = reinterpret_cast<uint64_t*>(base + keys1_off);
  int32_t* vals0 = reinterpret_cast<int32_t*>(base + vals0_off);
  int32_t* vals1 = reinterpret_cast<int32_t*>(base + vals1_off);
  void* temp = base + temp_off;

  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so `rows` may go away.
  CUDA_CHECK(cudaMemcpyAsync(d_params, rows.data(), rows.size() * sizeof(RowParams), cudaMemcpyHostToDevice, stream));

  for (int64_t first = 0; first < n_rows; first += chunk_rows) {
    const int64_t rc = std::min(chunk_rows, n_rows - first);
    prepare_kernel<<<static_cast<unsigned>(rc), kThreads, 0, stream>>>(logits.data, logits.dtype, V, d_params, d_stats,
                                                                        static_cast<int>(first), keys0, vals0);
    KILN_CUDA_CHECK_LAUNCH();
    cub::DoubleBuffer<uint64_t> k(keys0, keys1);
    cub::DoubleBuffer<int32_t> v(vals0, vals1);
    size_t bytes = temp_bytes;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k, v, static_cast<int>(rc * V), 0, 32 + bits_for(rc - 1),
                                               stream));
    select_kernel<<<static_cast<unsigned>(rc), kThreads, 0, stream>>>(tokens.ptr<int32_t>(), d_params, d_stats,
                                                                       static_cast<int>(first), k.Current(),
                                                                       v.Current(), V);
    KILN_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace kiln::cuda
