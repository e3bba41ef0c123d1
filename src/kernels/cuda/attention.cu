// CUDA causal grouped-query attention over a packed batch with keys/values in a paged cache
// (kiln::cuda::attention_forward; semantics in kernels/ops.h, the paged view in kernels/paged_kv.h).
//
// Math: for request b, query row i (0 <= i < q_len) and query head h,
//   pos = kv_len - q_len + i,  s_j = scale * <q[i,h], k[j, h / (Hq/Hkv)]>  for keys j = 0..pos,
//   out[i,h] = sum_j softmax(s)_j v[j, h / (Hq/Hkv)],
// with q [T,Hq,D] rows q_indptr[b].., and key j of request b at pool row (of k/v [S,Hkv,D])
//   row(b, j) = page_indices[page_indptr[b] + j / page_size] * page_size + j % page_size,
// i.e. paged_kv_slot() of kernels/paged_kv.h, kv_len = paged_kv_len() (a request with no pages has
// none). Every page size >= 1 works; j / page_size is a multiply-high and shifts by host-computed
// constants (PageDivisor: a plain shift for a power of two). The page table is read once per key
// of a K/V tile (prefill and decode) or once per page (generic), never per element.
// The softmax is computed online in f32 in the log2 domain (s * scale * log2 e, ex2.approx);
// products on tensor cores take bf16/f16 operands with f32 accumulation; P is rounded to the input
// type for the PV product, except in the (memory-bound) decode kernel, where bf16 P is carried as
// hi + lo parts.
//
// Three kernel families, picked on the host from the bounds (never from device data):
//  1. Decode / short queries (bf16/f16, D in {64,128}, max_q_len * G <= 64 where G = Hq/Hkv):
//     split-KV "flash decoding". The rows of one kv head's query group are packed as
//     R = i * G + (h % G) and cut in tiles of 16 rows (one mma M tile), so K/V are read once per
//     GQA group. Grid (splits, Hkv * row_tiles, B), 4 warps per block. Each block takes one
//     contiguous key range of its split and streams its K/V rows through a ring of shared-memory
//     stages of 64 keys filled by cp.async (three stages, two in flight while one is computed; 2
//     to 4 blocks per SM, set by the shared memory a block asks for, which leaves room for the
//     neighbouring kernels' blocks); warp w computes the keys 16w.. of each stage on mma.sync
//     m16n8k16 (K and V by ldmatrix from swizzled tiles, Q in registers). Stages holding only keys
//     cached before the step are copied before the wait for the kernel that wrote q (programmatic
//     launch). The warps' (m, l, acc) are merged through shared memory; with one split the block
//     writes `out`. Two splits are merged in the kernel: the tile's two blocks form a cluster and
//     each finishes half the rows from both blocks'
//     (acc/l, lse) in distributed shared memory. More splits write (acc/l, lse) to scratch and a
//     combine kernel merges them (one block per (row, head); its warps sum interleaved splits).
//     Paging: each copying thread looks up the pages of its rows of the next stage a stage ahead
//     (a page-table read per row, whatever the page size). Input stage (attention_decode_rope_forward,
//     one query per request, G <= 16): the block reads the q/k/v projection's row instead of q,
//     norms and rotates its query heads into shared memory, and the block whose split holds the new
//     key writes it and the value to the pool before copying that stage.
//     Splits: num_splits = clamp(S, 1, ceil(max_kv_len / 64)), S the count (from floor(W / base)
//     to 2W / base) that fills whole waves best, base = B * Hkv * row_tiles, W = SMs * resident
//     decode blocks per SM (2, 3 or 4 for D=64, 2 for D=128; attention_decode.cu picks them and trades
//     three or more splits for two merged ones where those make half a wave); each block at least
//     64 keys. Each block computes its key
//     range on the device from the true lengths: active = min(num_splits, ceil(n_keys / 64)),
//     steps = ceil(n_keys / 16), ceil(steps / active) steps per split, so a graph captured with
//     large bounds still spreads a short context over the splits, and gives bit-identical results
//     to an eager call with tighter max_kv_len (splits past `active` are empty: lse = -inf, o = 0,
//     and add exact zeros in the combine). Scratch: B*max_q_len*Hq*max_splits*(D+1) floats
//     (max_splits: the split count without the max_kv_len cap), independent of max_kv_len.
//  2. Prefill (bf16/f16, D in {64,128}, longer query runs): FlashAttention-2 style. Grid
//     (ceil(max_q_len / BM), Hq, B) with the heaviest (last) query tiles launched first; block of
//     4 warps, BM = 128 (D=64, two 16-row M tiles per warp) or 64 (D=128) query rows, BN = 64 keys
//     per tile; Q/K/V tiles in XOR-swizzled shared memory filled by cp.async (K/V double
//     buffered, rows past the end zero-filled), ldmatrix(.trans) fragments, mma.sync m16n8k16.
//     Key tiles past the block's last query position are skipped; only tiles that cross the
//     diagonal (or the end of the keys) are masked.
//     That is variant 0 (the fallback off sm_90). On sm_90a Hopper one wgmma kernel (2b, for
//     D=64 and D=128) serves variants 1 and 2: a warpgroup per 64 query rows, S = Q K^T with both
//     operands from shared-memory descriptors, O += P V with P from registers and V as an
//     MN-major descriptor, K/V double buffered. Variant 1: 1 warpgroup (BM=64), 128-key tiles for
//     D=64 (64 for D=128); variant 2: 2 warpgroups sharing the K/V tiles (BM=128), 64-key tiles.
//     Paging (variants 0-2, TileRows): the pool rows of each K/V tile's keys are put in shared
//     memory ahead of its copies, one page-table read per key (thread r of the block for key r of
//     the tile, its latency hidden behind a tile of compute); the cp.async copies read their row
//     there, so a tile costs the same for every page size and for keys scattered over any pages.
//     Variant 3 (attention_ws.cu) is warp-specialised like FlashAttention-3: a producer
//     warpgroup (registers lowered) loads Q by TMA and K/V by TMA boxes of up to 128 pool rows of
//     one page (pages of >= 64 rows, or one contiguous page; the request's last tile copied with
//     zeros past its keys) or, for smaller pages, by cp.async with TileRows, into a ring of
//     stages tracked by mbarriers; consumer warpgroups (registers raised; D=64: 3 with BM=192,
//     D=128: 2 with BM=128; BN=128) keep the next tile's S wgmma and the previous tile's PV wgmma
//     in flight while they run the softmax, and take turns at the tensor cores (ping-pong, named
//     barriers). Its blocks take their (head, query tile) longest first over the whole grid:
//     every head's tile of a row range before the next lighter range. The same kernel, in its dense layout (q, k, v [B, H, S, D] viewed as [B*H*S, D]
//     by the tensor maps, segment-id masks and tile skipping, lse out), is the training forward
//     of attention_train.cu. Defaults per call (prefill_default_variant; figures in
//     kernels/cuda/attention_internal.h): D=64 -> 3 when its grid fills two waves of the SMs,
//     else 1 (short prefills); D=128 -> 3 when the page size takes TMA boxes, else 2. The
//     environment variable KILN_ATTN_PREFILL_VARIANT=N (read once per backend) overrides the
//     default for every call; tests/benchmarks: CudaBackend::set_attention_prefill_variant.
//  3. Generic (any even D <= 256, f32/bf16/f16, or unaligned pointers): one warp per (query row,
//     head), online softmax over keys one at a time, walking the request's pages (one page-table
//     read per page). Slow; for correctness on other shapes.
// Every launch goes on the backend's stream; no host synchronisation and no allocation other than
// be.scratch(), so the decode path can be captured in a CUDA graph (size scratch before capture).
// Blocks beyond a request's true q_len (from the device indptr) exit early, before reading the page
// arrays: a padding request (no queries, no pages) computes nothing and rows of q/out that belong
// to no request are not touched. Device facts (wgmma support, occupancy, raised shared-memory
// limits) and the environment's variant live in the backend (AttentionState), not in statics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>

#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace kiln::cuda {
namespace attn {

namespace {

// The environment's prefill variant, -1 if none (read when a backend's state is created).
int read_env_prefill_variant() {
  const char* e = std::getenv("KILN_ATTN_PREFILL_VARIANT");
  if (e == nullptr || *e == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(e, &end, 10);
  if (*end != '\0' || n < 0 || n >= kPrefillVariantCount) {
    std::fprintf(stderr, "kiln: ignoring KILN_ATTN_PREFILL_VARIANT=%s (want 0..%d)\n", e, kPrefillVariantCount - 1);
    return -1;
  }
  return static_cast<int>(n);
}

}  // namespace

AttentionState& state_of(CudaBackend& be) {
  std::shared_ptr<void>& slot = be.attention_state();
  if (!slot) {
    auto* st = new AttentionState;
    st->device = be.device().index;
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, st->device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, st->device));
    st->has_wgmma = major == 9 && minor == 0;
    st->env_prefill_variant = read_env_prefill_variant();
    slot = std::shared_ptr<void>(st, [](void* p) { delete static_cast<AttentionState*>(p); });
  }
  return *static_cast<AttentionState*>(slot.get());
}

namespace {

// ------------------------------------------------------------------------------------------------
// 3. Generic kernel: one warp per (request, query row, head); any even D <= 256.

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attn_generic_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
                        const T* __restrict__ v_cache, const int* __restrict__ q_indptr, PagedArgs kv, int B,
                        int Hq, int Hkv, int G, int D, int max_q_len, float sl) {
  constexpr int kMaxPairs = 4;  // 4 pairs x 32 lanes = 256 dims
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (p >= static_cast<int64_t>(B) * max_q_len * Hq) return;
  const int h = static_cast<int>(p % Hq);
  const int64_t bi = p / Hq;
  const int i = static_cast<int>(bi % max_q_len);
  const int b = static_cast<int>(bi / max_q_len);
  const int q_start = q_indptr[b];
  const int q_len = q_indptr[b + 1] - q_start;
  if (i >= q_len) return;  // also every warp of a request without queries (padding)
  const int kv_len = request_kv_len(kv, b);
  const PagedKeys keys = request_keys(kv, b);
  const int n = max(0, min(kv_len, kv_len - q_len + i + 1));
  const int kvh = h / G;
  const int pairs = D / 2;

  const T* qrow = q + (static_cast<int64_t>(q_start + i) * Hq + h) * D;
  float2 qv[kMaxPairs], acc[kMaxPairs];
#pragma unroll
  for (int k = 0; k < kMaxPairs; ++k) {
    const int pi = lane + 32 * k;
    qv[k] = pi < pairs ? load2(qrow + 2 * pi) : make_float2(0.f, 0.f);
    acc[k] = make_float2(0.f, 0.f);
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t kv_stride = static_cast<int64_t>(Hkv) * D;
  const T* kbase = k_cache + static_cast<int64_t>(kvh) * D;
  const T* vbase = v_cache + static_cast<int64_t>(kvh) * D;
  // One key: online-softmax update with pool row `row`.
  auto attend = [&](int64_t row) {
    const T* krow = kbase + row * kv_stride;
    const T* vrow = vbase + row * kv_stride;
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxPairs; ++k) {
      const int pi = lane + 32 * k;
      if (pi < pairs) {
        const float2 kk = load2(krow + 2 * pi);
        dot = fmaf(qv[k].x, kk.x, fmaf(qv[k].y, kk.y, dot));
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float s = dot * sl;
    const float m_new = fmaxf(m, s);
    const float alpha = exp2f(m - m_new);
    const float pj = exp2f(s - m_new);
    l = l * alpha + pj;
    m = m_new;
#pragma unroll
    for (int k = 0; k < kMaxPairs; ++k) {
      const int pi = lane + 32 * k;
      if (pi < pairs) {
        const float2 vv = load2(vrow + 2 * pi);
        acc[k].x = fmaf(pj, vv.x, acc[k].x * alpha);
        acc[k].y = fmaf(pj, vv.y, acc[k].y * alpha);
      }
    }
  };
  // Keys 0 .. n - 1 page by page: page p holds keys p * size .. in consecutive pool rows from
  // pages[p] * size (one page-table read per page, for every page size).
  const int n_pages = n > 0 ? keys.page(n - 1) + 1 : 0;
  for (int p = 0; p < n_pages; ++p) {
    const int64_t page_row = static_cast<int64_t>(keys.page_id(p)) * keys.size;
    const int in_page = min(keys.size, n - p * keys.size);
    for (int jj = 0; jj < in_page; ++jj) attend(page_row + jj);
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* orow = out + (static_cast<int64_t>(q_start + i) * Hq + h) * D;
#pragma unroll
  for (int k = 0; k < kMaxPairs; ++k) {
    const int pi = lane + 32 * k;
    if (pi < pairs) store2(orow + 2 * pi, acc[k].x * inv, acc[k].y * inv);
  }
}

// Division by the page size for 0 <= j < 2^31 (PagedArgs): with l = ceil(log2(size)) and
// magic = floor(2^32 * (2^l - size) / size) + 1 (< 2^32), j / size == (umulhi(j, magic) + j) >> l
// (division by an invariant integer, Granlund & Montgomery 1994; for j < 2^31 the sum fits in 32
// bits). A power of two has magic 1, and umulhi(j, 1) = 0: a plain shift by log2(size).
struct PageDivisor {
  uint32_t magic;
  int shift;
};

PageDivisor page_divisor(int32_t size) {
  KILN_ASSERT(size >= 1);
  int l = 0;
  while ((int64_t{1} << l) < size) ++l;
  const uint64_t num = (uint64_t{1} << 32) * ((uint64_t{1} << l) - static_cast<uint64_t>(size));  // < 2^63
  const uint64_t magic = num / static_cast<uint64_t>(size) + 1;
  KILN_ASSERT(magic <= 0xffffffffull);
  return PageDivisor{static_cast<uint32_t>(magic), l};
}

// Prefill variants (see kernels/cuda/attention_internal.h; figures there): the default per call is
// prefill_default_variant(), from the H200 measurements.
template <typename T>
void launch_generic(CudaBackend& be, const Args& a) {
  const int64_t rows = static_cast<int64_t>(a.B) * a.max_q_len * a.Hq;
  const unsigned blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  attn_generic_kernel<T><<<blocks, kThreads, 0, be.stream()>>>(
      static_cast<T*>(a.out), static_cast<const T*>(a.q), static_cast<const T*>(a.k), static_cast<const T*>(a.v),
      a.q_indptr, a.kv, a.B, a.Hq, a.Hkv, a.G, a.D, a.max_q_len, a.sl);
  CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_prefill_variant(CudaBackend& be, const Args& a, int variant) {
  if (variant != 0 && !state_of(be).has_wgmma) variant = 0;
  if (variant == 0) return launch_prefill_mma<T>(be, a);
  launch_prefill_wgmma<T>(be, a, variant);
}

template <typename T>
void launch_fast(CudaBackend& be, const Args& a) {
  const int row_tiles = (a.max_q_len * a.G + 15) / 16;
  const bool decode = row_tiles <= kDecodeMaxRowTiles;
  if (decode) {
    launch_decode<T>(be, a);
    return;
  }
  const int v = prefill_variant_override(be);
  launch_prefill_variant<T>(be, a, v >= 0 ? v : prefill_default_variant(be, a.D, a.kv.size, a.max_q_len, a.Hq, a.B));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace
}  // namespace attn

using namespace attn;

bool attention_device_has_wgmma(CudaBackend& be) { return state_of(be).has_wgmma; }

void attention_allow_smem(CudaBackend& be, const void* kernel, int bytes) {
  if (bytes <= 0) return;  // (static + dynamic beyond 48 KB needs the attribute too)
  AttentionState& st = state_of(be);
  int& limit = st.smem_limit[kernel];
  if (limit >= bytes) return;
  with_device(st.device,
              [&] { CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)); });
  limit = bytes;
}

int prefill_variant_override(CudaBackend& be) {
  const int v = be.attention_prefill_variant();
  if (v >= 0) {
    KILN_ASSERT(v < kPrefillVariantCount);
    return v;
  }
  return state_of(be).env_prefill_variant;
}

int prefill_default_variant(CudaBackend& be, int head_dim, int page_size, int max_q_len, int Hq, int B) {
  if (!state_of(be).has_wgmma) return 0;
  if (head_dim == 128) return ws_box_rows(page_size) > 0 ? 3 : 2;
  const int bm = ws_block_rows(head_dim);
  const int64_t blocks = static_cast<int64_t>((max_q_len + bm - 1) / bm) * Hq * B;  // variant 3's grid
  return blocks >= 2 * static_cast<int64_t>(be.multiprocessor_count()) ? 3 : 1;
}

const char* prefill_variant_name(int v) {
  static const char* const kNames[kPrefillVariantCount] = {
      "mma.sync 4 warps, BN64, Q regs (fallback off sm_90; D=64 32 rows/warp, D=128 16)",
      "wgmma 1 WG BM64, BN128 (D=128: BN64)",
      "wgmma 2 WG BM128, BN64",
      "warp-specialised: producer WG (TMA / cp.async), ping-pong consumer WGs (D=64: 3, BM192; D=128: 2, BM128), BN128",
  };
  return v >= 0 && v < kPrefillVariantCount ? kNames[v] : "?";
}

namespace {

// The launch arguments of an attention call, after checking its tensors (ops.h states the shapes).
Args attention_args(Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_indptr, const PagedKV& paged,
                    ops::AttentionBounds bounds, float scale) {
  KILN_ASSERT(q.ndim() == 3 && out.shape == q.shape);
  KILN_ASSERT(k_cache.ndim() == 3 && v_cache.shape == k_cache.shape);
  KILN_ASSERT(k_cache.size(2) == q.size(2));
  KILN_ASSERT(q.dtype == out.dtype && q.dtype == k_cache.dtype && q.dtype == v_cache.dtype);
  KILN_ASSERT(q.dtype == DType::f32 || q.dtype == DType::bf16 || q.dtype == DType::f16);
  KILN_ASSERT(q_indptr.dtype == DType::i32 && paged.page_indptr.dtype == DType::i32 &&
              paged.page_indices.dtype == DType::i32 && paged.last_page_len.dtype == DType::i32);
  KILN_ASSERT(bounds.batch >= 0 && bounds.max_q_len >= 0 && bounds.max_kv_len >= 0);
  KILN_ASSERT(q_indptr.ndim() == 1 && q_indptr.numel() == bounds.batch + 1);
  KILN_ASSERT(paged.page_indptr.ndim() == 1 && paged.page_indptr.numel() == bounds.batch + 1);
  KILN_ASSERT(paged.page_indices.ndim() == 1 && paged.last_page_len.ndim() == 1 &&
              paged.last_page_len.numel() >= bounds.batch);
  KILN_ASSERT(paged.page_size >= 1);
  KILN_ASSERT(k_cache.size(0) <= INT32_MAX);  // pool rows are int32 in the kernels
  KILN_ASSERT(q.device.is_cuda() && out.device.is_cuda() && k_cache.device.is_cuda() && v_cache.device.is_cuda() &&
              q_indptr.device.is_cuda() && paged.page_indptr.device.is_cuda());
  KILN_ASSERT(paged.page_indices.numel() == 0 || paged.page_indices.device.is_cuda());
  KILN_ASSERT(paged.last_page_len.numel() == 0 || paged.last_page_len.device.is_cuda());
  const int64_t Hq = q.size(1), Hkv = k_cache.size(1), D = q.size(2);
  KILN_ASSERT(Hkv > 0 && Hq % Hkv == 0);
  KILN_ASSERT(D > 0 && D % 2 == 0 && D <= 256);
  KILN_ASSERT(bounds.batch <= 65535 && Hq <= 65535);
  Args a;
  a.out = out.data;
  a.q = q.data;
  a.k = k_cache.data;
  a.v = v_cache.data;
  a.q_indptr = q_indptr.ptr<int>();
  const PageDivisor div = page_divisor(paged.page_size);
  a.kv = PagedArgs{paged.page_indptr.ptr<int>(), paged.page_indices.ptr<int>(), paged.last_page_len.ptr<int>(),
                   paged.page_size, div.magic, div.shift};
  a.B = bounds.batch;
  a.Hq = static_cast<int>(Hq);
  a.Hkv = static_cast<int>(Hkv);
  a.G = static_cast<int>(Hq / Hkv);
  a.D = static_cast<int>(D);
  a.max_q_len = bounds.max_q_len;
  a.max_kv_len = bounds.max_kv_len;
  a.q_rows = q.size(0);
  a.kv_rows = k_cache.size(0);
  a.sl = scale * kLog2e;
  return a;
}

// Whether a call has anything to compute: requests, queries and query rows.
bool has_work(const Args& a) { return a.B > 0 && a.max_q_len > 0 && a.q_rows > 0; }

}  // namespace

void attention_forward(CudaBackend& be, Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor q_indptr,
                       const PagedKV& paged, ops::AttentionBounds bounds, float scale) {
  const Args a = attention_args(out, q, k_cache, v_cache, q_indptr, paged, bounds, scale);
  if (!has_work(a)) return;
  const bool fast = (q.dtype == DType::bf16 || q.dtype == DType::f16) && (a.D == 64 || a.D == 128) &&
                    aligned16(a.out) && aligned16(a.q) && aligned16(a.k) && aligned16(a.v);
  if (fast) {
    if (q.dtype == DType::bf16)
      launch_fast<__nv_bfloat16>(be, a);
    else
      launch_fast<__half>(be, a);
    return;
  }
  switch (q.dtype) {
    case DType::f32:
      launch_generic<float>(be, a);
      break;
    case DType::bf16:
      launch_generic<__nv_bfloat16>(be, a);
      break;
    case DType::f16:
      launch_generic<__half>(be, a);
      break;
    default:
      KILN_ASSERT(false);
  }
}

bool attention_decode_rope_supported(const Tensor& q, const Tensor& k_cache, ops::AttentionBounds bounds) {
  if (q.ndim() != 3 || k_cache.ndim() != 3 || k_cache.size(1) == 0) return false;
  const int64_t D = q.size(2), G = q.size(1) / k_cache.size(1);
  return (q.dtype == DType::bf16 || q.dtype == DType::f16) && (D == 64 || D == 128) && G <= 16 &&
         bounds.max_q_len <= 1;
}

// Measured on the H200 (bench_decode_step, ms per step, the separate rotary kernel against the
// stage in the decode kernel, two alternations in one call; astrai-1b / llama-1b / a Qwen3-0.6B
// shape with q/k norms): contexts up to 4K gain at 32 to 128 rows (astrai-1b 1K B = 32 / 64 / 128
// 1.522 / 1.693 / 2.170 -> 1.495 / 1.682 / 2.135; 4K 2.085 / 2.780 / 4.428 -> 2.062 / 2.804 / 4.374;
// llama-1b 1K 1.358 / 1.655 / 2.268 -> 1.345 / 1.625 / 2.243) and, for the q/k-norm shape, from one
// row (B = 1 / 8 / 32 / 64 at 1K 0.809 / 1.109 / 2.301 / 3.258 -> 0.792 / 1.047 / 2.236 / 3.101);
// at 16 rows it is no faster (astrai-1b 1.327 -> 1.336 at 1K) and from 8K on it loses more often
// than it gains (astrai-1b B=16 at 30K 3.935 -> 4.150, llama-1b B=32 at 16K 4.98 -> 5.06; why the
// longer contexts lose was not found: the main loop's code is the same). Both ways give the same
// bits, so the choice may follow the bounds.
bool attention_decode_rope_preferred(const Tensor& q, const Tensor& k_cache, ops::AttentionBounds bounds) {
  const int64_t rows = static_cast<int64_t>(bounds.batch) * bounds.max_q_len;
  return attention_decode_rope_supported(q, k_cache, bounds) && bounds.max_kv_len <= 4096 && (rows <= 8 || rows > 16);
}

void attention_decode_rope_forward(CudaBackend& be, Tensor out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor qkv,
                                   Tensor positions, Tensor slots, Tensor inv_freq, float attention_scaling,
                                   Tensor q_norm, Tensor k_norm, float eps, Tensor q_indptr, const PagedKV& paged,
                                   ops::AttentionBounds bounds, float scale) {
  KILN_ASSERT(attention_decode_rope_supported(q, k_cache, bounds));
  Args a = attention_args(out, q, k_cache, v_cache, q_indptr, paged, bounds, scale);
  KILN_ASSERT(aligned16(a.out) && aligned16(a.k) && aligned16(a.v));
  KILN_ASSERT(qkv.ndim() == 2 && qkv.size(0) == q.size(0) && qkv.size(1) == (a.Hq + 2 * a.Hkv) * a.D &&
              qkv.dtype == q.dtype && qkv.device == be.device());
  KILN_ASSERT(positions.dtype == DType::i32 && slots.dtype == DType::i32 && positions.numel() == q.size(0) &&
              slots.numel() == q.size(0));
  KILN_ASSERT(inv_freq.dtype == DType::f32 && inv_freq.numel() == a.D / 2);
  KILN_ASSERT(!q_norm.data || q_norm.numel() == a.D);
  KILN_ASSERT(!k_norm.data || k_norm.numel() == a.D);
  if (!has_work(a)) return;
  a.input.qkv = qkv.data;
  a.input.positions = positions.ptr<const int32_t>();
  a.input.slots = slots.ptr<const int32_t>();
  a.input.inv_freq = inv_freq.ptr<const float>();
  a.input.q_norm = q_norm.data;
  a.input.k_norm = k_norm.data;
  a.input.q_norm_dt = q_norm.dtype;
  a.input.k_norm_dt = k_norm.dtype;
  a.input.scaling = attention_scaling;
  a.input.eps = eps;
  if (q.dtype == DType::bf16)
    launch_decode<__nv_bfloat16>(be, a);
  else
    launch_decode<__half>(be, a);
}

}  // namespace kiln::cuda
