// KV-cache write: k_cache[slots[t]] = k[t] and v_cache[slots[t]] = v[t], one row of Hkv * D
// elements per token, converted when the cache dtype differs from the new keys/values.
// k, v: [T, Hkv, D]; k_cache, v_cache: [S, Hkv, D]; slots: [T] i32 with slot < S; a negative slot (a padding row) writes nothing.
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {
namespace {

void write_rows(Tensor cache, Tensor src, const int32_t* slots, int64_t T, int64_t S, int64_t row) {
  std::vector<float> buf(static_cast<size_t>(row));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = slots[t];
    KILN_ASSERT(slot < S);
    if (slot < 0) continue;  // padding row (ops.h)
    if (cache.dtype == src.dtype) {
      const int64_t bytes = row * dtype_size(src.dtype);
      std::memcpy(static_cast<char*>(cache.data) + slot * bytes, static_cast<const char*>(src.data) + t * bytes,
                  static_cast<size_t>(bytes));
    } else {
      detail::load_f32(src, t * row, row, buf.data());
      detail::store_f32(cache, slot * row, row, buf.data());
    }
  }
}

}  // namespace

void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor k, Tensor v, Tensor slots) {
  detail::check_float(k_cache);
  detail::check_float(v_cache);
  detail::check_float(k);
  detail::check_float(v);
  detail::check_i32(slots);
  KILN_ASSERT(k.ndim() == 3 && v.shape == k.shape);
  KILN_ASSERT(k_cache.ndim() == 3 && v_cache.shape == k_cache.shape);
  const int64_t T = k.size(0), S = k_cache.size(0);
  KILN_ASSERT(k_cache.size(1) == k.size(1) && k_cache.size(2) == k.size(2));
  KILN_ASSERT(slots.ndim() == 1 && slots.size(0) == T);
  const int64_t row = k.size(1) * k.size(2);
  write_rows(k_cache, k, slots.ptr<const int32_t>(), T, S, row);
  write_rows(v_cache, v, slots.ptr<const int32_t>(), T, S, row);
}

}  // namespace kiln::cpu
