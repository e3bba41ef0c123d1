// KV-cache write: k_cache[slots[t]] = k[t] and v_cache[slots[t]] = v[t], one row of Hkv * D elements
// per token, converted when the cache dtype differs from the new keys/values (bit-exact otherwise).
// k, v: [T, Hkv, D]; k_cache, v_cache: [S, Hkv, D]; slots: [T] i32 on the device, 0 <= slot < S
// (validated above this layer). A negative slot skips the token (padding rows of a captured batch).
// Grid (T, 2): blockIdx.y picks keys or values; 16-byte accesses when the row length is a multiple
// of 8 elements and all bases are aligned.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernel_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 128;

struct KvArgs {
  void* cache[2];
  const void* src[2];
  DType cache_dt[2];
  DType src_dt[2];
};

template <int N>
__global__ void __launch_bounds__(kThreads) kv_write_kernel(KvArgs args, const int32_t* slots, int64_t row) {
  const int64_t t = blockIdx.x;
  const bool is_v = blockIdx.y != 0;
  const int32_t slot = slots[t];
  if (slot < 0) return;
  void* cache = is_v ? args.cache[1] : args.cache[0];
  const void* src = is_v ? args.src[1] : args.src[0];
  const DType cache_dt = is_v ? args.cache_dt[1] : args.cache_dt[0];
  const DType src_dt = is_v ? args.src_dt[1] : args.src_dt[0];
  const int64_t dst_base = static_cast<int64_t>(slot) * row, src_base = t * row;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * N; i < row; i += static_cast<int64_t>(kThreads) * N) {
    float v[N];
    detail::load_vec<N>(src, src_base + i, src_dt, v);
    detail::store_vec<N>(cache, dst_base + i, cache_dt, v);
  }
}

}  // namespace

void kv_cache_write(CudaBackend& be, Tensor k_cache, Tensor v_cache, Tensor k, Tensor v, Tensor slots) {
  detail::check_float(be, k_cache);
  detail::check_float(be, v_cache);
  detail::check_float(be, k);
  detail::check_float(be, v);
  detail::check_i32(be, slots);
  KILN_ASSERT(k.ndim() == 3 && v.shape == k.shape);
  KILN_ASSERT(k_cache.ndim() == 3 && v_cache.shape == k_cache.shape);
  const int64_t T = k.size(0);
  KILN_ASSERT(k_cache.size(1) == k.size(1) && k_cache.size(2) == k.size(2));
  KILN_ASSERT(slots.ndim() == 1 && slots.size(0) == T);
  KILN_ASSERT(T < (int64_t(1) << 31));
  const int64_t row = k.size(1) * k.size(2);
  if (T == 0 || row == 0) return;
  KvArgs args{{k_cache.data, v_cache.data}, {k.data, v.data}, {k_cache.dtype, v_cache.dtype}, {k.dtype, v.dtype}};
  const bool vec = row % 8 == 0 && detail::aligned16(k_cache.data) && detail::aligned16(v_cache.data) &&
                   detail::aligned16(k.data) && detail::aligned16(v.data);
  const dim3 grid(static_cast<unsigned>(T), 2);
  cudaStream_t stream = detail::stream_of(be);
  if (vec)
    kv_write_kernel<8><<<grid, kThreads, 0, stream>>>(args, slots.ptr<const int32_t>(), row);
  else
    kv_write_kernel<1><<<grid, kThreads, 0, stream>>>(args, slots.ptr<const int32_t>(), row);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::cuda
