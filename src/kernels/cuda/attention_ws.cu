// The warp-specialised Hopper prefill kernel (family 2, variant 3 of attention.cu's description).
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/tensor_map.h"

namespace kiln::cuda::attn {
namespace {

// One arrival on `bar`, triggered once every cp.async this thread issued before has completed (the
// barrier's expected count includes it: .noinc).
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// 2c. Warp-specialised kernel (bf16/f16, D = 64 or 128; FlashAttention-3's structure). Block of
// NC + 1 warpgroups: warpgroup 0 is the producer (its register budget lowered; one warp issues
// the TMA loads, all four copy when the pages are too small for TMA), warpgroups 1..NC the consumers, 64 query rows each (BM = 64 * NC), register budget
// raised. Tiles in shared memory as the other wgmma kernels lay them out (D / 64 column blocks of
// 128-byte rows, 128-byte swizzle), written by TMA:
//   Q: once, boxes of 64 rows x 64 dims from q viewed as [T, Hq * D] (rows past the tensor read
//      as zeros; rows past the request are the next request's, finite and never stored);
//   K, V: ST-stage rings, per stage one K and one V tile of BN keys, each tile BN / R boxes of R
//      pool rows x 64 dims from the pool viewed as [rows, Hkv * D] (R = ws_box_rows(page size):
//      64 or 128, so a box never crosses a page). The producer's lane i looks up the page of box
//      i, a tile ahead. Boxes that reach past the request's keys (its last tile only) are copied
//      by the producer's lanes instead, rows past n_keys as zeros (pool rows there may hold
//      anything, and 0 * NaN in P V would not be 0), and made visible to the async proxy before
//      the stage's barrier arrival. Pages of fewer than 64 rows: produce_by_copies (cp.async).
// Barriers (mbarriers): q_full; per stage k_full / v_full (the producer's expect_tx arrival, the
// TMA bytes) and k_empty / v_empty (one arrival per consumer warp once its wgmmas that read the
// tile have completed).
// Consumer loop, per key tile j (intra-warpgroup overlap): issue S_j = Q K_j^T, issue
// O += P_{j-1} V_{j-1}, wait for S_j, release K_j, masked online softmax of S_j (overlapping the
// PV wgmma), wait for the PV, release V_{j-1}, rescale O, pack P_j. Ping-pong between the
// consumer warpgroups: each issues its wgmmas between a wait on its named barrier and an arrival
// on the next one's, so warpgroup w's softmax runs while w + 1's GEMMs hold the tensor cores.
// Every consumer warpgroup walks the block's n_tiles (the key range of its last row), so the
// barrier pairs match; rows that see no key of a tile get P = 0 there.
template <int D_, int NC_, int BN_, int ST_>
struct WsCfg {
  static constexpr int D = D_, NC = NC_, BN = BN_, ST = ST_;
  static constexpr int BM = 64 * NC;
  static constexpr int NT = 128 * (NC + 1);
  static constexpr int CB = D / 64;  // 64-dim column blocks
  static constexpr int SD = BN / 2;  // S accumulators per thread
  static constexpr int OD = D / 2;   // O accumulators per thread
  static constexpr int kTileElems = BN * D;
  static constexpr int kBars = 1 + 4 * ST;
  // Q + the K and V rings + barriers + the copy path's pool rows (TileRows) + slack for the
  // 1024-byte alignment.
  static constexpr int kSmemBytes = (BM * D + 2 * ST * kTileElems) * 2 + kBars * 8 + 2 * BN * 4 + 1024;
  // Register budgets (65536 per SM, one block): producer + NC consumers x 128 threads.
  static constexpr int kProducerRegs = NC == 2 ? 56 : 32;
  static constexpr int kConsumerRegs = NC == 2 ? 224 : 160;
  static_assert(128 * (kProducerRegs + NC * kConsumerRegs) <= 65536, "register budget");
  static_assert(BN / 64 * CB <= 32, "one producer lane per TMA box (boxes of >= 64 rows)");
};

// The producer's K/V loads by cp.async, for pages of fewer than 64 rows, any page size (TMA boxes
// of one 16-row page each: D=128, L=16384, 4.94 ms against these copies' 4.50, both slow against
// 3.46 with K/V by TMA from one contiguous page). The 128 producer threads copy 16-byte chunks
// (thread tid: chunk tid % (D/8) of rows tid / (D/8) + i * RS), rows past n_keys zero-filled; the
// pool rows of a tile are put in shared memory a tile ahead (TileRows: thread tid looks up key
// tid). Each thread's arrival on a stage's k_full / v_full is triggered by the completion of its
// copies (cp.async.mbarrier.arrive), so the producer never waits for its own loads (waiting cost
// 4.98 ms there); the consumers fence the generic-proxy writes to the async proxy after their
// barrier wait, before the wgmma reads.
template <typename T, int D, int BN, int ST>
__device__ __forceinline__ void produce_by_copies(T* sK, T* sV, TileRows<BN>& tile_rows, uint64_t* k_full,
                                                  uint64_t* v_full, uint64_t* k_empty, uint64_t* v_empty,
                                                  const PagedKeys& keys, const T* __restrict__ k_cache,
                                                  const T* __restrict__ v_cache, int kvh, int Hkv, int n_keys,
                                                  int n_tiles, int tid) {
  constexpr int NCH = D / 8;     // 16-byte chunks per row
  constexpr int RS = 128 / NCH;  // rows per pass of the 128 threads
  const int r0 = tid / NCH, c = tid % NCH;
  const uint32_t off0 = static_cast<uint32_t>(wg_off<BN>(r0, c) * sizeof(T));
  const T* k_base = k_cache + static_cast<int64_t>(kvh) * D + c * 8;
  const T* v_base = v_cache + static_cast<int64_t>(kvh) * D + c * 8;
  const int stride = Hkv * D;
  auto copy_tile = [&](T* dst, const T* base, int j) {
    const uint32_t d0 = smem_u32(dst) + off0;
    const int* rows = tile_rows.rows + (j & 1) * BN + r0;
#pragma unroll 4
    for (int i = 0; i < BN / RS; ++i) {
      const bool ok = j * BN + r0 + i * RS < n_keys;
      cp_async16(d0 + i * RS * 128, base + row_offset(ok ? rows[i * RS] : 0, stride), ok);
    }
  };
  tile_rows.fetch(keys, 0, n_keys, tid);
  tile_rows.store(keys, 0, tid);
  named_sync(15, 128);
  for (int j = 0; j < n_tiles; ++j) {
    if (j + 1 < n_tiles) tile_rows.fetch(keys, j + 1, n_keys, tid);
    const int st = j % ST;
    if (j >= ST) mbar_wait(&k_empty[st], ((j / ST) - 1) & 1);
    copy_tile(sK + st * BN * D, k_base, j);
    cp_async_arrive(&k_full[st]);
    if (j >= ST) mbar_wait(&v_empty[st], ((j / ST) - 1) & 1);
    copy_tile(sV + st * BN * D, v_base, j);
    cp_async_arrive(&v_full[st]);
    // Rows of tile j + 1 into the slot that tile j - 1's copies (all issued) read.
    if (j + 1 < n_tiles) tile_rows.store(keys, j + 1, tid);
    named_sync(15, 128);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

template <typename T, int D, int NC, int BN, int ST>
__global__ void __launch_bounds__(WsCfg<D, NC, BN, ST>::NT, 1)
    attn_prefill_ws_kernel(T* __restrict__ out, const __grid_constant__ CUtensorMap q_map,
                           const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                           const T* __restrict__ k_cache, const T* __restrict__ v_cache,
                           const int* __restrict__ q_indptr, PagedArgs kv, int Hq, int Hkv, int G, int box_rows,
                           int num_qtiles, float sl) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = WsCfg<D, NC, BN, ST>;
  extern __shared__ unsigned char smem_ws[];
  unsigned char* smem_base = smem_ws + ((1024u - (smem_u32(smem_ws) & 1023u)) & 1023u);
  T* sQ = reinterpret_cast<T*>(smem_base);
  T* sK = sQ + C::BM * D;
  T* sV = sK + ST * C::kTileElems;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sV + ST * C::kTileElems);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = k_full + ST;
  uint64_t* k_empty = v_full + ST;
  uint64_t* v_empty = k_empty + ST;
  TileRows<BN> tile_rows{reinterpret_cast<int*>(v_empty + ST)};
  const bool use_tma = box_rows > 0;

  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int qt = num_qtiles - 1 - static_cast<int>(blockIdx.x);  // heaviest tiles first
  const int q_start = q_indptr[b];
  const int q_len = q_indptr[b + 1] - q_start;
  const int row0 = qt * C::BM;
  if (row0 >= q_len) return;  // every block of a request without queries (padding) exits here
  const int kv_len = request_kv_len(kv, b);
  const int kvh = h / G;
  const int delta = kv_len - q_len;
  const int n_keys = max(0, min(kv_len, delta + min(q_len, row0 + C::BM)));
  const int n_tiles = (n_keys + BN - 1) / BN;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int i = 0; i < ST; ++i) {
      mbar_init(&k_full[i], use_tma ? 1 : 128);  // TMA: the expect_tx arrival; copies: every producer thread
      mbar_init(&v_full[i], use_tma ? 1 : 128);
      mbar_init(&k_empty[i], 4 * NC);
      mbar_init(&v_empty[i], 4 * NC);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (tid < 128) {  // producer warpgroup
    regs_dec<C::kProducerRegs>();
    const PagedKeys keys = request_keys(kv, b);
    if (tid == 0) {
      mbar_arrive_expect_tx(q_full, C::BM * D * 2);
      for (int w = 0; w < NC; ++w)
        for (int cb = 0; cb < C::CB; ++cb)
          tma_load_2d(sQ + cb * C::BM * 64 + w * 64 * 64, &q_map, h * D + cb * 64, q_start + row0 + w * 64, q_full);
    }
    if (!use_tma) {
      produce_by_copies<T, D, BN, ST>(sK, sV, tile_rows, k_full, v_full, k_empty, v_empty, keys, k_cache, v_cache,
                                      kvh, Hkv, n_keys, n_tiles, tid);
      return;
    }
    if (tid >= 32) return;
    const int nbr = BN / box_rows;  // boxes per column block of a tile
    // One tile of K or V into `dst` (completing `bar`): full boxes by TMA, the rest copied here.
    auto load_tile = [&](T* dst, const CUtensorMap* map, const T* pool, uint64_t* bar, int key0, int prow) {
      const int full = min(nbr, max(0, (n_keys - key0) / box_rows));
      if (full < nbr) {  // the request's last tile: rows past n_keys as zeros
        const int per_box = box_rows * (D / 8);
        for (int idx = lane; idx < (nbr - full) * per_box; idx += 32) {
          const int bx = full + idx / per_box, r = (idx % per_box) / (D / 8), c = idx % (D / 8);
          const int key = key0 + bx * box_rows + r;
          uint4 v = make_uint4(0, 0, 0, 0);
          if (key < n_keys) v = *reinterpret_cast<const uint4*>(pool + row_offset(keys.row(key), Hkv * D) + kvh * D + c * 8);
          *reinterpret_cast<uint4*>(dst + wg_off<BN>(bx * box_rows + r, c)) = v;
        }
        fence_proxy_async();
      }
      __syncwarp();
      if (lane == 0) mbar_arrive_expect_tx(bar, full * C::CB * box_rows * 128);
      __syncwarp();
      if (full > 0) {
        const int bx = lane % full, cb = lane / full;
        const int row = __shfl_sync(0xffffffffu, prow, bx);
        if (lane < full * C::CB) tma_load_2d(dst + cb * BN * 64 + bx * box_rows * 64, map, kvh * D + cb * 64, row, bar);
      }
    };
    // Pool row of box `lane`'s first key in tile j (the box lies in one page), read a tile ahead.
    auto box_row = [&](int j) {
      const int key = j * BN + lane * box_rows;
      return j < n_tiles && lane < nbr && key < n_keys ? keys.row(key) : 0;
    };
    // Order of the loads: K_0, then K_j before V_{j-1} (what consumer iteration j waits for).
    int prow = box_row(0), prow_next = box_row(1);
    load_tile(sK, &k_map, k_cache, &k_full[0], 0, prow);
    for (int j = 1; j <= n_tiles; ++j) {
      const int prev = prow;
      prow = prow_next;
      prow_next = box_row(j + 1);
      if (j < n_tiles) {
        const int st = j % ST;
        if (j >= ST) mbar_wait(&k_empty[st], ((j / ST) - 1) & 1);
        load_tile(sK + st * C::kTileElems, &k_map, k_cache, &k_full[st], j * BN, prow);
      }
      const int pst = (j - 1) % ST;
      if (j - 1 >= ST) mbar_wait(&v_empty[pst], (((j - 1) / ST) - 1) & 1);
      load_tile(sV + pst * C::kTileElems, &v_map, v_cache, &v_full[pst], (j - 1) * BN, prev);
    }
    return;
  }

  // Consumer warpgroup cw: query rows row0 + 64 cw ..; this thread's rows wrow0 and wrow0 + 8.
  regs_inc<C::kConsumerRegs>();
  const int cw = (tid >> 7) - 1;
  const int warp = (tid >> 5) & 3;
  const int wrow0 = row0 + cw * 64 + warp * 16 + (lane >> 2);
  const int first_masked = delta + row0 + 1;
  const uint32_t q_addr = smem_u32(sQ) + cw * 64 * 128;
  const uint32_t k_addr = smem_u32(sK), v_addr = smem_u32(sV);
  constexpr uint32_t kTileBytes = C::kTileElems * 2;
  // Ping-pong: wait for this warpgroup's turn at the tensor cores / hand it to the next one.
  auto turn_wait = [&] {
    if constexpr (NC > 1) named_sync(1 + cw, 256);
  };
  auto turn_pass = [&] {
    if constexpr (NC > 1) named_arrive(1 + (cw + 1) % NC, 256);
  };
  if (NC > 1 && cw == NC - 1) named_arrive(1, 256);  // warpgroup 0 goes first

  float o[C::OD], s[C::SD];
#pragma unroll
  for (int i = 0; i < C::OD; ++i) o[i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t pa[BN / 16][4];
  float alpha[2];

  // Tiles written by the producer's cp.async copies are generic-proxy writes: fenced to the async
  // proxy (the wgmma reads) by each consumer thread after the barrier wait.
  auto copied_fence = [&] {
    if (!use_tma) fence_proxy_async();
  };
  mbar_wait(q_full, 0);
  mbar_wait(&k_full[0], 0);
  copied_fence();
  turn_wait();
  wgmma_fence();
  wg_issue_s<T, D, C::BM, BN>(s, q_addr, k_addr);
  wgmma_commit();
  turn_pass();
  wgmma_wait<0>();
  fence_regs(s);
  if (lane == 0) mbar_arrive(&k_empty[0]);
  wg_softmax<BN>(s, m, l, alpha, 0, first_masked, wrow0, delta, kv_len, lane, sl);
  wg_pack_p<T, BN>(s, pa);

  for (int j = 1; j < n_tiles; ++j) {
    const int st = j % ST, pst = (j - 1) % ST;
    mbar_wait(&k_full[st], (j / ST) & 1);
    copied_fence();
    turn_wait();
    wgmma_fence();
    wg_issue_s<T, D, C::BM, BN>(s, q_addr, k_addr + st * kTileBytes);
    wgmma_commit();
    mbar_wait(&v_full[pst], ((j - 1) / ST) & 1);
    copied_fence();
    wg_issue_pv<T, D, BN>(o, pa, v_addr + pst * kTileBytes);
    wgmma_commit();
    turn_pass();
    wgmma_wait<1>();
    fence_regs(s);
    if (lane == 0) mbar_arrive(&k_empty[st]);
    wg_softmax<BN>(s, m, l, alpha, j * BN, first_masked, wrow0, delta, kv_len, lane, sl);
    wgmma_wait<0>();
    fence_regs(o);
    if (lane == 0) mbar_arrive(&v_empty[pst]);
    wg_rescale(o, alpha);
    wg_pack_p<T, BN>(s, pa);
  }
  const int lst = (n_tiles - 1) % ST;
  mbar_wait(&v_full[lst], ((n_tiles - 1) / ST) & 1);
  copied_fence();
  turn_wait();
  wgmma_fence();
  wg_issue_pv<T, D, BN>(o, pa, v_addr + lst * kTileBytes);
  wgmma_commit();
  turn_pass();
  wgmma_wait<0>();
  fence_regs(o);
  wg_store<T, D>(out, o, l, wrow0, q_start, q_len, Hq, h, lane);
#else
  __trap();  // wgmma needs sm_90a; the host never selects this kernel elsewhere
#endif
}

// The configuration per head dimension. D=64: 3 consumer warpgroups (BM=192), 3 stages; measured
// against 2 (BM=128, 4 stages) at L=30000: 6.23 ms against 7.53. D=128: 2 consumer warpgroups,
// 2 stages (shared memory).
using WsD64 = WsCfg<64, 3, 128, 3>;
using WsD128 = WsCfg<128, 2, 128, 2>;

template <typename T, typename C>
void launch_ws(CudaBackend& be, const Args& a, int box_rows) {
  constexpr int D = C::D;
  auto kernel = attn_prefill_ws_kernel<T, C::D, C::NC, C::BN, C::ST>;
  static_assert(C::kSmemBytes + 1024 <= 228 * 1024, "shared memory per SM (1 KiB reserved per block)");
  attention_allow_smem(be, kernel_key(kernel), C::kSmemBytes);
  const CUtensorMap q_map = bf16_tile_map(a.q, a.q_rows, static_cast<int64_t>(a.Hq) * D, 64, 64,
                                          CU_TENSOR_MAP_SWIZZLE_128B);
  CUtensorMap k_map{}, v_map{};  // unused (not encoded) when the producer copies
  if (box_rows > 0) {
    k_map = bf16_tile_map(a.k, a.kv_rows, static_cast<int64_t>(a.Hkv) * D, box_rows, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    v_map = bf16_tile_map(a.v, a.kv_rows, static_cast<int64_t>(a.Hkv) * D, box_rows, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  }
  const int num_qtiles = (a.max_q_len + C::BM - 1) / C::BM;
  dim3 grid(num_qtiles, a.Hq, a.B);
  kernel<<<grid, C::NT, C::kSmemBytes, be.stream()>>>(static_cast<T*>(a.out), q_map, k_map, v_map,
                                                      static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                                                      a.q_indptr, a.kv, a.Hq, a.Hkv, a.G, box_rows, num_qtiles, a.sl);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int ws_box_rows(int page_size) {
  static_assert(WsD64::BN == WsD128::BN, "one key tile for both head dimensions");
  int r = WsD64::BN;
  while (r >= 64 && page_size % r != 0) r /= 2;
  return r >= 64 ? r : 0;
}

int ws_block_rows(int head_dim) { return head_dim == 64 ? WsD64::BM : WsD128::BM; }

template <typename T>
void launch_prefill_ws(CudaBackend& be, const Args& a) {
  const int box_rows = ws_box_rows(a.kv.size);
  if (a.D == 64) return launch_ws<T, WsD64>(be, a, box_rows);
  launch_ws<T, WsD128>(be, a, box_rows);
}

template void launch_prefill_ws<__nv_bfloat16>(CudaBackend&, const Args&);
template void launch_prefill_ws<__half>(CudaBackend&, const Args&);

}  // namespace kiln::cuda::attn
