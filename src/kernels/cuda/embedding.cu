// Embedding lookup: out[t, :] = table[ids[t], :], converted to out's dtype (bit-exact copy when the
// dtypes agree, since every float format converts to f32 and back exactly).
// ids: [T] i32 on the device (each in [0, V): validated above this layer), table: [V, H], out: [T, H].
// One block per token row; 16-byte accesses when H % 8 == 0 and both bases are 16-byte aligned.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/hopper_util.cuh"
#include "kernels/cuda/kernel_util.cuh"
#include "kernels/cuda/programmatic_launch.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

template <int N>
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(void* out, DType out_dt, const void* table, DType table_dt, const int32_t* ids, int64_t H) {
  hopper::launch_dependents();
  hopper::grid_dependency_wait();  // ids, or the rows gathered, may come from the kernel before
  const int64_t t = blockIdx.x;
  const int64_t src = static_cast<int64_t>(ids[t]) * H, dst = t * H;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * N; i < H; i += static_cast<int64_t>(blockDim.x) * N) {
    float v[N];
    detail::load_vec<N>(table, src + i, table_dt, v);
    detail::store_vec<N>(out, dst + i, out_dt, v);
  }
}

}  // namespace

void embedding_forward(CudaBackend& be, Tensor out, Tensor table, Tensor ids) {
  detail::check_float(be, out);
  detail::check_float(be, table);
  detail::check_i32(be, ids);
  KILN_ASSERT(table.ndim() == 2 && out.ndim() == 2 && ids.ndim() == 1);
  const int64_t H = table.size(1), T = ids.size(0);
  KILN_ASSERT(out.size(0) == T && out.size(1) == H);
  KILN_ASSERT(T < (int64_t(1) << 31));
  if (T == 0 || H == 0) return;
  const bool vec = H % 8 == 0 && detail::aligned16(out.data) && detail::aligned16(table.data);
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(32, detail::ceil_div(H, vec ? 8 : 1))));
  detail::launch_programmatic(be, vec ? embedding_kernel<8> : embedding_kernel<1>, dim3(static_cast<unsigned>(T)),
                              dim3(static_cast<unsigned>(threads)), 0, 1, out.data, out.dtype, table.data, table.dtype,
                              ids.ptr<const int32_t>(), H);
}

}  // namespace kiln::cuda
