// Internal helpers of the CPU kernels (not part of the op interface): reading float tensors of any
// storage dtype (f32, bf16, f16) as f32 and writing f32 values back through the dtype conversions
// of core/dtype.h, the argument checks shared by the op families, and the work split over threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/tensor.h"

namespace kiln::cpu::detail {

// Host float tensor (f32/bf16/f16).
inline void check_float(const Tensor& t) {
  KILN_ASSERT(t.device.is_cpu());
  KILN_ASSERT(dtype_is_float(t.dtype));
  KILN_ASSERT(t.data != nullptr || t.numel() == 0);
}

// Host i32 tensor.
inline void check_i32(const Tensor& t) {
  KILN_ASSERT(t.device.is_cpu());
  KILN_ASSERT(t.dtype == DType::i32);
  KILN_ASSERT(t.data != nullptr || t.numel() == 0);
}

// dst[0..n) = t[offset .. offset+n) as f32.
inline void load_f32(const Tensor& t, int64_t offset, int64_t n, float* dst) {
  switch (t.dtype) {
    case DType::f32: {
      const float* p = t.ptr<const float>() + offset;
      if (n) std::memcpy(dst, p, static_cast<size_t>(n) * sizeof(float));
      return;
    }
    case DType::bf16: {
      const uint16_t* p = t.ptr<const uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::f16: {
      const uint16_t* p = t.ptr<const uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(p[i]);
      return;
    }
    default: KILN_ASSERT(false && "not a float dtype");
  }
}

// t[offset .. offset+n) = src[0..n) converted (rounded to nearest even) to t's dtype.
inline void store_f32(const Tensor& t, int64_t offset, int64_t n, const float* src) {
  switch (t.dtype) {
    case DType::f32: {
      float* p = t.ptr<float>() + offset;
      if (n) std::memmove(p, src, static_cast<size_t>(n) * sizeof(float));
      return;
    }
    case DType::bf16: {
      uint16_t* p = t.ptr<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::f16: {
      uint16_t* p = t.ptr<uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_f16(src[i]);
      return;
    }
    default: KILN_ASSERT(false && "not a float dtype");
  }
}

// One element as f32.
inline float load1(const Tensor& t, int64_t i) {
  float v;
  load_f32(t, i, 1, &v);
  return v;
}

// The whole tensor as an f32 vector.
inline std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  load_f32(t, 0, t.numel(), v.data());
  return v;
}

// f32 value rounded to `dtype`'s precision (identity for f32).
inline float round_to(DType dtype, float v) {
  switch (dtype) {
    case DType::bf16: return bf16_to_f32(f32_to_bf16(v));
    case DType::f16: return f16_to_f32(f32_to_f16(v));
    default: return v;
  }
}

// Size of the last dimension (1 for a 0-d tensor).
inline int64_t last_dim(const Tensor& t) { return t.ndim() == 0 ? 1 : t.size(-1); }

// Runs run_item(0 .. items) on up to 16 std::threads when the work (flops) pays for them (below a
// few MFLOP, e.g. the decode steps of small tests, inline); items are taken in turn from a counter.
template <typename F>
void parallel_items(int64_t items, double flops, const F& run_item) {
  const int64_t hw = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  const int64_t n_threads = flops < 4e6 ? 1 : std::min<int64_t>({hw, 16, items});
  if (n_threads <= 1) {
    for (int64_t item = 0; item < items; ++item) run_item(item);
    return;
  }
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t item = next.fetch_add(1); item < items; item = next.fetch_add(1)) run_item(item);
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(n_threads - 1));
  for (int64_t i = 0; i + 1 < n_threads; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

}  // namespace kiln::cpu::detail
