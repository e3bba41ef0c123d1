// The mma.sync prefill kernel (family 2, variant 0 of attention.cu's description): the fallback
// off sm_90 and the reference the wgmma variants are checked against.
#include "kernels/cuda/attention_kernels.cuh"

namespace kiln::cuda::attn {
namespace {

// ------------------------------------------------------------------------------------------------
// 2. Prefill kernels (FlashAttention-2 style, tensor cores). Three variants are compiled; the
// host picks one per call (see launch_prefill_variant below and kernels/cuda/attention_internal.h).

// 2a. mma.sync kernel. NW warps, each owning MT 16-row M tiles (BM = NW * 16 * MT query rows per
// block), BN keys per K/V tile (double buffered). kQRegs: Q fragments are loaded into registers
// once (else re-read from shared memory every tile, which frees registers for BN = 128). kLazy:
// the accumulator rescale is skipped when no row of the warp changed its running max.
template <int D, int MT, int BN, int NW>
struct PrefillCfg {
  static constexpr int kThreads = NW * 32;
  static constexpr int kBM = NW * 16 * MT;  // query rows per block
  static constexpr int kChunks = D / 8;     // 16-byte chunks per row
  // Q + double-buffered K and V, + the two K/V tiles' pool rows (TileRows).
  static constexpr int kSmemBytes = (kBM * D + 4 * BN * D) * 2 + 2 * BN * 4;
};


template <typename T, int D, int MT, int BN, int NW, bool kQRegs, bool kLazy>
__global__ void __launch_bounds__(NW * 32, (NW == 8 && D > 64) ? 1 : 2)
    attn_prefill_kernel(T* __restrict__ out, const T* __restrict__ q, const T* __restrict__ k_cache,
                        const T* __restrict__ v_cache, const int* __restrict__ q_indptr, PagedArgs kv, int Hq,
                        int Hkv, int G, int num_qtiles, float sl) {
  using Cfg = PrefillCfg<D, MT, BN, NW>;
  constexpr int NT = Cfg::kThreads;
  constexpr int BM = Cfg::kBM;
  constexpr int NC = Cfg::kChunks;
  constexpr int KS = D / 16;  // k steps of QK
  constexpr int SN = BN / 8;  // n tiles of S
  constexpr int DN = D / 8;   // n tiles of O
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * D;      // [2][BN][D]
  T* sV = sK + 2 * BN * D;  // [2][BN][D]
  static_assert(BN <= NT, "one thread per tile row in TileRows");
  TileRows<BN> tile_rows{reinterpret_cast<int*>(sV + 2 * BN * D)};

  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int qt = num_qtiles - 1 - static_cast<int>(blockIdx.x);  // heaviest tiles first
  const int q_start = q_indptr[b];
  const int q_len = q_indptr[b + 1] - q_start;
  const int row0 = qt * BM;
  if (row0 >= q_len) return;  // every block of a request without queries (padding) exits here
  const int kv_len = request_kv_len(kv, b);
  const PagedKeys keys = request_keys(kv, b);
  const int kvh = h / G;
  const int delta = kv_len - q_len;  // position of query i is delta + i
  const int row_end = min(q_len, row0 + BM);
  const int n_keys = max(0, min(kv_len, delta + row_end));
  const int n_tiles = (n_keys + BN - 1) / BN;
  const int first_masked = delta + row0 + 1;  // keys >= this are masked for some row of the block

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int64_t q_stride = static_cast<int64_t>(Hq) * D;
  const T* q_base = q + (static_cast<int64_t>(q_start) * Hq + h) * D;
  const T* k_base = k_cache + static_cast<int64_t>(kvh) * D;
  const T* v_base = v_cache + static_cast<int64_t>(kvh) * D;

  // Q tile.
  for (int idx = tid; idx < BM * NC; idx += NT) {
    const int r = idx / NC, c = idx % NC;
    const bool ok = row0 + r < q_len;
    const T* src = q_base + (ok ? static_cast<int64_t>(row0 + r) * q_stride + c * 8 : 0);
    cp_async16(smem_u32(sQ + swz<D>(r, c)), src, ok);
  }
  // K/V tile copies: thread tid copies 16-byte chunk c = tid % NC of tile rows tr0 + i * RS (RS a
  // multiple of 8, so the swizzle term and the chunk are the same for every i), from the pool rows
  // in tile_rows: per copied row one shared-memory load and one widening multiply-add per address.
  constexpr int RS = NT / NC;
  static_assert(NT % NC == 0 && RS % 8 == 0 && BN % RS == 0, "K/V load mapping");
  const int tr0 = tid / NC, tc = tid % NC;
  const int kv_row = Hkv * D;                // elements per pool row
  const T* k_chunk = k_base + tc * 8;        // this thread's chunk of pool row 0
  const T* v_chunk = v_base + tc * 8;
  auto load_kv = [&](int tile, int buf) {
    const uint32_t dk = smem_u32(sK + buf * BN * D + swz<D>(tr0, tc));
    const uint32_t dv = smem_u32(sV + buf * BN * D + swz<D>(tr0, tc));
    constexpr uint32_t kRowStep = RS * D * sizeof(T);  // bytes between a thread's rows in the tile
    const int key0 = tile * BN;
    const int* rows = tile_rows.rows + (tile & 1) * BN + tr0;
#pragma unroll
    for (int i = 0; i < BN / RS; ++i) {
      const bool ok = key0 + tr0 + i * RS < n_keys;
      const int row = ok ? rows[i * RS] : 0;
      cp_async16(dk + i * kRowStep, k_chunk + row_offset(row, kv_row), ok);
      cp_async16(dv + i * kRowStep, v_chunk + row_offset(row, kv_row), ok);
    }
  };
  // Pool rows of the first two tiles, then the first K/V tile.
  for (int tile = 0; tile < 2 && tile < n_tiles; ++tile) {
    tile_rows.fetch(keys, tile, n_keys, tid);
    tile_rows.store(keys, tile, tid);
  }
  __syncthreads();
  if (n_tiles > 0) load_kv(0, 0);
  cp_async_commit();

  float acc[MT][DN][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) acc[mt][dn][0] = acc[mt][dn][1] = acc[mt][dn][2] = acc[mt][dn][3] = 0.0f;
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  uint32_t qf[kQRegs ? MT : 1][kQRegs ? KS : 1][4];

  const int warp_row0 = warp * 16 * MT;  // first tile row of this warp
  auto q_frag = [&](uint32_t (&r4)[4], int mt, int kk) {
    const int r = warp_row0 + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int c = 2 * kk + (lane >> 4);
    ldmatrix_x4(r4, smem_u32(sQ + swz<D>(r, c)));
  };
  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) load_kv(tile + 1, (tile + 1) & 1);
    if (tile + 2 < n_tiles) tile_rows.fetch(keys, tile + 2, n_keys, tid);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (kQRegs) {
      if (tile == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int kk = 0; kk < KS; ++kk) q_frag(qf[mt][kk], mt, kk);
      }
    }
    const T* cK = sK + (tile & 1) * BN * D;
    const T* cV = sV + (tile & 1) * BN * D;

    // S = Q K^T
    float s[MT][SN][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < SN; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      uint32_t qs[kQRegs ? 1 : MT][4];
      if constexpr (!kQRegs) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) q_frag(qs[mt], mt, kk);
      }
#pragma unroll
      for (int np = 0; np < SN / 2; ++np) {
        uint32_t bk[4];
        const int r = np * 16 + (lane & 7) + (lane >> 4) * 8;
        const int c = 2 * kk + ((lane >> 3) & 1);
        ldmatrix_x4(bk, smem_u32(cK + swz<D>(r, c)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t(&qa)[4] = kQRegs ? qf[kQRegs ? mt : 0][kQRegs ? kk : 0] : qs[kQRegs ? 0 : mt];
          Mma<T>::mma(s[mt][2 * np], qa, bk[0], bk[1]);
          Mma<T>::mma(s[mt][2 * np + 1], qa, bk[2], bk[3]);
        }
      }
    }

    // Mask tiles that cross the diagonal or the end of the keys.
    const int key0 = tile * BN;
    if (key0 + BN > first_masked || key0 + BN > kv_len) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row0 + warp_row0 + mt * 16 + (lane >> 2) + (e >> 1) * 8;
            const int key = key0 + nt * 8 + (lane & 3) * 2 + (e & 1);
            if (key > delta + row || key >= kv_len) s[mt][nt][e] = -INFINITY;
          }
    }

    // Online softmax.
    float alpha[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < SN; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][hf], mx * sl);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        alpha[mt][hf] = fast_exp2(m[mt][hf] - m_use);
        m[mt][hf] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < SN; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = fast_exp2(fmaf(s[mt][nt][2 * hf + e], sl, -m_use));
            s[mt][nt][2 * hf + e] = p;
            sum += p;
          }
        l[mt][hf] = l[mt][hf] * alpha[mt][hf] + sum;
      }
    bool rescale = true;
    if constexpr (kLazy) {
      bool changed = false;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) changed |= (alpha[mt][0] != 1.0f) | (alpha[mt][1] != 1.0f);
      rescale = __any_sync(0xffffffffu, changed);
    }
    if (rescale) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dn = 0; dn < DN; ++dn) {
          acc[mt][dn][0] *= alpha[mt][0];
          acc[mt][dn][1] *= alpha[mt][0];
          acc[mt][dn][2] *= alpha[mt][1];
          acc[mt][dn][3] *= alpha[mt][1];
        }
    }

    // O += P V (P stays in registers: S's C fragments are the A fragments of the PV product).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = Mma<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = Mma<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = Mma<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = Mma<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bv[4];
        const int r = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int c = 2 * dp + (lane >> 4);
        ldmatrix_x4_trans(bv, smem_u32(cV + swz<D>(r, c)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma<T>::mma(acc[mt][2 * dp], pa[mt], bv[0], bv[1]);
          Mma<T>::mma(acc[mt][2 * dp + 1], pa[mt], bv[2], bv[3]);
        }
      }
    }
    if (tile + 2 < n_tiles) tile_rows.store(keys, tile + 2, tid);
    __syncthreads();  // everyone is done with this buffer before it is refilled (and sees the rows)
  }
  cp_async_wait<0>();

  // Epilogue: normalise and store (rows past q_len are not written).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float lsum = l[mt][hf];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
      const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
      const int row = row0 + warp_row0 + mt * 16 + (lane >> 2) + hf * 8;
      if (row >= q_len) continue;
      T* dst = out + (static_cast<int64_t>(q_start + row) * Hq + h) * D + (lane & 3) * 2;
#pragma unroll
      for (int dn = 0; dn < DN; ++dn)
        *reinterpret_cast<uint32_t*>(dst + dn * 8) =
            Mma<T>::pack(acc[mt][dn][2 * hf] * inv, acc[mt][dn][2 * hf + 1] * inv);
    }
}

template <typename T, int D, int MT, int BN, int NW, bool kQRegs, bool kLazy>
void launch_prefill(CudaBackend& be, const Args& a) {
  using Cfg = PrefillCfg<D, MT, BN, NW>;
  auto kernel = attn_prefill_kernel<T, D, MT, BN, NW, kQRegs, kLazy>;
  constexpr int smem = Cfg::kSmemBytes;
  attention_allow_smem(be, kernel_key(kernel), smem);
  const int num_qtiles = (a.max_q_len + Cfg::kBM - 1) / Cfg::kBM;
  dim3 grid(num_qtiles, a.Hq, a.B);
  kernel<<<grid, Cfg::kThreads, smem, be.stream()>>>(static_cast<T*>(a.out), static_cast<const T*>(a.q),
                                                     static_cast<const T*>(a.k), static_cast<const T*>(a.v),
                                                     a.q_indptr, a.kv, a.Hq, a.Hkv, a.G, num_qtiles, a.sl);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <typename T>
void launch_prefill_mma(CudaBackend& be, const Args& a) {
  if (a.D == 64)
    launch_prefill<T, 64, 2, 64, 4, true, false>(be, a);
  else
    launch_prefill<T, 128, 1, 64, 4, true, false>(be, a);
}

template void launch_prefill_mma<__nv_bfloat16>(CudaBackend&, const Args&);
template void launch_prefill_mma<__half>(CudaBackend&, const Args&);

}  // namespace kiln::cuda::attn
