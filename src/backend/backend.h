// Backend: one device's memory, copies and ordering. CpuBackend runs everything inline on the
// calling thread; CudaBackend (backend/cuda_backend.h) owns a stream, a cuBLASLt handle, a scratch
// workspace and a caching allocator, and every op issued through it is ordered on that stream.
// Buffers and TensorBuffers are RAII owners of device memory; Tensor (core) is the view.
// Thread safety: a Backend is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "core/status.h"
#include "core/tensor.h"

namespace kiln {

// A recorded sequence of device work that can be replayed with the same buffers (a CUDA graph).
// Inputs change between replays by writing new values into the recorded buffers.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual void replay() = 0;
};

// A point in a backend's stream of work, for timing and for waiting on part of the work.
// CPU events are host timestamps (CPU work is synchronous).
class Event {
 public:
  virtual ~Event() = default;
  // Marks the point after all work issued so far.
  virtual void record() = 0;
  // Blocks the host until the work before the recorded point has finished.
  virtual Status wait() = 0;
  // Milliseconds from `start`'s recorded point to this one (both recorded and waited for).
  virtual float elapsed_ms(const Event& start) const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // The physical device across processes (a GPU's UUID), to tell whether two processes share one;
  // empty for the host.
  virtual std::string device_uuid() const { return ""; }
  // Whether ops compute every row of a batch the same way whatever the other rows are (bitwise),
  // at some cost in speed: a CPU backend made with batch_invariant (engines whose outputs must not
  // depend on how requests were batched: reproducible RL rollouts, prefix cache on = off).
  virtual bool batch_invariant() const { return false; }
  // Raw device memory; out_of_memory status when the device has none left.
  virtual Result<void*> allocate(int64_t bytes) = 0;
  virtual void deallocate(void* ptr, int64_t bytes) = 0;
  // Copies src into dst (same dtype and element count); either side may be on the host or on this
  // backend's device. Ordered after earlier work on this backend; host destinations are complete
  // when the call returns.
  virtual void copy(Tensor dst, Tensor src) = 0;
  // Like copy(), but the call returns at once: a host destination holds the data only after an
  // Event recorded later on this backend has been waited for, and a host source must stay unchanged
  // until then. Asynchronous (overlapping the host's work) when the host side is pinned memory.
  virtual void copy_async(Tensor dst, Tensor src) { copy(dst, src); }
  // Page-locked host memory for copy_async (plain host memory where the device has no such thing).
  virtual Result<void*> allocate_pinned(int64_t bytes);
  virtual void deallocate_pinned(void* ptr, int64_t bytes);
  // allocate() calls so far (successful or not): tests prove a loop allocates nothing with it.
  virtual int64_t allocation_count() const = 0;
  // Bytes the backend's allocator hands out now and at most since creation (0, 0 where it keeps
  // no count).
  virtual std::pair<int64_t, int64_t> allocator_bytes() const { return {0, 0}; }
  // Free (counting the backend's cached idle blocks) and total device memory in bytes; unsupported
  // where the device has no fixed memory (CPU).
  virtual Result<std::pair<int64_t, int64_t>> memory_info() { return unsupported("no device memory figure on " + device().str()); }
  // Sets every byte of t to zero.
  virtual void zero(Tensor t) = 0;
  // Waits for all issued work to finish; a device-side fault surfaces here as an error.
  virtual Status synchronize() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // Records the device work `issue` launches on this backend, without running it. Only backends
  // with graph support (CUDA) implement it; `issue` must not allocate, copy to the host or
  // synchronise.
  virtual Result<std::unique_ptr<CapturedWork>> capture(const std::function<void()>& issue) {
    (void)issue;
    return unsupported("graph capture is not supported on " + device().str());
  }
};

// Owns `bytes` of memory from a Backend (device memory, or pinned host memory when `pinned`); move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, int64_t bytes, bool pinned = false)
      : owner_(owner), data_(data), bytes_(bytes), pinned_(pinned) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      owner_ = std::exchange(o.owner_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      pinned_ = std::exchange(o.pinned_, false);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset() {
    if (owner_ && data_) {
      if (pinned_)
        owner_->deallocate_pinned(data_, bytes_);
      else
        owner_->deallocate(data_, bytes_);
    }
    owner_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  bool pinned_ = false;
};

// A tensor together with the memory it views.
class TensorBuffer {
 public:
  TensorBuffer() = default;
  TensorBuffer(Buffer buffer, Tensor view) : buffer_(std::move(buffer)), view_(view) {}
  const Tensor& view() const { return view_; }
  // False for a default-constructed (absent) tensor, e.g. a bias the model does not have.
  bool allocated() const { return buffer_.data() != nullptr; }
  operator Tensor() const { return view_; }  // NOLINT: a buffer is usable wherever a view is
  int64_t numel() const { return view_.numel(); }
  const Shape& shape() const { return view_.shape; }
  template <typename T>
  T* ptr() const { return view_.ptr<T>(); }

 private:
  Buffer buffer_;
  Tensor view_;
};

// Uninitialised tensor on the backend's device.
Result<TensorBuffer> empty(Backend& backend, Shape shape, DType dtype);
// Uninitialised tensor in host memory (64-byte aligned); throws OutOfMemory when there is none.
TensorBuffer host_empty(Shape shape, DType dtype);
// An op's temporary tensor on the backend's device; throws OutOfMemory (core/status.h) with the
// allocator's message when the device is full, since ops have no Status to return.
TensorBuffer empty_for_op(Backend& backend, Shape shape, DType dtype);
// Uninitialised tensor in `backend`'s pinned host memory (for copy_async); its device is the host.
Result<TensorBuffer> pinned_host_empty(Backend& backend, Shape shape, DType dtype);
// Copies of `src` on the host or on `backend`'s device.
TensorBuffer to_host(Backend& backend, Tensor src);
Result<TensorBuffer> to_device(Backend& backend, Tensor src);

// The memory this process may use on the host: physical memory, or its cgroup's limit when lower
// (0: unknown). The CPU backend refuses allocations beyond it; callers check sizes against it before
// building large std::vectors, which overcommitted memory would otherwise grant and the kernel kill.
int64_t host_memory_limit();

// The CPU backend (process-wide allocations through aligned new/delete); see batch_invariant().
std::unique_ptr<Backend> make_cpu_backend(bool batch_invariant = false);
// Number of usable CUDA devices; 0 when built without CUDA or no GPU/driver is present.
int cuda_device_count();
// A backend for `device`; a clear error when that device does not exist.
Result<std::unique_ptr<Backend>> make_backend(Device device);
// Parses "cpu", "cuda", "cuda:N".
Result<Device> parse_device(const std::string& s);

}  // namespace kiln
