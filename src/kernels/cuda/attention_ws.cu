// The warp-specialised Hopper attention kernel: the paged prefill (family 2, variant 3 of
// attention.cu's description) and, in its dense layout, the training forward (attention_train.cu).
#include "kernels/cuda/attention_segments.cuh"
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
  // D = 64: the rows' sums come from the PV wgmma over [V | 1] (wg_issue_pv_rowsum), four more O
  // accumulators per thread, instead of one add per score in the softmax.
  static constexpr bool kRowSumMma = D == 64;
  static constexpr int OD = D / 2 + (kRowSumMma ? 4 : 0);  // O accumulators per thread
  static constexpr int kOnesElems = kRowSumMma ? BN * 64 : 0;
  static constexpr int kTileElems = BN * D;
  static constexpr int kBars = 1 + 4 * ST;
  // Q + the K and V rings + the ones block + barriers + ints + slack for the 1024-byte alignment.
  // Ints after the barriers: the copy path's pool rows of two tiles, or the dense layout's key
  // segment ids of ST tiles.
  static constexpr int kInts = (ST > 2 ? ST : 2) * BN;
  static constexpr int kSmemBytes = (BM * D + 2 * ST * kTileElems + kOnesElems) * 2 + kBars * 8 + kInts * 4 + 1024;
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

// The layouts the kernel is compiled for (its kLayout): the paged inference layout, and the dense
// training layout without and with segment ids (separate kernels, so that the common paths carry
// no segment code).
enum WsLayout : int { kPaged, kDenseLayout, kDenseSegments };

// The dense training layout's part of the kernel's arguments (see launch_dense_ws).
struct DenseKernelArgs {
  float* lse;              // [B, Hq, S]
  const int* seg;          // [B, S] segment ids, or null
  const int4* seg_ranges;  // [B, n_gran] summaries of seg (attention_segments.cuh), or null
  int S, n_gran, causal;
};

// The segment-id mask of one key tile (wg_softmax's extra mask): query rows see the keys of their
// own id (>= 0) only. seg_k: the tile's key ids in shared memory; row_id: this thread's two rows'.
struct SegmentMask {
  bool on;  // the tile's keys and the block's rows do not all carry one id
  const int* seg_k;
  int row_id[2];
  __device__ __forceinline__ bool masked(int half, int key_in_tile) const {
    return on && (row_id[half] < 0 || seg_k[key_in_tile] != row_id[half]);
  }
};

// kPaged: the paged inference layout (q [T, Hq, D] packed, q_indptr, K/V pool rows through the
// page table, causal with the offset kv_len - q_len, out [T, Hq, D]). kDenseLayout and
// kDenseSegments: the dense training layout of attention_train_forward: q [B, Hq, S, D], k, v
// [B, Hkv, S, D] (the tensor maps
// view them as [B * H * S, D]; K/V tiles are always TMA boxes of BN rows, rows past S are another
// head's or zeros past the tensor, finite and masked), causal or not, segment ids (tiles whose id
// ranges cannot meet the block's are skipped by producer and consumers alike; a tile that needs
// the mask brings its key ids into a ring slot beside K, released only after the softmax read
// them), out [B, S, Hq, D] and lse [B, Hq, S].
template <typename T, typename C, int kLayout>
__global__ void __launch_bounds__(C::NT, 1)
    attn_ws_kernel(T* __restrict__ out, const __grid_constant__ CUtensorMap q_map,
                   const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                   const T* __restrict__ k_cache, const T* __restrict__ v_cache, const int* __restrict__ q_indptr,
                   PagedArgs kv, DenseKernelArgs dn, int Hq, int Hkv, int G, int box_rows, int num_qtiles, float sl) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::D, NC = C::NC, BN = C::BN, ST = C::ST;
  constexpr bool kDense = kLayout != kPaged;
  constexpr bool use_seg = kLayout == kDenseSegments;
  extern __shared__ unsigned char smem_ws[];
  unsigned char* smem_base = smem_ws + ((1024u - (smem_u32(smem_ws) & 1023u)) & 1023u);
  T* sQ = reinterpret_cast<T*>(smem_base);
  T* sK = sQ + C::BM * D;
  T* sV = sK + ST * C::kTileElems;
  T* sOnes = sV + ST * C::kTileElems;  // kRowSumMma: BN x 64 ones (1024-byte aligned)
  uint64_t* bars = reinterpret_cast<uint64_t*>(sOnes + C::kOnesElems);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = k_full + ST;
  uint64_t* k_empty = v_full + ST;
  uint64_t* v_empty = k_empty + ST;
  int* smem_ints = reinterpret_cast<int*>(v_empty + ST);
  TileRows<BN> tile_rows{smem_ints};  // paged copies
  int* sSeg = smem_ints;               // dense with segment ids: [ST][BN] key ids
  const bool use_tma = kDense || box_rows > 0;

  const int b = blockIdx.z;
  // Blocks start in the order of their linear index: every head's tile of a row range before the
  // next lighter range, longest first over the whole grid, so that the launch ends on its lightest
  // tiles (each head's tiles in turn, a sawtooth, left the last head's heaviest tiles running
  // alone at the end: 2-11% slower). The GQA heads of one KV head stay adjacent (L2 reuse of K/V).
  const int lin = static_cast<int>(blockIdx.x) + static_cast<int>(blockIdx.y) * num_qtiles;
  const int h = lin % Hq;
  const int qt = num_qtiles - 1 - lin / Hq;
  const int row0 = qt * C::BM;
  const int kvh = h / G;
  int q_start, q_len, kv_len, delta, q_row, q_col, kv_col;
  if constexpr (kDense) {
    q_start = b * dn.S, q_len = kv_len = dn.S, delta = dn.causal ? 0 : dn.S;
    q_row = (b * Hq + h) * dn.S + row0, q_col = 0, kv_col = 0;
  } else {
    q_start = q_indptr[b], q_len = q_indptr[b + 1] - q_start;
    kv_len = request_kv_len(kv, b), delta = kv_len - q_len;
    q_row = q_start + row0, q_col = h * D, kv_col = kvh * D;
  }
  if (row0 >= q_len) return;  // every block of a request without queries (padding) exits here
  const int n_keys = max(0, min(kv_len, delta + min(q_len, row0 + C::BM)));
  const int n_tiles = (n_keys + BN - 1) / BN;
  // Tiles visited: all n_tiles, except (dense, segment ids) those whose ids cannot meet the rows'.
  const int* seg_row = use_seg ? dn.seg + static_cast<int64_t>(b) * dn.S : nullptr;
  const int4* rng_row = use_seg ? dn.seg_ranges + static_cast<int64_t>(b) * dn.n_gran : nullptr;
  const int4 q_rng = use_seg ? seg_union(rng_row, row0, min(q_len, row0 + C::BM)) : make_int4(0, 0, 0, 0);
  auto tile_range = [&](int kt) { return seg_union(rng_row, kt * BN, min(kv_len, kt * BN + BN)); };
  auto next_tile = [&](int kt) {
    if constexpr (use_seg)
      while (kt < n_tiles && !seg_meet(q_rng, tile_range(kt))) ++kt;
    return kt;
  };
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  if constexpr (C::kRowSumMma) {
    const uint32_t one = std::is_same_v<T, __half> ? 0x3C003C00u : 0x3F803F80u;  // two 1.0s
    for (int i = tid; i < C::kOnesElems / 8; i += C::NT)
      reinterpret_cast<uint4*>(sOnes)[i] = make_uint4(one, one, one, one);
    fence_proxy_async();  // read by wgmma (the async proxy) after the barrier below
  }
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
    if (tid == 0) {
      mbar_arrive_expect_tx(q_full, C::BM * D * 2);
      for (int w = 0; w < NC; ++w)
        for (int cb = 0; cb < C::CB; ++cb)
          tma_load_2d(sQ + cb * C::BM * 64 + w * 64 * 64, &q_map, q_col + cb * 64, q_row + w * 64, q_full);
    }
    PagedKeys keys{};
    if constexpr (!kDense) {
      keys = request_keys(kv, b);
      if (!use_tma) {
        produce_by_copies<T, D, BN, ST>(sK, sV, tile_rows, k_full, v_full, k_empty, v_empty, keys, k_cache, v_cache,
                                        kvh, Hkv, n_keys, n_tiles, tid);
        return;
      }
    }
    if (tid >= 32) return;
    const int rows_per_box = kDense ? BN : box_rows;
    const int nbr = BN / rows_per_box;  // boxes per column block of a tile
    const int kv_row0 = kDense ? (b * Hkv + kvh) * dn.S : 0;
    // One tile of K or V into `dst` (completing `bar`): full boxes by TMA, the rest (paged: the
    // boxes reaching past n_keys in the request's last tile) copied here, rows past n_keys as zeros.
    auto load_tile = [&](T* dst, const CUtensorMap* map, const T* pool, uint64_t* bar, int key0, int prow) {
      const int full = kDense ? nbr : min(nbr, max(0, (n_keys - key0) / rows_per_box));
      if (full < nbr) {
        const int per_box = rows_per_box * (D / 8);
        for (int idx = lane; idx < (nbr - full) * per_box; idx += 32) {
          const int bx = full + idx / per_box, r = (idx % per_box) / (D / 8), c = idx % (D / 8);
          const int key = key0 + bx * rows_per_box + r;
          uint4 v = make_uint4(0, 0, 0, 0);
          if (key < n_keys)
            v = *reinterpret_cast<const uint4*>(pool + row_offset(keys.row(key), Hkv * D) + kv_col + c * 8);
          *reinterpret_cast<uint4*>(dst + wg_off<BN>(bx * rows_per_box + r, c)) = v;
        }
        fence_proxy_async();
      }
      __syncwarp();
      if (lane == 0) mbar_arrive_expect_tx(bar, full * C::CB * rows_per_box * 128);
      __syncwarp();
      if (full > 0) {
        const int bx = lane % full, cb = lane / full;
        const int row = __shfl_sync(0xffffffffu, prow, bx);
        if (lane < full * C::CB)
          tma_load_2d(dst + cb * BN * 64 + bx * rows_per_box * 64, map, kv_col + cb * 64, row, bar);
      }
    };
    // Pool row of box `lane`'s first key in tile kt (the box lies in one page), read a tile ahead.
    auto box_row = [&](int kt) {
      const int key = kt * BN + lane * rows_per_box;
      if constexpr (kDense) return kv_row0 + key;
      return kt < n_tiles && lane < nbr && key < n_keys ? keys.row(key) : 0;
    };
    // The key ids of tile kt into ring slot st (read by the consumers' softmax after k_full).
    auto load_seg = [&](int kt, int st) {
      if constexpr (use_seg) {
        for (int i = lane; i < BN; i += 32) {
          const int key = kt * BN + i;
          sSeg[st * BN + i] = key < kv_len ? seg_row[key] : -1;
        }
      }
    };
    // Order of the loads: K of the first visited tile, then K of visit v before V of visit v - 1
    // (what consumer iteration v waits for).
    int kt = next_tile(0);
    if (kt >= n_tiles) return;
    int kt_next = next_tile(kt + 1);
    int prow = box_row(kt), prow_next = box_row(kt_next);
    load_seg(kt, 0);
    load_tile(sK, &k_map, k_cache, &k_full[0], kt * BN, prow);
    for (int v = 1;; ++v) {
      const int prev_kt = kt, prev = prow;
      kt = kt_next;
      prow = prow_next;
      if (kt < n_tiles) {
        kt_next = next_tile(kt + 1);
        prow_next = box_row(kt_next);
        const int st = v % ST;
        if (v >= ST) mbar_wait(&k_empty[st], ((v / ST) - 1) & 1);
        load_seg(kt, st);
        load_tile(sK + st * C::kTileElems, &k_map, k_cache, &k_full[st], kt * BN, prow);
      }
      const int pst = (v - 1) % ST;
      if (v - 1 >= ST) mbar_wait(&v_empty[pst], (((v - 1) / ST) - 1) & 1);
      load_tile(sV + pst * C::kTileElems, &v_map, v_cache, &v_full[pst], prev_kt * BN, prev);
      if (kt >= n_tiles) break;
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
  const uint32_t k_addr = smem_u32(sK), v_addr = smem_u32(sV), ones_addr = smem_u32(sOnes);
  constexpr bool kRowSum = !C::kRowSumMma;  // the softmax sums the rows itself
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
  auto issue_pv = [&](uint32_t v_tile) {
    if constexpr (C::kRowSumMma) wg_issue_pv_rowsum<T, BN>(o, pa, v_tile, ones_addr);
    else wg_issue_pv<T, D, BN>(o, pa, v_tile);
  };

  // Tiles written by the producer's cp.async copies are generic-proxy writes: fenced to the async
  // proxy (the wgmma reads) by each consumer thread after the barrier wait.
  auto copied_fence = [&] {
    if (!use_tma) fence_proxy_async();
  };
  // Masked softmax of visited tile kt in stage st. With segment ids the warpgroup's own 64 rows
  // decide: a tile none of them can see gives P = 0 without a softmax (the block visits it for its
  // other warpgroups), one whose ids and theirs are all one id needs no segment mask, and only
  // when the mask reads the slot's key ids is K's slot released after the softmax (else before).
  const int wg_begin = row0 + cw * 64;
  const bool wg_rows = wg_begin < q_len;
  const int4 wg_rng = use_seg && wg_rows ? seg_union(rng_row, wg_begin, min(q_len, wg_begin + 64)) : q_rng;
  SegmentMask seg{false, nullptr, {-1, -1}};
  if constexpr (use_seg)
    for (int hf = 0; hf < 2; ++hf) seg.row_id[hf] = wrow0 + 8 * hf < q_len ? seg_row[wrow0 + 8 * hf] : -1;
  auto softmax = [&](int kt, int st) {
    if constexpr (!use_seg) {
      if (lane == 0) mbar_arrive(&k_empty[st]);
      wg_softmax<BN, kRowSum>(s, m, l, alpha, kt * BN, first_masked, wrow0, delta, kv_len, lane, sl);
    } else {
      const int4 t_rng = tile_range(kt);
      if (!wg_rows || !seg_meet(wg_rng, t_rng)) {
        if (lane == 0) mbar_arrive(&k_empty[st]);
#pragma unroll
        for (int i = 0; i < C::SD; ++i) s[i] = 0.0f;
        alpha[0] = alpha[1] = 1.0f;
        return;
      }
      seg.on = !seg_same(wg_rng, t_rng);
      if (!seg.on) {
        if (lane == 0) mbar_arrive(&k_empty[st]);
        wg_softmax<BN, kRowSum>(s, m, l, alpha, kt * BN, first_masked, wrow0, delta, kv_len, lane, sl);
        return;
      }
      seg.seg_k = sSeg + st * BN;
      wg_softmax<BN, kRowSum>(s, m, l, alpha, kt * BN, first_masked, wrow0, delta, kv_len, lane, sl, seg);
      if (lane == 0) mbar_arrive(&k_empty[st]);
    }
  };
  int kt = next_tile(0);
  mbar_wait(q_full, 0);  // also when no tile is visited: the block must not exit under the Q load
  if (kt < n_tiles) {
    mbar_wait(&k_full[0], 0);
    copied_fence();
    turn_wait();
    wgmma_fence();
    wg_issue_s<T, D, C::BM, BN>(s, q_addr, k_addr);
    wgmma_commit();
    turn_pass();
    wgmma_wait<0>();
    fence_regs(s);
    softmax(kt, 0);
    wg_pack_p<T, BN>(s, pa);

    int v = 1;
    for (int kn = next_tile(kt + 1); kn < n_tiles; kt = kn, kn = next_tile(kn + 1), ++v) {
      const int st = v % ST, pst = (v - 1) % ST;
      mbar_wait(&k_full[st], (v / ST) & 1);
      copied_fence();
      turn_wait();
      wgmma_fence();
      wg_issue_s<T, D, C::BM, BN>(s, q_addr, k_addr + st * kTileBytes);
      wgmma_commit();
      mbar_wait(&v_full[pst], ((v - 1) / ST) & 1);
      copied_fence();
      issue_pv(v_addr + pst * kTileBytes);
      wgmma_commit();
      turn_pass();
      wgmma_wait<1>();
      fence_regs(s);
      softmax(kn, st);
      wgmma_wait<0>();
      fence_regs(o);
      if (lane == 0) mbar_arrive(&v_empty[pst]);
      wg_rescale(o, alpha);
      wg_pack_p<T, BN>(s, pa);
    }
    const int lst = (v - 1) % ST;
    mbar_wait(&v_full[lst], ((v - 1) / ST) & 1);
    copied_fence();
    turn_wait();
    wgmma_fence();
    issue_pv(v_addr + lst * kTileBytes);
    wgmma_commit();
    turn_pass();
    wgmma_wait<0>();
    fence_regs(o);
  }
  float* lse_row = kDense ? dn.lse + static_cast<int64_t>(b * Hq + h) * dn.S : nullptr;
  wg_store<T, D, C::OD>(out, o, l, wrow0, q_start, q_len, Hq, h, lane, m, lse_row);
#else
  __trap();  // wgmma needs sm_90a; the host never selects this kernel elsewhere
#endif
}

// The configuration per head dimension. D=64: 3 consumer warpgroups (BM=192), 3 stages; measured
// against 2 (BM=128, 4 stages) at L=30000: 6.23 ms against 7.53. D=128: 2 consumer warpgroups,
// 2 stages (shared memory).
using WsD64 = WsCfg<64, 3, 128, 3>;
using WsD128 = WsCfg<128, 2, 128, 2>;

template <typename T, typename C, int kLayout>
void launch_ws(CudaBackend& be, const CUtensorMap& q_map, const CUtensorMap& k_map, const CUtensorMap& v_map,
               void* out, const void* k, const void* v, const int* q_indptr, PagedArgs kv, const DenseKernelArgs& dn,
               int B, int Hq, int Hkv, int box_rows, int max_q_len, float sl) {
  auto kernel = attn_ws_kernel<T, C, kLayout>;
  static_assert(C::kSmemBytes + 1024 <= 228 * 1024, "shared memory per SM (1 KiB reserved per block)");
  attention_allow_smem(be, kernel_key(kernel), C::kSmemBytes);
  const int num_qtiles = (max_q_len + C::BM - 1) / C::BM;
  dim3 grid(num_qtiles, Hq, B);
  kernel<<<grid, C::NT, C::kSmemBytes, be.stream()>>>(static_cast<T*>(out), q_map, k_map, v_map,
                                                      static_cast<const T*>(k), static_cast<const T*>(v), q_indptr,
                                                      kv, dn, Hq, Hkv, Hq / Hkv, box_rows, num_qtiles, sl);
  CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename C>
void launch_paged(CudaBackend& be, const Args& a, int box_rows) {
  constexpr int D = C::D;
  const CUtensorMap q_map = bf16_tile_map(a.q, a.q_rows, static_cast<int64_t>(a.Hq) * D, 64, 64,
                                          CU_TENSOR_MAP_SWIZZLE_128B);
  CUtensorMap k_map{}, v_map{};  // unused (not encoded) when the producer copies
  if (box_rows > 0) {
    k_map = bf16_tile_map(a.k, a.kv_rows, static_cast<int64_t>(a.Hkv) * D, box_rows, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    v_map = bf16_tile_map(a.v, a.kv_rows, static_cast<int64_t>(a.Hkv) * D, box_rows, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  }
  launch_ws<T, C, kPaged>(be, q_map, k_map, v_map, a.out, a.k, a.v, a.q_indptr, a.kv, DenseKernelArgs{}, a.B, a.Hq,
                         a.Hkv, box_rows, a.max_q_len, a.sl);
}

template <typename C>
void launch_dense(CudaBackend& be, const DenseArgs& a) {
  constexpr int D = C::D;
  const int64_t q_rows = static_cast<int64_t>(a.B) * a.Hq * a.S, kv_rows = static_cast<int64_t>(a.B) * a.Hkv * a.S;
  const CUtensorMap q_map = bf16_tile_map(a.q, q_rows, D, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap k_map = bf16_tile_map(a.k, kv_rows, D, C::BN, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap v_map = bf16_tile_map(a.v, kv_rows, D, C::BN, 64, CU_TENSOR_MAP_SWIZZLE_128B);
  const DenseKernelArgs dn{a.lse, a.seg, a.seg_ranges, a.S, a.n_gran, a.causal ? 1 : 0};
  auto launch = [&](auto layout) {
    launch_ws<__nv_bfloat16, C, decltype(layout)::value>(be, q_map, k_map, v_map, a.out, a.k, a.v, nullptr,
                                                         PagedArgs{}, dn, a.B, a.Hq, a.Hkv, C::BN, a.S, a.sl);
  };
  if (a.seg != nullptr) return launch(std::integral_constant<int, kDenseSegments>{});
  launch(std::integral_constant<int, kDenseLayout>{});
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
  if (a.D == 64) return launch_paged<T, WsD64>(be, a, box_rows);
  launch_paged<T, WsD128>(be, a, box_rows);
}

void launch_dense_ws(CudaBackend& be, const DenseArgs& a) {
  if (a.D == 64) return launch_dense<WsD64>(be, a);
  launch_dense<WsD128>(be, a);
}

template void launch_prefill_ws<__nv_bfloat16>(CudaBackend&, const Args&);
template void launch_prefill_ws<__half>(CudaBackend&, const Args&);

}  // namespace kiln::cuda::attn
