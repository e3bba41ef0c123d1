// The Hopper wgmma prefill kernels of variants 1 and 2 (family 2 of attention.cu's description)
// and the dispatch of every wgmma variant (variant 3: attention_ws.cu).
#include "kernels/cuda/attention_wgmma.cuh"

namespace kiln::cuda::attn {
namespace {

// Shared state and helpers of the wgmma kernels: block geometry, cp.async tile loads, the S and
// PV wgmma issue, and the epilogue.
template <typename T, int D, int BN, int NWG>
struct WgTile {
  static constexpr int NC = D / 8;  // 16-byte chunks per row
  static constexpr int NT = NWG * 128;
  static constexpr int BM = NWG * 64;
  static constexpr int SD = BN / 2;  // S accumulators per thread
  static constexpr int OD = D / 2;   // O accumulators per thread
  static constexpr int kTileElems = BN * D;
  // Q + two K and two V stages + the two K/V tiles' pool rows (TileRows, after the tiles so that
  // these stay 1024-byte aligned), + slack for the 1024-byte alignment.
  static constexpr int kSmemBytes = (BM * D + 4 * BN * D) * 2 + 2 * BN * 4 + 1024;

  T* sQ;
  T* sK;  // [2][BN x D tile]
  T* sV;  // [2][BN x D tile]
  const int* rows;  // [2][BN] pool rows of the K/V tiles (TileRows)
  const T* q_base;
  const T* k_base;  // kv head kvh of pool row 0, at this thread's 16-byte chunk tid % NC (load_kv)
  const T* v_base;
  PagedKeys keys;
  int64_t q_stride;
  int kv_stride;  // Hkv * D
  int row0, q_len, n_keys, tid;

  // cp.async tile loads. Thread tid always copies 16-byte chunk c = tid % NC of rows
  // tid / NC + i * RS (RS = NT / NC, a multiple of 8, so the swizzle term row % 8 and the chunk's
  // column block are the same for all i): fully unrolled loops whose per-row work is one
  // predicate, one address add and the copy. (A `for (idx = tid; idx < rows * NC; idx += NT)`
  // loop with the index math per row, run separately for K and V, cost these issue-bound
  // kernels ~200 integer instructions per key tile, ~20% of the time at D = 64.)
  static constexpr int RS = NT / NC;
  static_assert(RS % 8 == 0 && BN % RS == 0 && BM % RS == 0, "load mapping");

  __device__ __forceinline__ void load_q() const { wg_load_rows<T, D, BM, NT>(sQ, q_base, q_stride, row0, q_len, tid); }
  // K and V tile `tile` into stage buf (rows past n_keys zero-filled), from the pool rows in
  // `rows`: per copied row one shared-memory load and one widening multiply-add per address
  // (k_base and v_base already include this thread's chunk).
  __device__ __forceinline__ void load_kv(int tile, int buf) const {
    const int r0 = tid / NC;
    const uint32_t off0 = static_cast<uint32_t>(wg_off<BN>(r0, tid % NC) * sizeof(T));  // bytes
    const uint32_t dk = smem_u32(sK + buf * kTileElems) + off0;
    const uint32_t dv = smem_u32(sV + buf * kTileElems) + off0;
    const int key0 = tile * BN;
    const int* tr = rows + (tile & 1) * BN + r0;
#pragma unroll
    for (int i = 0; i < BN / RS; ++i) {
      const bool ok = key0 + r0 + i * RS < n_keys;
      const int row = ok ? tr[i * RS] : 0;
      cp_async16(dk + i * RS * 128, k_base + row_offset(row, kv_stride), ok);
      cp_async16(dv + i * RS * 128, v_base + row_offset(row, kv_stride), ok);
    }
  }

  __device__ __forceinline__ void issue_s(float (&s)[SD], uint32_t q_addr, int buf) const {
    wg_issue_s<T, D, BM, BN>(s, q_addr, smem_u32(sK + buf * kTileElems));
  }
  __device__ __forceinline__ void issue_pv(float (&o)[OD], const uint32_t (&pa)[BN / 16][4], int buf) const {
    wg_issue_pv<T, D, BN>(o, pa, smem_u32(sV + buf * kTileElems));
  }
};

// Common prologue of the wgmma kernels: block geometry from q_indptr and the paged view (blocks
// past the request's queries return).
#define KILN_WG_SETUP(Tile)                                                                                    \
  extern __shared__ unsigned char smem_wg[];                                                                  \
  unsigned char* smem_base = smem_wg + ((1024u - (smem_u32(smem_wg) & 1023u)) & 1023u);                       \
  const int b = blockIdx.z;                                                                                   \
  const int h = blockIdx.y;                                                                                   \
  const int qt = num_qtiles - 1 - static_cast<int>(blockIdx.x); /* heaviest tiles first */                    \
  const int q_start = q_indptr[b];                                                                            \
  const int q_len = q_indptr[b + 1] - q_start;                                                                \
  const int row0 = qt * Tile::BM;                                                                             \
  if (row0 >= q_len) return; /* every block of a request without queries (padding) exits here */              \
  const int kv_len = request_kv_len(kv, b);                                                                   \
  const int kvh = h / G;                                                                                      \
  const int delta = kv_len - q_len;                                                                           \
  const int row_end = min(q_len, row0 + Tile::BM);                                                            \
  const int n_keys = max(0, min(kv_len, delta + row_end));                                                    \
  const int n_tiles = (n_keys + BN - 1) / BN;                                                                 \
  const int first_masked = delta + row0 + 1;                                                                  \
  const int tid = threadIdx.x;                                                                                \
  const int wg = tid >> 7;                                                                                    \
  const int warp = (tid >> 5) & 3;                                                                            \
  const int lane = tid & 31;                                                                                  \
  Tile t_;                                                                                                    \
  t_.sQ = reinterpret_cast<T*>(smem_base);                                                                    \
  t_.sK = t_.sQ + Tile::BM * D;                                                                               \
  t_.sV = t_.sK + 2 * Tile::kTileElems;                                                                       \
  TileRows<BN> tile_rows{reinterpret_cast<int*>(t_.sV + 2 * Tile::kTileElems)};                               \
  t_.rows = tile_rows.rows;                                                                                   \
  t_.q_stride = static_cast<int64_t>(Hq) * D;                                                                 \
  t_.kv_stride = Hkv * D;                                                                                     \
  t_.q_base = q + (static_cast<int64_t>(q_start) * Hq + h) * D;                                               \
  t_.k_base = k_cache + static_cast<int64_t>(kvh) * D + (tid % Tile::NC) * 8;                                 \
  t_.v_base = v_cache + static_cast<int64_t>(kvh) * D + (tid % Tile::NC) * 8;                                 \
  t_.keys = request_keys(kv, b);                                                                              \
  t_.row0 = row0;                                                                                             \
  t_.q_len = q_len;                                                                                           \
  t_.n_keys = n_keys;                                                                                         \
  t_.tid = tid;                                                                                               \
  const int wrow0 = row0 + wg * 64 + warp * 16 + (lane >> 2); /* this thread's rows: wrow0, wrow0 + 8 */      \
  const uint32_t q_addr = smem_u32(t_.sQ) + wg * 64 * 128; /* this warpgroup's 64 rows (per column block) */

// 2b. Plain wgmma kernel (bf16/f16, D = 64 or 128). NWG warpgroups of 4 warps, each owning 64
// query rows (BM = 64 * NWG), BN keys per K/V tile, K/V double buffered (shared by the
// warpgroups). Per key tile: wait for the tile's cp.async group, fence.proxy.async (cp.async
// writes are generic-proxy, wgmma reads are async-proxy), barrier, prefetch the next tile into
// the other stage (its readers finished: every warpgroup waits for its wgmmas before the
// barrier) and read the page ids of tile + 2 (TileRows), S wgmma -> wait -> masked online
// softmax -> PV wgmma -> wait, then store tile + 2's pool rows. The tensor cores overlap the
// softmax only across the resident blocks of an SM.
template <typename T, int D, int BN, int NWG, int kMinBlocks>
__global__ void __launch_bounds__(NWG * 128, kMinBlocks)
    attn_prefill_wgmma_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
                              const T* __restrict__ v_cache, const int* __restrict__ q_indptr, PagedArgs kv,
                              int Hq, int Hkv, int G, int num_qtiles, float sl) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = WgTile<T, D, BN, NWG>;
  KILN_WG_SETUP(Tile)
  static_assert(BN <= Tile::NT, "one thread per tile row in TileRows");
  t_.load_q();
  // Pool rows of the first two tiles, then the first K/V tile.
  for (int tile = 0; tile < 2 && tile < n_tiles; ++tile) {
    tile_rows.fetch(t_.keys, tile, n_keys, tid);
    tile_rows.store(t_.keys, tile, tid);
  }
  __syncthreads();
  if (n_tiles > 0) t_.load_kv(0, 0);
  cp_async_commit();

  float o[Tile::OD], s[Tile::SD];
#pragma unroll
  for (int i = 0; i < Tile::OD; ++i) o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < Tile::SD; ++i) s[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (tile + 1 < n_tiles) t_.load_kv(tile + 1, (tile + 1) & 1);
    if (tile + 2 < n_tiles) tile_rows.fetch(t_.keys, tile + 2, n_keys, tid);
    cp_async_commit();

    wgmma_fence();
    t_.issue_s(s, q_addr, tile & 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);

    float alpha[2];
    uint32_t pa[BN / 16][4];
    wg_softmax<BN>(s, m, l, alpha, tile * BN, first_masked, wrow0, delta, kv_len, lane, sl);
    wg_pack_p<T, BN>(s, pa);
    wg_rescale(o, alpha);

    wgmma_fence();
    t_.issue_pv(o, pa, tile & 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    // Rows of tile + 2 into the slot of this tile's (already issued) copies; the barrier at the
    // top of the next iteration publishes them before load_kv(tile + 2) reads them.
    if (tile + 2 < n_tiles) tile_rows.store(t_.keys, tile + 2, tid);
  }
  cp_async_wait<0>();
  wg_store<T, D>(out, o, l, wrow0, q_start, q_len, Hq, h, lane);
#else
  __trap();  // wgmma needs sm_90a; the host never selects this kernel elsewhere
#endif
}

#undef KILN_WG_SETUP

template <typename T, int D, int BN, int NWG, int kMinBlocks>
void launch_wgmma_tile(CudaBackend& be, const Args& a) {
  using Tile = WgTile<T, D, BN, NWG>;
  auto kernel = attn_prefill_wgmma_kernel<T, D, BN, NWG, kMinBlocks>;
  constexpr int smem = Tile::kSmemBytes;
  static_assert((smem + 1024) * kMinBlocks <= 228 * 1024, "shared memory per SM (1 KiB reserved per block)");
  attention_allow_smem(be, kernel_key(kernel), smem);
  const int num_qtiles = (a.max_q_len + Tile::BM - 1) / Tile::BM;
  dim3 grid(num_qtiles, a.Hq, a.B);
  kernel<<<grid, Tile::NT, smem, be.stream()>>>(static_cast<T*>(a.out), static_cast<const T*>(a.q),
                                                static_cast<const T*>(a.k), static_cast<const T*>(a.v), a.q_indptr,
                                                a.kv, a.Hq, a.Hkv, a.G, num_qtiles, a.sl);
  CUDA_CHECK(cudaGetLastError());
}


}  // namespace

template <typename T>
void launch_prefill_wgmma(CudaBackend& be, const Args& a, int variant) {
  if (variant == 3) return launch_prefill_ws<T>(be, a);
  if (a.D == 64) {
    if (variant == 1)  // 1 warpgroup, 128-key tiles, 3 blocks per SM
      return launch_wgmma_tile<T, 64, 128, 1, 3>(be, a);
    return launch_wgmma_tile<T, 64, 64, 2, 2>(be, a);  // 2 warpgroups, 64-key tiles, 2 blocks per SM
  }
  if (variant == 1)  // 1 warpgroup, 64-key tiles, 2 blocks per SM
    return launch_wgmma_tile<T, 128, 64, 1, 2>(be, a);
  return launch_wgmma_tile<T, 128, 64, 2, 2>(be, a);  // 2 warpgroups, 64-key tiles, 2 blocks per SM
}

template void launch_prefill_wgmma<__nv_bfloat16>(CudaBackend&, const Args&, int);
template void launch_prefill_wgmma<__half>(CudaBackend&, const Args&, int);

}  // namespace kiln::cuda::attn
