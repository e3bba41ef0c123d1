#include "backend/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

namespace kiln {

CudaCachingAllocator::~CudaCachingAllocator() {
  release_cached();
  for (auto& [ptr, size] : live_blocks_) cudaFree(ptr);  // leaked views: give memory back anyway
}

int64_t CudaCachingAllocator::round_size(int64_t bytes) {
  constexpr int64_t kSmall = 512, kLarge = int64_t(2) << 20;
  if (bytes <= 0) return kSmall;
  if (bytes < (int64_t(1) << 20)) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

Result<void*> CudaCachingAllocator::allocate(int64_t bytes) {
  int64_t size = round_size(bytes);
  // Best fit, but never hand out a block more than twice the request (keeps big blocks for big use).
  auto it = free_blocks_.lower_bound(size);
  if (it != free_blocks_.end() && it->first <= 2 * size) {
    void* p = it->second;
    int64_t got = it->first;
    free_blocks_.erase(it);
    cached_ -= got;
    live_blocks_[p] = got;
    in_use_ += got;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
    return p;
  }
  CUDA_CHECK(cudaSetDevice(device_));
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, static_cast<size_t>(size));
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    release_cached();
    err = cudaMalloc(&p, static_cast<size_t>(size));
    if (err != cudaSuccess) {
      cudaGetLastError();
      return out_of_memory("CUDA device " + std::to_string(device_) + " is out of memory allocating " +
                           std::to_string(size) + " bytes (" + std::to_string(in_use_) +
                           " in use); use a smaller model, batch or context");
    }
  }
  live_blocks_[p] = size;
  in_use_ += size;
  peak_in_use_ = std::max(peak_in_use_, in_use_);
  return p;
}

void CudaCachingAllocator::deallocate(void* ptr, int64_t) {
  if (!ptr) return;
  auto it = live_blocks_.find(ptr);
  KILN_ASSERT(it != live_blocks_.end());
  free_blocks_.emplace(it->second, ptr);
  cached_ += it->second;
  in_use_ -= it->second;
  live_blocks_.erase(it);
}

void CudaCachingAllocator::release_cached() {
  if (free_blocks_.empty()) return;
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  for (auto& [size, ptr] : free_blocks_) cudaFree(ptr);
  free_blocks_.clear();
  cached_ = 0;
}

int CudaBackend::device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

CudaBackend::CudaBackend(int device_index) : device_index_(device_index), allocator_(device_index) {}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int device_index) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(device_index));
  if (cudaSetDevice(device_index) != cudaSuccess) {
    cudaGetLastError();
    return unsupported("cannot use CUDA device " + std::to_string(device_index));
  }
  CUDA_CHECK(cudaDeviceGetAttribute(&b->sm_count_, cudaDevAttrMultiProcessorCount, device_index));
  cudaDeviceProp props{};
  CUDA_CHECK(cudaGetDeviceProperties(&props, device_index));
  for (unsigned char byte : props.uuid.bytes) {
    const char* hex = "0123456789abcdef";
    b->uuid_ += hex[byte >> 4];
    b->uuid_ += hex[byte & 15];
  }
  if (const char* pdl = std::getenv("KILN_PDL")) b->programmatic_launch_ = std::string(pdl) != "0";
  CUDA_CHECK(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
  cublasLtHandle_t h = nullptr;
  if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) return unsupported("cuBLASLt could not be initialised on this GPU");
  b->blaslt_ = h;
  return b;
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_index_);
  if (stream_) cudaStreamSynchronize(stream_);
  scratch_.reset();
  retired_scratch_.clear();
  gemm_cache_.reset();
  attention_state_.reset();
  if (blaslt_) cublasLtDestroy(blaslt_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaBackend::copy(Tensor dst, Tensor src) {
  KILN_ASSERT(dst.nbytes() == src.nbytes());
  if (dst.nbytes() == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(dst.nbytes()), cudaMemcpyDefault, stream_));
  if (dst.device.is_cpu()) CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_async(Tensor dst, Tensor src) {
  KILN_ASSERT(dst.nbytes() == src.nbytes());
  if (dst.nbytes() == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(dst.nbytes()), cudaMemcpyDefault, stream_));
}

Result<void*> CudaBackend::allocate_pinned(int64_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMallocHost(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
  if (err != cudaSuccess) {
    cudaGetLastError();
    return out_of_memory("pinned host allocation of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorString(err));
  }
  return p;
}

void CudaBackend::deallocate_pinned(void* ptr, int64_t) { cudaFreeHost(ptr); }

Result<std::pair<int64_t, int64_t>> CudaBackend::memory_info() {
  size_t free_bytes = 0, total = 0;
  CUDA_CHECK(cudaSetDevice(device_index_));
  cudaError_t err = cudaMemGetInfo(&free_bytes, &total);
  if (err != cudaSuccess) return Status(StatusCode::internal, std::string("cudaMemGetInfo: ") + cudaGetErrorString(err));
  return std::make_pair(static_cast<int64_t>(free_bytes) + allocator_.bytes_cached(), static_cast<int64_t>(total));
}

void CudaBackend::zero(Tensor t) {
  if (t.nbytes()) CUDA_CHECK(cudaMemsetAsync(t.data, 0, static_cast<size_t>(t.nbytes()), stream_));
}

Status CudaBackend::synchronize() {
  cudaError_t err = cudaStreamSynchronize(stream_);
  if (err != cudaSuccess)
    return Status(StatusCode::internal, std::string("CUDA error: ") + cudaGetErrorString(err));
  return Status::Ok();
}

namespace {

class CudaGraphWork final : public CapturedWork {
 public:
  CudaGraphWork(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream)
      : graph_(graph), exec_(exec), stream_(stream) {}
  ~CudaGraphWork() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void replay() override { CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(cudaStream_t stream) : stream_(stream) { CUDA_CHECK(cudaEventCreate(&event_)); }
  ~CudaEvent() override { cudaEventDestroy(event_); }
  void record() override { CUDA_CHECK(cudaEventRecord(event_, stream_)); }
  Status wait() override {
    cudaError_t err = cudaEventSynchronize(event_);
    if (err != cudaSuccess) return Status(StatusCode::internal, std::string("CUDA error: ") + cudaGetErrorString(err));
    return Status::Ok();
  }
  float elapsed_ms(const Event& start) const override {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<const CudaEvent&>(start).event_, event_));
    return ms;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace

std::unique_ptr<Event> CudaBackend::create_event() { return std::make_unique<CudaEvent>(stream_); }

Result<std::unique_ptr<CapturedWork>> CudaBackend::capture(const std::function<void()>& issue) {
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  issue();
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status(StatusCode::internal, std::string("CUDA graph capture failed: ") + cudaGetErrorString(err));
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph);
    return Status(StatusCode::internal, std::string("CUDA graph instantiation failed: ") + cudaGetErrorString(err));
  }
  return std::unique_ptr<CapturedWork>(new CudaGraphWork(graph, exec, stream_));
}

void* CudaBackend::scratch(int64_t bytes) {
  if (scratch_.bytes() < bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    KILN_ASSERT(capture == cudaStreamCaptureStatusNone);  // size scratch before capturing a graph
    // A captured graph may hold the old pointer: retire the buffer instead of freeing it.
    if (scratch_.data()) retired_scratch_.push_back(std::move(scratch_));
    ++allocations_;  // counted with allocate()'s: tests prove a loop allocates nothing
    Result<void*> p = allocator_.allocate(bytes);
    if (!p.ok()) throw OutOfMemory(p.status().message() + " (op scratch)");
    scratch_ = Buffer(this, *p, bytes);
  }
  return scratch_.data();
}

}  // namespace kiln
