#include "backend/backend.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#ifdef KILN_WITH_CUDA
#include "backend/cuda_backend.h"
#endif

namespace kiln {

int64_t host_memory_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  int64_t limit = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  std::string v;
  if (cgroup >> v && v != "max") {
    int64_t c = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), c);
    if (ec == std::errc() && c > 0) limit = limit > 0 ? std::min(limit, c) : c;
  }
  return limit;
}

namespace {

class CpuEvent final : public Event {
 public:
  void record() override { at_ = std::chrono::steady_clock::now(); }
  Status wait() override { return Status::Ok(); }
  float elapsed_ms(const Event& start) const override {
    const auto& s = static_cast<const CpuEvent&>(start);
    return std::chrono::duration<float, std::milli>(at_ - s.at_).count();
  }

 private:
  std::chrono::steady_clock::time_point at_ = std::chrono::steady_clock::now();
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(bool batch_invariant) : limit_(host_memory_limit()), batch_invariant_(batch_invariant) {}
  Device device() const override { return Device::cpu(); }
  bool batch_invariant() const override { return batch_invariant_; }
  int64_t allocation_count() const override { return allocations_.load(); }
  Result<void*> allocate(int64_t bytes) override {
    ++allocations_;
    if (bytes == 0) bytes = 1;
    // Refused here, not by the kernel later: where memory is overcommitted a too-large allocation
    // succeeds and the process is killed when it first touches the pages.
    const int64_t live = live_bytes_.fetch_add(bytes) + bytes;
    if (limit_ > 0 && live > limit_) {
      live_bytes_ -= bytes;
      return out_of_memory("host allocation of " + std::to_string(bytes) + " bytes does not fit in this machine's " +
                           std::to_string(limit_) + " bytes of memory (" + std::to_string(live - bytes) +
                           " held by kiln)");
    }
    void* p = ::operator new(static_cast<size_t>(bytes), std::align_val_t(64), std::nothrow);
    if (!p) {
      live_bytes_ -= bytes;
      return out_of_memory("host allocation of " + std::to_string(bytes) + " bytes failed");
    }
    return p;
  }
  void deallocate(void* ptr, int64_t bytes) override {
    live_bytes_ -= bytes == 0 ? 1 : bytes;
    ::operator delete(ptr, std::align_val_t(64));
  }
  void copy(Tensor dst, Tensor src) override {
    KILN_ASSERT(dst.nbytes() == src.nbytes() && dst.device.is_cpu() && src.device.is_cpu());
    if (dst.nbytes()) std::memmove(dst.data, src.data, static_cast<size_t>(dst.nbytes()));
  }
  void zero(Tensor t) override {
    if (t.nbytes()) std::memset(t.data, 0, static_cast<size_t>(t.nbytes()));
  }
  Status synchronize() override { return Status::Ok(); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }

 private:
  std::atomic<int64_t> allocations_{0};  // the shared host instance may be used from several threads
  std::atomic<int64_t> live_bytes_{0};
  const int64_t limit_;
  const bool batch_invariant_;
};

// Stateless, so one shared instance for host buffers is safe.
Backend& host_backend() {
  static CpuBackend backend(false);
  return backend;
}

}  // namespace

Result<TensorBuffer> empty(Backend& backend, Shape shape, DType dtype) {
  int64_t bytes = shape.numel() * dtype_size(dtype);
  KILN_ASSIGN_OR_RETURN(void* p, backend.allocate(bytes));
  Tensor t;
  t.data = p;
  t.dtype = dtype;
  t.device = backend.device();
  t.shape = shape;
  return TensorBuffer(Buffer(&backend, p, bytes), t);
}

Result<void*> Backend::allocate_pinned(int64_t bytes) { return host_backend().allocate(bytes); }
void Backend::deallocate_pinned(void* ptr, int64_t bytes) { host_backend().deallocate(ptr, bytes); }

Result<TensorBuffer> pinned_host_empty(Backend& backend, Shape shape, DType dtype) {
  const int64_t bytes = shape.numel() * dtype_size(dtype);
  KILN_ASSIGN_OR_RETURN(void* p, backend.allocate_pinned(bytes));
  Tensor t;
  t.data = p;
  t.dtype = dtype;
  t.device = Device::cpu();
  t.shape = shape;
  return TensorBuffer(Buffer(&backend, p, bytes, true), t);
}

TensorBuffer empty_for_op(Backend& backend, Shape shape, DType dtype) {
  Result<TensorBuffer> r = empty(backend, shape, dtype);
  if (!r.ok()) throw OutOfMemory(r.status().message());
  return std::move(r).value();
}

TensorBuffer host_empty(Shape shape, DType dtype) { return empty_for_op(host_backend(), shape, dtype); }

TensorBuffer to_host(Backend& backend, Tensor src) {
  TensorBuffer out = host_empty(src.shape, src.dtype);
  if (src.device.is_cpu())
    host_backend().copy(out, src);
  else
    backend.copy(out, src);
  return out;
}

Result<TensorBuffer> to_device(Backend& backend, Tensor src) {
  KILN_ASSIGN_OR_RETURN(TensorBuffer out, empty(backend, src.shape, src.dtype));
  backend.copy(out, src);
  return out;
}

std::unique_ptr<Backend> make_cpu_backend(bool batch_invariant) {
  return std::make_unique<CpuBackend>(batch_invariant);
}

int cuda_device_count() {
#ifdef KILN_WITH_CUDA
  return CudaBackend::device_count();
#else
  return 0;
#endif
}

Result<std::unique_ptr<Backend>> make_backend(Device device) {
  if (device.is_cpu()) return make_cpu_backend();
#ifdef KILN_WITH_CUDA
  int n = cuda_device_count();
  if (n == 0)
    return unsupported("--device cuda was requested but no CUDA GPU is usable here (no device or no driver); use --device cpu");
  if (device.index < 0 || device.index >= n)
    return invalid_argument("CUDA device " + std::to_string(device.index) + " does not exist; this machine has " +
                            std::to_string(n) + " GPU(s)");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> b, CudaBackend::create(device.index));
  return std::unique_ptr<Backend>(std::move(b));
#else
  return unsupported("--device cuda was requested but this kiln build has no CUDA support (nvcc was not found at build time); use --device cpu");
#endif
}

Result<Device> parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda" || s == "gpu") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    long idx = std::strtol(s.c_str() + 5, &end, 10);
    if (end && *end == '\0' && end != s.c_str() + 5 && idx >= 0 && idx < 1024) return Device::cuda(static_cast<int>(idx));
  }
  return invalid_argument("unknown device '" + s + "'; expected cpu, cuda or cuda:N");
}

}  // namespace kiln
