// The CPU twin of stage_step_inputs (kernels/step_io.h): host memory on both sides, so a copy of the
// counted words with the continued requests' ids resolved.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/cpu_ops.h"

namespace kiln::cpu {

void stage_step_inputs(Tensor dst, Tensor host, int64_t ids_begin, int64_t ids_count, Tensor prev_tokens) {
  detail::check_i32(dst);
  detail::check_i32(host);
  detail::check_i32(prev_tokens);
  KILN_ASSERT(host.numel() > 0 && dst.numel() >= host.numel());
  KILN_ASSERT(ids_begin >= 0 && ids_count >= 0 && ids_begin + ids_count <= host.numel());
  const int32_t* src = host.ptr<const int32_t>();
  int32_t* out = dst.ptr<int32_t>();
  const int64_t n = std::clamp<int64_t>(src[0], 0, host.numel());
  std::memcpy(out, src, static_cast<size_t>(n) * 4);
  const int32_t* prev = prev_tokens.ptr<const int32_t>();
  for (int64_t w = ids_begin; w < std::min(n, ids_begin + ids_count); ++w) {
    if (out[w] >= 0) continue;
    const int64_t r = -1 - static_cast<int64_t>(out[w]);
    out[w] = r < prev_tokens.numel() ? prev[r] : 0;
  }
}

}  // namespace kiln::cpu
