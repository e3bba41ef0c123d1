// The decode-step kernel's division of work (kernels/cuda/decode_step_kernel.cu): a layer's steps,
// the weight rows of each unit of its weight ops, how many units an op has, which units a block
// takes, and the page width. Plain index arithmetic shared by the kernel and its CPU test (host and
// device); no state.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KILN_LAYOUT_HD __host__ __device__ __forceinline__
#else
#define KILN_LAYOUT_HD inline
#endif

namespace kiln::decode_layout {

// A layer's steps in order (the attention and the merge have no weights); the head after the last
// layer is a weight op of its own kind.
enum Step : int { kQkv, kAttn, kMerge, kO, kGateUp, kDown, kSteps };
constexpr int kHead = kSteps;

struct ModelDims {
  int H, Hq, Hkv, D, I, V;  // hidden size, query and KV heads, head_dim, intermediate size, vocabulary
};

// The reduction length of a weight op.
KILN_LAYOUT_HD int op_k(const ModelDims& m, int kind) {
  return kind == kO ? m.Hq * m.D : kind == kDown ? m.I : m.H;
}

// Units of a weight op for pages of R rows (R even): q/k/v, R / 2 rotation pairs (i, i + D/2) of a
// head; gate/up, R / 2 outputs' gate rows, then their up rows; else R rows. The last may be partial.
KILN_LAYOUT_HD int op_units(const ModelDims& m, int kind, int R) {
  const int P = R / 2;
  switch (kind) {
    case kQkv: return ((m.Hq + 2 * m.Hkv) * (m.D / 2) + P - 1) / P;
    case kGateUp: return (m.I + P - 1) / P;
    case kHead: return (m.V + R - 1) / R;
    default: return (m.H + R - 1) / R;  // o, down
  }
}

// The weight row (of the op's [rows, K] matrix) of page row r of unit u; -1 where the last unit has
// no such row. q/k/v rows are [q heads | k heads | v heads] x D; gate/up rows [gate I | up I].
KILN_LAYOUT_HD int unit_row(const ModelDims& m, int kind, int R, int u, int r) {
  const int P = R / 2;
  switch (kind) {
    case kQkv: {
      const int p = P * u + r / 2, half = m.D / 2;
      return p < (m.Hq + 2 * m.Hkv) * half ? (p / half) * m.D + p % half + (r & 1) * half : -1;
    }
    case kGateUp: {
      const int o = P * u + r % P;
      return o < m.I ? (r < P ? o : m.I + o) : -1;
    }
    default: {
      const int row = R * u + r;
      return row < (kind == kHead ? m.V : m.H) ? row : -1;
    }
  }
}

// The first of block b's units, of `units` dealt to `grid` blocks in contiguous, even ranges.
KILN_LAYOUT_HD int unit_begin(int units, int b, int grid) {
  return static_cast<int>(static_cast<int64_t>(units) * b / grid);
}

// The page width that divides every reduction length (H, Hq * D, I): 768 (pages of 4 rows), else 512
// (6 rows); 0 where neither does.
KILN_LAYOUT_HD int page_cols(int64_t H, int64_t HqD, int64_t I) {
  if (H % 768 == 0 && HqD % 768 == 0 && I % 768 == 0) return 768;
  if (H % 512 == 0 && HqD % 512 == 0 && I % 512 == 0) return 512;
  return 0;
}

}  // namespace kiln::decode_layout
