// Embedding lookup: out[t, :] = table[ids[t], :].
// ids: [T] i32 (each in [0, V)), table: [V, H] (f32/bf16/f16), out: [T, H] (any float dtype;
// rows are converted when the dtypes differ, copied bit for bit when they agree).
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {

void embedding_forward(Tensor out, Tensor table, Tensor ids) {
  detail::check_float(out);
  detail::check_float(table);
  detail::check_i32(ids);
  KILN_ASSERT(table.ndim() == 2 && out.ndim() == 2 && ids.ndim() == 1);
  const int64_t V = table.size(0), H = table.size(1), T = ids.size(0);
  KILN_ASSERT(out.size(0) == T && out.size(1) == H);

  const int32_t* id = ids.ptr<const int32_t>();
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t v = id[t];
    KILN_ASSERT(v >= 0 && v < V);
    if (out.dtype == table.dtype) {
      const int64_t bytes = H * dtype_size(table.dtype);
      std::memcpy(static_cast<char*>(out.data) + t * bytes, static_cast<const char*>(table.data) + v * bytes,
                  static_cast<size_t>(bytes));
    } else {
      detail::load_f32(table, v * H, H, row.data());
      detail::store_f32(out, t * H, H, row.data());
    }
  }
}

}  // namespace kiln::cpu
