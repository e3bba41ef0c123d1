// Token sampling on CUDA, the twin of kernels/cpu/sampling.cpp (whose header comment states the
// algorithm, steps 1-10) with the same arithmetic (kernels/sampling_math.h): the same tokens, bit
// for bit. The call reads every parameter from the device (`params`), keeps its scratch in
// `workspace`, allocates nothing, copies nothing to the host and never synchronises, so it can be
// captured in a CUDA graph and replayed with new parameters written into `params`.
//
// Kernels, one block of 1024 threads per row:
//   argmax_kernel   (`full` false) the first index of the largest raw logit; counts update.
//   sample_kernel   steps 1-10. The row is cut into 32 contiguous chunks, one per warp (16-byte
//                   loads when the rows allow). Passes over the row recompute the values from logits
//                   and counts: F1 max and `first`; F2 bucket histograms (counts per warp, masses in
//                   two shared-memory copies) and each warp's uncut kept mass; F3 the candidate list
//                   in index order, each warp compacting its chunk with ballots at the offset its F2
//                   counts give (no block barrier per element). Everything after touches only the
//                   list (typically hundreds of entries): the selection passes of step 7, then the
//                   tie position and the draw, both found by descending through 32 segments per level
//                   (segment sums, then the segment holding the target), which yields the CPU twin's
//                   first-exceeding position because the sums are exact integers. Without top-k and
//                   top-p (or with an ineffective top-k) the kept set is every weight >= the min-p
//                   floor: no histograms, no list; the draw descends into the chunk holding the target.
//                   Thread 0 writes the token, and for rows with logprobs == kLogprobsSampled the
//                   behaviour log-probability from the drawn token's kept weight and the kept mass.
//   logprob_kernel  (sampling_logprobs.cu) the raw log-probabilities of the rows that ask (the
//                   chosen token's except in kLogprobsSampled rows, and the top-N).
//   reset_counts_kernel  reset_token_counts after a memset of the row.
#include <climits>
#include <cstdint>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/sampling_common.cuh"
#include "kernels/sampling_math.h"

namespace kiln::cuda {
namespace {

namespace sm = kiln::sampling;
using sampler::ArgMax;
using sampler::better;
using sampler::block_argmax;
using sampler::kFull;
using sampler::kThreads;
using u64 = unsigned long long;

constexpr int kWarps = kThreads / 32;
constexpr int kBins = sm::kBins;
constexpr int kMassCopies = 2;
constexpr uint32_t kAllTies = 0xffffffffu;
constexpr int64_t kGroup = 128;  // elements a warp loads per step: 4 per lane

struct MinU32 {
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return min(a, b); }
};
struct MaxU32 {
  __device__ __forceinline__ uint32_t operator()(uint32_t a, uint32_t b) const { return max(a, b); }
};

template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T t = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Rows

struct Row {  // what the passes over the row need in registers (the rest stays in `params`)
  const float* logits;    // this row's logits
  const int32_t* counts;  // its counts row, or null
  float temperature, repetition, frequency, presence;
  bool greedy;
  bool vec;               // 16-byte loads (V % 4 == 0, aligned rows)
};

// Step 1: x (greedy) or z of one element.
__device__ __forceinline__ float value(const Row& r, float logit, int32_t count) {
  const float x = r.counts ? sm::penalise(logit, count, r.repetition, r.frequency, r.presence) : sm::clean(logit);
  return r.greedy ? x : sm::scaled(x, r.temperature);
}

// v[j] = the value of element i + j, -inf from `end` on.
__device__ __forceinline__ void load4(const Row& r, int64_t i, int64_t end, float (&v)[4]) {
  if (r.vec && i + 4 <= end) {
    const float4 l = __ldg(reinterpret_cast<const float4*>(r.logits + i));
    int4 c = make_int4(0, 0, 0, 0);
    if (r.counts) c = *reinterpret_cast<const int4*>(r.counts + i);
    v[0] = value(r, l.x, c.x);
    v[1] = value(r, l.y, c.y);
    v[2] = value(r, l.z, c.z);
    v[3] = value(r, l.w, c.w);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      v[j] = i + j < end ? value(r, __ldg(r.logits + i + j), r.counts ? r.counts[i + j] : 0) : -INFINITY;
  }
}

// Warp w's chunk [lo, hi) of the row: 32 chunks of a multiple of kGroup elements.
__device__ __forceinline__ void chunk_of(int64_t V, int warp, int64_t* lo, int64_t* hi) {
  const int64_t c = (V + kWarps * kGroup - 1) / (kWarps * kGroup) * kGroup;
  *lo = min(V, static_cast<int64_t>(warp) * c);
  *hi = min(V, *lo + c);
}

// Calls f(i, v) over the warp's chunk: lane l gets elements i .. i+3 of each group of kGroup
// (values v, -inf past hi). Every lane makes the same calls, so f may use warp collectives.
template <typename F>
__device__ __forceinline__ void walk_chunk(const Row& r, int64_t lo, int64_t hi, F&& f) {
  const int lane = threadIdx.x % 32;
  for (int64_t g = lo; g < hi; g += 2 * kGroup) {
    float a[4], b[4];
    const int64_t ia = g + 4 * lane, ib = ia + kGroup;
    load4(r, ia, hi, a);
    load4(r, ib, hi, b);
    f(ia, a);
    f(ib, b);
  }
}

// ---------------------------------------------------------------------------------------------
// Histograms and picks

struct Pick {
  int bin;
  u64 count_before, mass_before;
};

struct Smem {
  uint32_t warp_count[kWarps][kBins];  // F2: bucket counts per warp (F3 offsets); later digit counts
  u64 mass[kMassCopies][kBins];
  uint32_t bucket_count[kBins];
  u64 bucket_mass[kBins];
  uint32_t digit_count[kBins];
  u64 digit_mass[kBins];
  u64 seg[kWarps];
  uint32_t red32[32];
  ArgMax arg[32];
  Pick pick_k, pick_p, pick_d;
};

__device__ void clear_hist(Smem& s) {
  for (int k = threadIdx.x; k < kWarps * kBins; k += kThreads) (&s.warp_count[0][0])[k] = 0;
  for (int k = threadIdx.x; k < kMassCopies * kBins; k += kThreads) (&s.mass[0][0])[k] = 0;
}
__device__ __forceinline__ void hist_add(Smem& s, int bin, u64 w) {
  const int warp = threadIdx.x / 32;
  atomicAdd(&s.warp_count[warp][bin], 1u);
  atomicAdd(&s.mass[warp % kMassCopies][bin], w);
}
__device__ void merge_hist(Smem& s, uint32_t* count, u64* mass) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    uint32_t c = 0;
    for (int w = 0; w < kWarps; ++w) c += s.warp_count[w][b];
    u64 m = 0;
    for (int k = 0; k < kMassCopies; ++k) m += s.mass[k][b];
    count[b] = c;
    mass[b] = m;
  }
}

// Warp 0 only: the first bin, in scan order (ascending or descending bins), where the running count
// or mass reaches need, written to *out. Lane l scans positions 8l .. 8l+7.
__device__ void warp_pick(const uint32_t* count, const u64* mass, bool ascending, bool by_mass, u64 need, Pick* out) {
  const int lane = threadIdx.x % 32;
  auto bin_at = [&](int o) { return ascending ? o : kBins - 1 - o; };
  u64 c = 0, m = 0;
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    c += count[bin_at(8 * lane + q)];
    m += mass[bin_at(8 * lane + q)];
  }
  const u64 ci = warp_inclusive_sum(c), mi = warp_inclusive_sum(m);
  const unsigned hit = __ballot_sync(kFull, (by_mass ? mi : ci) >= need);
  if (lane != (hit ? __ffs(hit) - 1 : 31)) return;
  u64 cb = ci - c, mb = mi - m;
  for (int q = 0; q < 8; ++q) {
    const int b = bin_at(8 * lane + q);
    if (q == 7 || (by_mass ? mb + mass[b] : cb + count[b]) >= need) {
      *out = Pick{b, cb, mb};
      return;
    }
    cb += count[b];
    mb += mass[b];
  }
}

// ---------------------------------------------------------------------------------------------
// Step 7 on the candidate list

struct Cut {  // keeps key > key, and key == key among the first `ties` such entries (kAllTies: all)
  uint32_t key;
  uint32_t ties;
  u64 mass;  // mass kept inside the bucket
};

// Out of line (like draw_uncut): these run a few times per row, and the kernel's hot loops keep
// their registers.
__device__ __noinline__ Cut select_in_bucket(const uint32_t* keys, int64_t n, float m, int bsel, bool by_mass,
                                             u64 need, u64 bucket_count, Smem& s) {
  auto in_bucket = [&](uint32_t key) { return sm::bucket(sm::fsub(sm::key_value(key), m)) == bsel; };
  uint32_t lo = 0xffffffffu, hi = 0;
  for (int64_t q = threadIdx.x; q < n; q += kThreads) {
    const uint32_t key = keys[q];
    if (in_bucket(key)) lo = min(lo, key), hi = max(hi, key);
  }
  lo = detail::block_reduce<kThreads>(lo, MinU32{}, 0xffffffffu, s.red32);
  hi = detail::block_reduce<kThreads>(hi, MaxU32{}, 0u, s.red32);

  u64 prefix = lo, n_eq = bucket_count, mass_above = 0;
  if (lo != hi) {
    int low = 32 - __clz(lo ^ hi);  // bits below `low` are still open
    prefix = static_cast<u64>(hi) >> low;
    while (low > 0) {
      const int width = min(low, 8), shift = low - width;
      __syncthreads();  // readers of the previous histogram are done
      clear_hist(s);
      __syncthreads();
      for (int64_t q = threadIdx.x; q < n; q += kThreads) {
        const uint32_t key = keys[q];
        if (!in_bucket(key) || (static_cast<u64>(key) >> low) != prefix) continue;
        const int digit = static_cast<int>((key >> shift) & ((1u << width) - 1));
        hist_add(s, digit, sm::weight(sm::fsub(sm::key_value(key), m)));
      }
      __syncthreads();
      merge_hist(s, s.digit_count, s.digit_mass);
      __syncthreads();
      if (threadIdx.x < 32) warp_pick(s.digit_count, s.digit_mass, false, by_mass, need, &s.pick_d);
      __syncthreads();
      const Pick p = s.pick_d;
      const u64 bin_count = s.digit_count[p.bin], bin_mass = s.digit_mass[p.bin];
      need -= by_mass ? p.mass_before : p.count_before;
      mass_above += p.mass_before;
      prefix = (prefix << width) | static_cast<u64>(p.bin);
      low = shift;
      if ((by_mass ? need == bin_mass : need == bin_count) || bin_count == 1)
        return Cut{max(static_cast<uint32_t>(prefix << shift), lo), kAllTies, mass_above + bin_mass};
      n_eq = bin_count;
    }
  }
  const uint32_t key = static_cast<uint32_t>(prefix);
  const u64 w = sm::weight(sm::fsub(sm::key_value(key), m));
  const u64 t = by_mass ? (need + w - 1) / w : need;
  return Cut{key, t >= n_eq ? kAllTies : static_cast<uint32_t>(t), mass_above + t * w};
}

// Sums f over the 32 segments of ceil(len / 32) positions of [lo, lo + len) (warp w: segment w)
// into s.seg; every thread gets the total.
template <typename F>
__device__ u64 segment_sums(int64_t lo, int64_t len, F& f, Smem& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t seg = (len + kWarps - 1) / kWarps;
  const int64_t a = lo + warp * seg, e = min(lo + len, a + seg);
  u64 sum = 0;
  for (int64_t q = a + lane; q < e; q += 32) sum += f(q);
  sum = detail::warp_reduce(sum, detail::SumOp{});
  __syncthreads();  // readers of the previous sums are done
  if (lane == 0) s.seg[warp] = sum;
  __syncthreads();
  u64 total = 0;
  for (int w = 0; w < kWarps; ++w) total += s.seg[w];
  return total;
}

// With s.seg = segment_sums(lo, len, f): the first position of [lo, lo + len) at which the running
// sum of f exceeds target (target < total). One segment level per pass; the last <= 32 positions are
// scanned by every warp at once, so every thread gets the position.
template <typename F>
__device__ int64_t descend(int64_t lo, int64_t len, u64 target, F& f, Smem& s) {
  while (true) {
    const int64_t seg = (len + kWarps - 1) / kWarps;
    int w = 0;
    for (; w < kWarps - 1; ++w) {
      const u64 v = s.seg[w];
      if (target < v) break;
      target -= v;
    }
    lo += w * seg;
    len = min(seg, len - w * seg);
    if (len <= 32) break;
    segment_sums(lo, len, f, s);
  }
  const int lane = threadIdx.x % 32;
  const u64 incl = warp_inclusive_sum(lane < len ? f(lo + lane) : u64(0));
  const unsigned hit = __ballot_sync(kFull, incl > target);
  return lo + (hit ? __ffs(hit) - 1 : len - 1);
}

// ---------------------------------------------------------------------------------------------
// The sampled path (steps 3-9) of one row with finite max m

// The outcome of a draw: the token and the kept mass (every thread), and the token's kept weight
// (thread 0 only: the thread that writes the outputs, so no other thread reads the counts row late).
// mass 0: no draw happened, a point mass.
struct Drawn {
  int32_t token;
  u64 weight, mass;
};

// Steps 8-9 when no cut applies: every element of weight >= min_w is kept, so the draw needs no
// candidate list. warp_mass: this warp's chunk's kept mass (every lane); the target's chunk is then
// searched by descent, recomputing the weights from the row.
__device__ __noinline__ Drawn draw_uncut(const Row& r, const ops::SamplingRow& p, int64_t V, float m, int32_t first,
                                         u64 min_w, u64 warp_mass, Smem& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) s.seg[warp] = warp_mass;
  __syncthreads();
  u64 kept = 0;
  for (int k = 0; k < kWarps; ++k) kept += s.seg[k];
  if (kept == 0) return Drawn{first, 0, 0};
  u64 target = sm::draw_target(sm::row_uniform(p), kept);
  int w = 0;
  for (; w < kWarps - 1; ++w) {
    if (target < s.seg[w]) break;
    target -= s.seg[w];
  }
  int64_t lo, hi;
  chunk_of(V, w, &lo, &hi);
  auto row_weight = [&](int64_t q) -> u64 {
    const float z = value(r, __ldg(r.logits + q), r.counts ? r.counts[q] : 0);
    const u64 wq = sm::weight(sm::fsub(z, m));
    return wq >= min_w ? wq : 0;
  };
  if (hi <= lo) return Drawn{first, 0, 0};  // only when the promise of exact sums is broken
  segment_sums(lo, hi - lo, row_weight, s);
  const int64_t q = descend(lo, hi - lo, target, row_weight, s);
  if (q < 0 || q >= V) return Drawn{first, 0, 0};
  return Drawn{static_cast<int32_t>(q), threadIdx.x == 0 ? row_weight(q) : 0, kept};
}

__device__ Drawn sample_row(const Row& r, const ops::SamplingRow& p, int64_t V, float m, int32_t first,
                            uint32_t* keys, int32_t* index, Smem& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t lo, hi;
  chunk_of(V, warp, &lo, &hi);

  // F2: buckets (steps 3-4) when a cut may apply, and per warp the mass every element would keep
  // without a cut (step 8 only).
  const bool cuts = p.top_k > 0 || p.top_p < 1.0f;
  const u64 min_w = sm::min_p_floor(p.min_p);
  if (cuts) clear_hist(s);
  __syncthreads();
  u64 uncut = 0;
  walk_chunk(r, lo, hi, [&](int64_t i, const float (&v)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (i + j >= hi) continue;
      const float d = sm::fsub(v[j], m);
      const int b = sm::bucket(d);
      if (b == sm::kZeroBucket) continue;
      const u64 wj = sm::weight(d);
      if (cuts) hist_add(s, b, wj);
      uncut += wj >= min_w ? wj : 0;
    }
  });
  __syncthreads();
  if (cuts) merge_hist(s, s.bucket_count, s.bucket_mass);
  __syncthreads();

  // Step 5: the buckets of the cuts (warp 0), seen by every thread after the barrier.
  u64 n_pos = 0, total = 0;
  if (cuts) {
    for (int q = 0; q < 8; ++q) n_pos += s.bucket_count[8 * lane + q], total += s.bucket_mass[8 * lane + q];
    n_pos = detail::warp_reduce(n_pos, detail::SumOp{});
    total = detail::warp_reduce(total, detail::SumOp{});
  }
  const bool k_on = p.top_k > 0 && static_cast<u64>(p.top_k) < n_pos;
  const bool p_on = p.top_p < 1.0f;
  if (!k_on && !p_on) return draw_uncut(r, p, V, m, first, min_w, detail::warp_reduce(uncut, detail::SumOp{}), s);
  if (warp == 0) {
    if (k_on)
      warp_pick(s.bucket_count, s.bucket_mass, true, false, static_cast<u64>(p.top_k), &s.pick_k);
    else if (p_on)
      warp_pick(s.bucket_count, s.bucket_mass, true, true, sm::top_p_target(p.top_p, total), &s.pick_p);
  }
  __syncthreads();
  const int bc = k_on ? s.pick_k.bin : s.pick_p.bin;

  // F3: the candidates (step 6), in index order: warp w writes its chunk's at its offset.
  uint32_t mine = 0;
  for (int q = 0; q < 8; ++q) mine += 8 * lane + q <= bc ? s.warp_count[warp][8 * lane + q] : 0u;
  mine = detail::warp_reduce(mine, detail::SumOp{});
  if (lane == 0) s.red32[warp] = mine;
  __syncthreads();
  int64_t offset = 0, n = 0;
  for (int k = 0; k < kWarps; ++k) offset += k < warp ? s.red32[k] : 0u, n += s.red32[k];
  walk_chunk(r, lo, hi, [&](int64_t i, const float (&v)[4]) {
    bool take[4];
    int count = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      take[j] = i + j < hi && sm::bucket(sm::fsub(v[j], m)) <= bc;
      count += take[j];
    }
    const int incl = warp_inclusive_sum(count);
    int64_t pos = offset + incl - count;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (!take[j]) continue;
      keys[pos] = sm::order_key(v[j]);
      index[pos] = static_cast<int32_t>(i + j);
      ++pos;
    }
    offset += __shfl_sync(kFull, incl, 31);
  });
  __syncthreads();

  // Step 7.
  Cut cut{0, kAllTies, 0};
  u64 kept_mass = total;
  if (k_on) {
    const Pick pk = s.pick_k;
    cut = select_in_bucket(keys, n, m, pk.bin, false, static_cast<u64>(p.top_k) - pk.count_before,
                           s.bucket_count[pk.bin], s);
    kept_mass = pk.mass_before + cut.mass;
  }
  if (p_on) {
    const u64 target = sm::top_p_target(p.top_p, kept_mass);
    __syncthreads();
    if (warp == 0) warp_pick(s.bucket_count, s.bucket_mass, true, true, target, &s.pick_p);
    __syncthreads();
    const Pick pp = s.pick_p;
    cut = select_in_bucket(keys, n, m, pp.bin, true, target - pp.mass_before, s.bucket_count[pp.bin], s);
  }

  // The position of the last kept tie, then steps 8-9.
  int64_t tie_end = n;
  if (cut.ties != kAllTies) {
    auto is_tie = [&](int64_t q) -> u64 { return keys[q] == cut.key ? 1 : 0; };
    segment_sums(0, n, is_tie, s);
    tie_end = descend(0, n, cut.ties - 1, is_tie, s);
  }
  auto kept_weight = [&](int64_t q) -> u64 {
    const uint32_t key = keys[q];
    if (key < cut.key || (key == cut.key && q > tie_end)) return 0;
    const u64 wq = sm::weight(sm::fsub(sm::key_value(key), m));
    return wq >= min_w ? wq : 0;
  };
  const u64 kept = segment_sums(0, n, kept_weight, s);
  if (kept == 0) return Drawn{first, 0, 0};
  const int64_t q = descend(0, n, sm::draw_target(sm::row_uniform(p), kept), kept_weight, s);
  // Always in range on valid inputs; the guard keeps a broken promise (two rows sharing a counts
  // row) from writing outside the counts row.
  const int32_t token = q >= 0 && q < n ? index[q] : -1;
  if (token < 0 || token >= V) return Drawn{first, 0, 0};
  return Drawn{token, threadIdx.x == 0 ? kept_weight(q) : 0, kept};
}

__global__ void __launch_bounds__(kThreads, 1)
    sample_kernel(int32_t* tokens, float* logprobs, const float* logits, int64_t V, const ops::SamplingRow* params,
                  int32_t* counts, int64_t count_rows, char* workspace, int64_t row_bytes, bool vec) {
  __shared__ Smem s;
  hopper::launch_dependents();  // what follows (the step's output copy) waits for this grid
  const int64_t b = blockIdx.x;
  const ops::SamplingRow& p = params[b];
  const int32_t counts_row = p.counts_row;
  int32_t* crow = counts && counts_row >= 0 && counts_row < count_rows ? counts + counts_row * V : nullptr;
  const Row r{logits + b * V, crow, p.temperature, p.repetition_penalty, p.frequency_penalty, p.presence_penalty,
              !(p.temperature > 0.0f), vec};
  int64_t lo, hi;
  chunk_of(V, threadIdx.x / 32, &lo, &hi);

  // F1 (steps 1-2).
  ArgMax best{-INFINITY, INT_MAX};
  walk_chunk(r, lo, hi, [&](int64_t i, const float (&v)[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (i + j < hi) best = better(best, ArgMax{v[j], static_cast<int32_t>(i + j)});
  });
  best = block_argmax(best, s.arg);
  if (!r.greedy && !isfinite(best.v)) {
    // Step 2's infinite maximum (a temperature that overflowed finite values among them): the greedy
    // token, the first index of the largest x.
    Row x = r;
    x.greedy = true;
    best = ArgMax{-INFINITY, INT_MAX};
    walk_chunk(x, lo, hi, [&](int64_t i, const float (&v)[4]) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (i + j < hi) best = better(best, ArgMax{v[j], static_cast<int32_t>(i + j)});
    });
    best = block_argmax(best, s.arg);
    best.v = INFINITY;  // no draw follows
  }
  Drawn d{best.i, 0, 0};  // greedy or no finite maximum: a point mass
  if (!r.greedy && isfinite(best.v)) {
    char* ws = workspace + b * row_bytes;
    d = sample_row(r, p, V, best.v, best.i, reinterpret_cast<uint32_t*>(ws),
                   reinterpret_cast<int32_t*>(ws + sm::align256(4 * V)), s);
  }
  // Step 10, and the behaviour log-prob (the raw ones come from logprob_kernel). Every read of the
  // counts row by another thread happened before a barrier thread 0 has passed.
  if (threadIdx.x == 0) {
    tokens[b] = d.token;
    if (logprobs && p.logprobs == ops::kLogprobsSampled) logprobs[b] = sm::drawn_logprob(d.weight, d.mass);
    if (crow) crow[d.token] += 1;
  }
}

// `full` false: tokens[b] = the first index of the largest raw logit (NaN as -inf); step 10.
template <int N>
__global__ void __launch_bounds__(kThreads)
    argmax_kernel(int32_t* tokens, const float* logits, int64_t V, const ops::SamplingRow* params, int32_t* counts,
                  int64_t count_rows) {
  __shared__ ArgMax smem[32];
  hopper::launch_dependents();  // what follows (the step's output copy) waits for this grid
  const int64_t base = static_cast<int64_t>(blockIdx.x) * V;
  constexpr int kUnroll = 4;  // loads in flight per thread: one block streams a whole row
  constexpr int64_t kStride = static_cast<int64_t>(kThreads) * N;
  ArgMax best{-INFINITY, INT_MAX};
  for (int64_t i0 = static_cast<int64_t>(threadIdx.x) * N; i0 < V; i0 += kStride * kUnroll) {
    float v[kUnroll][N];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i0 + u * kStride < V) detail::load_vec<N>(logits, base + i0 + u * kStride, DType::f32, v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = i0 + u * kStride;
      if (i < V) {
#pragma unroll
        for (int k = 0; k < N; ++k) best = better(best, ArgMax{sm::clean(v[u][k]), static_cast<int32_t>(i + k)});
      }
    }
  }
  best = block_argmax(best, smem);
  if (threadIdx.x == 0) {
    tokens[blockIdx.x] = best.i;
    const int32_t row = params[blockIdx.x].counts_row;
    if (counts && row >= 0 && row < count_rows) counts[row * V + best.i] += 1;
  }
}

__global__ void reset_counts_kernel(int32_t* row, int64_t V, const int32_t* prompt, int64_t n_prompt,
                                    const int32_t* output, int64_t n_output) {
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n_prompt + n_output;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool in_prompt = k < n_prompt;
    const int32_t id = in_prompt ? prompt[k] : output[k - n_prompt];
    if (id < 0 || id >= V) continue;
    if (in_prompt)
      atomicOr(&row[id], ops::kPromptBit);
    else
      atomicAdd(&row[id], 1);
  }
}

// Grid (blocks over the vocabulary, B): rows without a mask return at once.
// The masks and the biases touch disjoint elements (a bias only where the mask allows its token,
// and a row's bias ids are distinct), so the blocks need no order between them.
__global__ void adjust_logits_kernel(float* __restrict__ logits, int64_t V, const ops::SamplingRow* __restrict__ params,
                                     const uint32_t* __restrict__ words, int64_t n_words) {
  const ops::SamplingRow& p = params[blockIdx.y];
  const int32_t off = p.mask_offset;
  float* row = logits + static_cast<int64_t>(blockIdx.y) * V;
  auto allowed = [&](int64_t v) {
    const int64_t w = off + (v >> 5);
    return off < 0 || (w < n_words && (words[w] >> (v & 31) & 1u));
  };
  if (off >= 0)
    for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < V;
         v += static_cast<int64_t>(gridDim.x) * blockDim.x)
      if (!allowed(v)) row[v] = -INFINITY;
  if (p.bias_offset < 0) return;
  for (int32_t k = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x); k < p.bias_count;
       k += static_cast<int32_t>(gridDim.x * blockDim.x)) {
    const int64_t w = p.bias_offset + 2 * static_cast<int64_t>(k);
    if (w + 1 >= n_words) break;
    const int64_t id = static_cast<int32_t>(words[w]);
    if (id < 0 || id >= V || !allowed(id)) continue;
    row[id] += __uint_as_float(words[w + 1]);
  }
}

}  // namespace

void adjust_logits(CudaBackend& be, Tensor logits, Tensor params, Tensor mask_words) {
  detail::check_float(be, logits);
  detail::check_i32(be, params);
  detail::check_i32(be, mask_words);
  const int64_t B = logits.size(0), V = logits.size(1);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((V + kThreads - 1) / kThreads, 64));
  adjust_logits_kernel<<<dim3(blocks, static_cast<unsigned>(B)), kThreads, 0, detail::stream_of(be)>>>(
      logits.ptr<float>(), V, reinterpret_cast<const ops::SamplingRow*>(params.data),
      reinterpret_cast<const uint32_t*>(mask_words.data), mask_words.numel());
  KILN_CUDA_CHECK_LAUNCH();
}

void sample(CudaBackend& be, const ops::SamplingBatch& s) {
  detail::check_float(be, s.logits);
  detail::check_i32(be, s.params);
  detail::check_i32(be, s.tokens);
  const int64_t B = s.logits.size(0), V = s.logits.size(1);
  cudaStream_t stream = detail::stream_of(be);
  const auto* params = reinterpret_cast<const ops::SamplingRow*>(s.params.data);
  int32_t* counts = nullptr;
  int64_t count_rows = 0;
  if (sm::present(s.counts)) {
    detail::check_i32(be, s.counts);
    counts = s.counts.ptr<int32_t>();
    count_rows = s.counts.size(0);
  }
  const float* logits = s.logits.ptr<const float>();
  int32_t* tokens = s.tokens.ptr<int32_t>();
  const unsigned grid = static_cast<unsigned>(B);

  if (!s.full) {
    if (V % 8 == 0 && detail::aligned16(logits))
      argmax_kernel<8><<<grid, kThreads, 0, stream>>>(tokens, logits, V, params, counts, count_rows);
    else
      argmax_kernel<1><<<grid, kThreads, 0, stream>>>(tokens, logits, V, params, counts, count_rows);
    KILN_CUDA_CHECK_LAUNCH();
    return;
  }
  KILN_ASSERT(s.workspace.device == be.device() && s.workspace.data != nullptr);
  char* ws = static_cast<char*>(s.workspace.data);
  const int64_t row_bytes = sm::row_workspace_bytes(V);
  const bool vec = V % 4 == 0 && detail::aligned16(logits) && (!counts || detail::aligned16(counts));
  float* logprobs = nullptr;  // sample_kernel writes the behaviour log-probs (kLogprobsSampled rows)
  if (sm::present(s.logprobs)) {
    detail::check_float(be, s.logprobs);
    logprobs = s.logprobs.ptr<float>();
  }
  sample_kernel<<<grid, kThreads, 0, stream>>>(tokens, logprobs, logits, V, params, counts, count_rows, ws, row_bytes,
                                               vec);
  KILN_CUDA_CHECK_LAUNCH();

  sampler::launch_logprobs(be, s, ws, row_bytes);
}

void reset_token_counts(CudaBackend& be, Tensor counts_row, Tensor prompt, Tensor output) {
  detail::check_i32(be, counts_row);
  const int64_t n_prompt = sm::present(prompt) ? prompt.numel() : 0;
  const int64_t n_output = sm::present(output) ? output.numel() : 0;
  if (n_prompt) detail::check_i32(be, prompt);
  if (n_output) detail::check_i32(be, output);
  be.zero(counts_row);
  if (n_prompt + n_output == 0) return;
  const int threads = 256;
  reset_counts_kernel<<<detail::grid_for(be, n_prompt + n_output, threads), threads, 0, detail::stream_of(be)>>>(
      counts_row.ptr<int32_t>(), counts_row.numel(), n_prompt ? prompt.ptr<const int32_t>() : nullptr, n_prompt,
      n_output ? output.ptr<const int32_t>() : nullptr, n_output);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
