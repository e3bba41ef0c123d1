// Segment-id summaries of the dense training attention (attention_train.cu computes them; the
// backward in attention_train_bwd.cu and the warp-specialised forward in attention_ws.cu read them): per
// (b, granule of kSegGranule tokens) an int4 {min id, max id, has padding, 0} over the granule's
// non-padding tokens (min = INT_MAX, max = -1 when there are none). A tile pair whose id ranges do
// not intersect cannot see each other (skipped); one where both sides carry a single id and no
// padding needs no segment mask. Header-only device code; no state.
#pragma once

#include <climits>

namespace kiln::cuda {

constexpr int kSegGranule = 32;  // tokens per summary; every tile size is a multiple

// Summary of tokens [begin, end) (begin a multiple of the granule, end > begin) of one row.
__device__ __forceinline__ int4 seg_union(const int4* __restrict__ row_ranges, int begin, int end) {
  int4 r = make_int4(INT_MAX, -1, 0, 0);
  for (int gi = begin / kSegGranule; gi * kSegGranule < end; ++gi) {
    const int4 x = row_ranges[gi];
    r.x = min(r.x, x.x);
    r.y = max(r.y, x.y);
    r.z |= x.z;
  }
  return r;
}
// Can some token of a see some token of b (a common non-padding id is possible)?
__device__ __forceinline__ bool seg_meet(int4 a, int4 b) { return a.x <= b.y && b.x <= a.y; }
// Do all tokens of a and b carry one and the same id (no segment mask needed)?
__device__ __forceinline__ bool seg_same(int4 a, int4 b) {
  return !a.z && !b.z && a.x == a.y && b.x == b.y && a.x == b.x;
}

}  // namespace kiln::cuda
