// Internal to the attention kernel files (attention.cu: the entry point, the generic kernel and
// the per-backend state; attention_decode.cu, attention_prefill.cu, attention_wgmma.cu: one kernel
// family each): shared constants, device helpers, the paged view as the kernels take it, the launch
// arguments, and the launchers of each family (explicitly instantiated for bf16 and f16 in their
// files). The design of every kernel is described at the top of attention.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <utility>

#include "backend/cuda_backend.h"
#include "kernels/cuda/attention_internal.h"
#include "kernels/cuda/mma_util.cuh"
#include "kernels/paged_kv.h"

namespace kiln::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kThreads = 128;  // 4 warps for every kernel here
constexpr int kWarps = kThreads / 32;

// ------------------------------------------------------------------------------------------------
// Small device helpers (the PTX wrappers are in mma_util.cuh).

// Pairs of elements as float2 (generic kernel).
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 load2(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
__device__ __forceinline__ void store2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store2(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

// Element offset of 16-byte chunk c of row r in a swizzled [rows][D] tile (conflict-free ldmatrix;
// the prefill and decode kernels' K/V tiles). For D = 64 this is exactly the hardware 128-byte
// swizzle (chunk ^= row % 8 within 1024-byte atoms), the layout of the wgmma tiles.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return r * D + ((c ^ (r & 7)) << 3);
}

// ------------------------------------------------------------------------------------------------
// The paged view (kernels/paged_kv.h) as the kernels take it: a kernel argument by value.
//
// Key j of request b is pool row paged_kv_slot(indices, indptr[b], size, j)
//   = indices[indptr[b] + j / size] * size + j % size.
// The division by the page size is a multiply-high, an add and a shift by constants computed on the
// host (PageDivisor below), exact for every page size >= 1 and every 0 <= j < 2^31; for a power of
// two it is j >> log2(size). Pool rows fit in int32 (the host checks that the pool has < 2^31 rows),
// so rows are int32 and become 64-bit element offsets when multiplied by the row stride Hkv * D.
struct PagedArgs {
  const int* indptr;   // page_indptr [B + 1]
  const int* indices;  // page_indices
  const int* last;     // last_page_len [B]
  int size;            // page_size >= 1
  uint32_t magic;      // j / size == (umulhi(j, magic) + j) >> shift
  int shift;
};

// Request b's keys: its page ids are indices[first ..] in position order (`indices` stays the
// kernel argument, so it costs no register).
struct PagedKeys {
  const int* indices;
  int first;  // indptr[b]
  int size;
  uint32_t magic;
  int shift;

  // Page (within the request) of key j.
  __device__ __forceinline__ int page(int j) const {
    const uint32_t u = static_cast<uint32_t>(j);
    return static_cast<int>((__umulhi(u, magic) + u) >> shift);
  }
  // Pool row of key j < kv_len (reads the page table): paged_kv_slot(...) of kernels/paged_kv.h.
  __device__ __forceinline__ int row(int j) const {
    const int p = page(j);
    return page_id(p) * size + (j - p * size);
  }
  // Pool page holding the request's page p.
  __device__ __forceinline__ int page_id(int p) const { return __ldg(indices + first + p); }
};

// Element offset of pool row `row` (0 <= row < 2^31) in rows of `stride` elements: one 32 x 32 ->
// 64-bit multiply.
__device__ __forceinline__ int64_t row_offset(int row, int stride) {
  return static_cast<int64_t>(static_cast<uint64_t>(static_cast<uint32_t>(row)) * static_cast<uint32_t>(stride));
}

// A request's keys; reads indptr[b] only (a request with no pages has kv_len 0 and its page table
// is never read).
__device__ __forceinline__ PagedKeys request_keys(const PagedArgs& kv, int b) {
  return PagedKeys{kv.indices, kv.indptr[b], kv.size, kv.magic, kv.shift};
}
__device__ __forceinline__ int request_kv_len(const PagedArgs& kv, int b) {
  return paged_kv_len(kv.indptr, kv.last, kv.size, b);
}

// Pool rows of the prefill kernels' K/V tiles, in shared memory: rows[(tile & 1) * BN + r] is the
// row of key tile * BN + r of the request (meaningless past n_keys, where nothing is copied).
// Each key's page is looked up once, by thread tid < BN for key tile * BN + tid (not by each of the
// threads that copy a chunk of its row): fetch() reads the page id from the page table (global) at
// the top of the iteration that computes tile - 2, store() writes the row at its end, so the
// page-table latency hides behind a tile of compute; a barrier separates the store from the copies
// of iteration tile - 1 that read it. The two slots alternate: rows of tile t + 2 overwrite those
// of tile t, whose copies were issued an iteration earlier. The copies then cost one shared-memory
// load per row whatever the page size (pages of BN keys or more, contiguous caches included, could
// skip it, but the load costs about what the address arithmetic of consecutive rows would).
template <int BN>
struct TileRows {
  int* rows;    // [2][BN] in shared memory
  int pid = 0;  // page id of this thread's key in the fetched tile

  __device__ __forceinline__ void fetch(const PagedKeys& keys, int tile, int n_keys, int tid) {
    const int key = tile * BN + tid;
    pid = (tid < BN && key < n_keys) ? keys.page_id(keys.page(key)) : 0;
  }
  __device__ __forceinline__ void store(const PagedKeys& keys, int tile, int tid) const {
    if (tid < BN) {
      const int key = tile * BN + tid;
      rows[(tile & 1) * BN + tid] = pid * keys.size + (key - keys.page(key) * keys.size);
    }
  }
};

// ------------------------------------------------------------------------------------------------
// Host side shared by the files.

// The decode kernel's own input stage (attention_decode_rope_forward): q/k/v projection rows in
// place of q, for steps of at most one query per request whose query heads of a KV head fit one
// row tile (G <= 16). The block of each (request, KV head) rotates (and norms) its query heads
// itself, and the block whose split holds the new key writes it and the value to the cache
// (qkv_rope_cache_write's arithmetic). qkv == nullptr: q and the cache are given.
struct DecodeInput {
  const void* qkv = nullptr;  // [T, (Hq + 2 Hkv) * D], the attention dtype
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;  // negative: the key and value are not written
  const float* inv_freq = nullptr;
  const void* q_norm = nullptr;  // [D] or null
  const void* k_norm = nullptr;
  DType q_norm_dt = DType::bf16, k_norm_dt = DType::bf16;
  float scaling = 1.0f, eps = 0.0f;
};

struct Args {
  void* out;
  const void* q;
  const void* k;
  const void* v;
  const int* q_indptr;
  PagedArgs kv;
  int B, Hq, Hkv, G, D, max_q_len, max_kv_len;
  int64_t q_rows, kv_rows;  // rows of q [T, Hq, D] and of the pools k, v [S, Hkv, D]
  float sl;                 // scale * log2(e)
  DecodeInput input;        // the decode kernel's input stage, if qkv is set
};

constexpr int kDecodeMaxRowTiles = 4;  // decode path while max_q_len * G <= 64

// Per-backend state (CudaBackend::attention_state()), created on the first call on that backend:
// facts of its device and what was done to the kernels there. Kernel attributes and occupancy are
// per device, so none of this lives in function-local statics (which would tie it to whichever
// GPU ran first). The attention_train*.cu files share it (kernels/cuda/attention_internal.h).
struct AttentionState {
  int device = 0;
  bool has_wgmma = false;                    // sm_90: the wgmma kernels are built for sm_90a only
  int env_prefill_variant = -1;              // KILN_ATTN_PREFILL_VARIANT, -1 if unset or invalid
  std::map<const void*, int> smem_limit;     // kernel -> dynamic shared-memory limit set on the device
  // Decode kernel and wanted blocks per SM -> (dynamic shared memory to request, resident blocks).
  std::map<std::pair<const void*, int>, std::pair<int, int>> decode_fit;
};

// The backend's state, created on its first call (attention.cu).
AttentionState& state_of(CudaBackend& be);

// Runs f with `device` current (cudaFuncSetAttribute and the occupancy query act on the current
// device), then restores the previous one.
template <typename F>
void with_device(int device, F&& f) {
  int cur = 0;
  CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != device) CUDA_CHECK(cudaSetDevice(device));
  f();
  if (cur != device) CUDA_CHECK(cudaSetDevice(cur));
}

template <typename Kernel>
const void* kernel_key(Kernel* kernel) {
  return reinterpret_cast<const void*>(kernel);
}

// The kernel families' launchers. Decode: D 64 or 128 (attention_decode.cu). Prefill on mma.sync,
// variant 0 (attention_prefill.cu). Prefill on wgmma, variants 1, 2 and 3 (attention_wgmma.cu,
// attention_ws.cu).
template <typename T>
void launch_decode(CudaBackend& be, const Args& a);
// The most splits the decode kernel writes for the combine pass to merge.
constexpr int kDecodeMaxSplits = 256;
// The combine pass (attention_combine.cu): out [rows, Hq, D] (rows of q_indptr's requests; rows
// past a request's queries untouched) from part_o [B, max_q_len, Hq, splits, D] f32 and part_lse
// [B, max_q_len, Hq, splits] (base-2 log-sum-exp, -inf for an empty split). D is 64 or 128.
template <typename T>
void launch_decode_combine(CudaBackend& be, T* out, const float* part_o, const float* part_lse, const int* q_indptr,
                           int B, int max_q_len, int Hq, int D, int splits);
template <typename T>
void launch_prefill_mma(CudaBackend& be, const Args& a);
template <typename T>
void launch_prefill_wgmma(CudaBackend& be, const Args& a, int variant);
template <typename T>
void launch_prefill_ws(CudaBackend& be, const Args& a);  // variant 3 (attention_ws.cu)
// The dense training layout on the warp-specialised kernel (attention_ws.cu; bf16, D = 64 or 128,
// 16-byte aligned tensors): q [B, Hq, S, D], k, v [B, Hkv, S, D], out [B, S, Hq, D], lse [B, Hq, S]
// (natural log); segment ids [B, S] and their summaries (attention_segments.cuh) or null; causal
// or not. The forward of attention_train_forward on Hopper.
struct DenseArgs {
  void* out;
  float* lse;
  const void* q;
  const void* k;
  const void* v;
  const int* seg;
  const int4* seg_ranges;
  int B, Hq, Hkv, S, D, n_gran;
  bool causal;
  float sl;  // scale * log2(e)
};
void launch_dense_ws(CudaBackend& be, const DenseArgs& a);
// Rows per TMA box of the warp-specialised prefill kernel's K/V loads for a page size: the largest
// power of two <= 128 (its key tile) dividing it when at least 64, else 0 (its producer then copies
// with cp.async).
int ws_box_rows(int page_size);
// Query rows per block of the warp-specialised prefill kernel for a head dimension (64 or 128).
int ws_block_rows(int head_dim);

}  // namespace kiln::cuda::attn
