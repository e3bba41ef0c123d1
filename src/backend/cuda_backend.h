// CudaBackend: one CUDA device, one stream, a cuBLASLt handle, a scratch workspace and a caching
// allocator. Every op issued through the backend runs in order on its stream, so memory freed to
// the cache is safe to hand out again to later work on the same stream.
// Only compiled when CUDA is available (KILN_WITH_CUDA); include it only from CUDA-aware code.
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

struct CUstream_st;
struct cublasLtContext;

namespace kiln {

// Size-bucketed cache of device allocations. Blocks are rounded up (512 B for small, 2 MiB for
// large requests) and reused best-fit; when cudaMalloc fails the cache is emptied and the
// allocation retried once before out_of_memory is returned.
class CudaCachingAllocator {
 public:
  explicit CudaCachingAllocator(int device) : device_(device) {}
  ~CudaCachingAllocator();
  Result<void*> allocate(int64_t bytes);
  void deallocate(void* ptr, int64_t bytes);
  void release_cached();
  int64_t bytes_in_use() const { return in_use_; }
  int64_t bytes_cached() const { return cached_; }
  int64_t peak_bytes_in_use() const { return peak_in_use_; }  // since creation

 private:
  static int64_t round_size(int64_t bytes);
  int device_;
  std::multimap<int64_t, void*> free_blocks_;  // rounded size -> block
  std::map<void*, int64_t> live_blocks_;       // block -> rounded size
  int64_t in_use_ = 0;
  int64_t cached_ = 0;
  int64_t peak_in_use_ = 0;
};

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(int device_index);
  // Usable CUDA devices; 0 when there is no driver or no GPU.
  static int device_count();
  ~CudaBackend() override;

  Device device() const override { return Device::cuda(device_index_); }
  std::string device_uuid() const override { return uuid_; }
  Result<void*> allocate(int64_t bytes) override {
    ++allocations_;
    return allocator_.allocate(bytes);
  }
  int64_t allocation_count() const override { return allocations_; }
  void deallocate(void* ptr, int64_t bytes) override { allocator_.deallocate(ptr, bytes); }
  void copy(Tensor dst, Tensor src) override;
  void copy_async(Tensor dst, Tensor src) override;
  Result<void*> allocate_pinned(int64_t bytes) override;
  void deallocate_pinned(void* ptr, int64_t bytes) override;
  Result<std::pair<int64_t, int64_t>> memory_info() override;
  std::pair<int64_t, int64_t> allocator_bytes() const override {
    return {allocator_.bytes_in_use(), allocator_.peak_bytes_in_use()};
  }
  void zero(Tensor t) override;
  Status synchronize() override;
  std::unique_ptr<Event> create_event() override;
  Result<std::unique_ptr<CapturedWork>> capture(const std::function<void()>& issue) override;

  CUstream_st* stream() const { return stream_; }
  cublasLtContext* blaslt() const { return blaslt_; }
  // Scratch memory for ops (cuBLASLt workspace, split-K partials); ops must not hold it across
  // calls. Grows only outside CUDA graph capture; an outgrown buffer stays allocated until the
  // backend is destroyed, because captured graphs may still point at it. Throws OutOfMemory
  // (core/status.h) when the device has no room for it.
  void* scratch(int64_t bytes);
  int multiprocessor_count() const { return sm_count_; }
  // The prefill attention kernel variant ops run with (kernels/cuda/attention_internal.h); -1 means
  // the kernel's default (or KILN_ATTN_PREFILL_VARIANT). For tests and benchmarks.
  int attention_prefill_variant() const { return attention_prefill_variant_; }
  void set_attention_prefill_variant(int v) { attention_prefill_variant_ = v < 0 ? -1 : v; }
  // Whether kernels written for it launch with programmatic stream serialization (kernels/cuda/
  // programmatic_launch.cuh): such a kernel may start while its predecessor in the stream drains,
  // issuing the loads that do not depend on it. On by default; KILN_PDL=0 or this setter turns it
  // off (tests and benchmarks compare both).
  bool programmatic_launch() const { return programmatic_launch_; }
  void set_programmatic_launch(bool on) { programmatic_launch_ = on; }
  CudaCachingAllocator& allocator() { return allocator_; }
  // Opaque state the CUDA kernels keep per backend (kernels/cuda/gemm.cu: cached cuBLASLt matmul
  // plans). Created by the kernels on first use; released before the cuBLASLt handle.
  std::shared_ptr<void>& gemm_cache() { return gemm_cache_; }
  // Opaque per-backend state of the attention kernels (kernels/cuda/attention.cu, shared with
  // attention_train.cu): facts and settings of this backend's device (wgmma support, raised
  // shared-memory limits, occupancy), never held in function-local statics so that a backend on a
  // second GPU gets its own. Created by the kernels on first use.
  std::shared_ptr<void>& attention_state() { return attention_state_; }

 private:
  explicit CudaBackend(int device_index);
  int device_index_;
  int sm_count_ = 0;
  std::string uuid_;  // hex digits of the device's UUID
  int attention_prefill_variant_ = -1;
  bool programmatic_launch_ = true;
  int64_t allocations_ = 0;
  CUstream_st* stream_ = nullptr;
  cublasLtContext* blaslt_ = nullptr;
  CudaCachingAllocator allocator_;
  Buffer scratch_;
  std::vector<Buffer> retired_scratch_;  // outgrown scratch, kept alive for captured graphs
  std::shared_ptr<void> gemm_cache_;
  std::shared_ptr<void> attention_state_;
};

}  // namespace kiln

// Aborts with the CUDA error string, expression and location; for calls that cannot fail on valid
// input (a failure there is a bug or a dead device).
#define CUDA_CHECK(expr)                                                                   \
  do {                                                                                     \
    cudaError_t _kiln_err = (expr);                                                        \
    if (_kiln_err != cudaSuccess) {                                                        \
      std::fprintf(stderr, "kiln: CUDA error %s (%s) in %s at %s:%d\n",                    \
                   cudaGetErrorName(_kiln_err), cudaGetErrorString(_kiln_err), #expr,      \
                   __FILE__, __LINE__);                                                    \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)
