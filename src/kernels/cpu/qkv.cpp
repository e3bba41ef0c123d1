// qkv_rope_cache_write, CPU twin: the unfused sequence itself (copy each head out of the packed
// projection, rmsnorm_forward on q and k when norm weights are given, rope_forward, kv_cache_write),
// so the fused op is by construction the same function as the ops it replaces.
// qkv: [T, (Hq + 2 Hkv) * D]; q_out: [T, Hq, D]; k_cache, v_cache: [S, Hkv, D]; positions, slots: [T].
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {

void qkv_rope_cache_write(Tensor q_out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor positions, Tensor slots,
                          Tensor inv_freq, float attention_scaling, Tensor q_norm, Tensor k_norm, float eps) {
  detail::check_float(qkv);
  detail::check_float(q_out);
  KILN_ASSERT(q_out.ndim() == 3 && k_cache.ndim() == 3 && v_cache.shape == k_cache.shape);
  const int64_t T = q_out.size(0), Hq = q_out.size(1), D = q_out.size(2), Hkv = k_cache.size(1);
  const int64_t width = (Hq + 2 * Hkv) * D;
  KILN_ASSERT(qkv.ndim() == 2 && qkv.size(0) == T && qkv.size(1) == width && k_cache.size(2) == D);

  // Split the packed rows; k and v go through temporaries in the cache dtype, like the unfused path's
  // k/v activations in the compute dtype.
  TensorBuffer k = host_empty({T, Hkv, D}, k_cache.dtype), v = host_empty({T, Hkv, D}, v_cache.dtype);
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < Hq + 2 * Hkv; ++h) {
      detail::load_f32(qkv, t * width + h * D, D, row.data());
      if (h < Hq)
        detail::store_f32(q_out, (t * Hq + h) * D, D, row.data());
      else if (h < Hq + Hkv)
        detail::store_f32(k, (t * Hkv + h - Hq) * D, D, row.data());
      else
        detail::store_f32(v, (t * Hkv + h - Hq - Hkv) * D, D, row.data());
    }
  }
  if (q_norm.data) rmsnorm_forward(q_out, q_out, q_norm, eps);
  if (k_norm.data) rmsnorm_forward(k, k, k_norm, eps);
  rope_forward(q_out, positions, inv_freq, attention_scaling);
  rope_forward(k, positions, inv_freq, attention_scaling);
  kv_cache_write(k_cache, v_cache, k, v, slots);
}

}  // namespace kiln::cpu
