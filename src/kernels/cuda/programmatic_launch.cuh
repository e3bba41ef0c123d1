// Programmatic dependent launch for the kernels of a decode step (CudaBackend::programmatic_launch).
//
// A kernel launched through launch_programmatic may begin while the kernel before it in the stream
// is still running: once every block of that predecessor has executed hopper::launch_dependents()
// (or exited), the new grid's blocks are scheduled as resources free up. Such a kernel must
//   * call hopper::grid_dependency_wait() in every block before it reads anything an earlier kernel
//     wrote or writes anything an earlier kernel reads (the wait returns once the predecessors have
//     completed and their writes are visible; without the attribute it returns at once), and reach
//     that wait before any early exit, so that the grid never completes ahead of its predecessors;
//   * read only launch-invariant data (weights) before the wait.
// Kernels that call launch_dependents() early let their successor's weight stream start under their
// own tail; the graph capture records the edges as programmatic, so replays keep the overlap.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda_backend.h"

namespace kiln::cuda::detail {

// Launches kernel<<<grid, block, smem>>> on the backend's stream, in clusters of `cluster` blocks when
// that is more than one, with programmatic stream serialization when the backend has it on.
template <typename... Params, typename... Args>
void launch_programmatic(const CudaBackend& be, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         dim3 cluster, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = static_cast<cudaStream_t>(be.stream());
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  if (be.programmatic_launch()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace kiln::cuda::detail
