// The decode-step kernel's division of work (kernels/decode_step_layout.h) on the shapes it takes
// (astrai-1b, llama-1b and the GPU test's models): the page width divides every reduction; every
// weight row of every op sits in exactly one unit's page row and only an op's last unit is partial;
// q/k/v units hold whole rotation pairs (i, i + D/2) of one head and gate/up units an output's gate
// and up rows side by side; blocks take contiguous ranges of units that differ by at most one.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/decode_step_layout.h"

namespace kiln::decode_layout {
namespace {

struct Shape {
  const char* name;
  ModelDims m;
  int page_cols;  // expected
};

const Shape kShapes[] = {
    {"astrai-1b", {1536, 24, 4, 64, 6912, 100000}, 768},
    {"llama-1b", {2048, 32, 8, 64, 8192, 128256}, 512},
    {"d64 g3", {768, 12, 4, 64, 1536, 1001}, 768},
    {"d128 g6", {1536, 12, 2, 128, 2304, 5000}, 768},
    {"d64 g8", {1536, 24, 3, 64, 3072, 777}, 768},
    {"d64 g4 512-wide", {1024, 16, 4, 64, 2560, 1001}, 512},
    {"d128 g2 512-wide", {2048, 16, 8, 128, 5632, 3001}, 512},
};
const int kWeightKinds[] = {kQkv, kO, kGateUp, kDown, kHead};

int rows_of(const ModelDims& m, int kind) {
  switch (kind) {
    case kQkv: return (m.Hq + 2 * m.Hkv) * m.D;
    case kGateUp: return 2 * m.I;
    case kHead: return m.V;
    default: return m.H;
  }
}
int page_rows(const Shape& s) { return 3072 / page_cols(s.m.H, s.m.Hq * s.m.D, s.m.I); }

TEST(DecodeStepLayout, PageWidthDividesEveryReduction) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.name);
    const int pc = page_cols(s.m.H, s.m.Hq * s.m.D, s.m.I);
    EXPECT_EQ(pc, s.page_cols);
    for (int kind : kWeightKinds) EXPECT_EQ(op_k(s.m, kind) % pc, 0) << "kind " << kind;
    EXPECT_EQ(op_k(s.m, kO), s.m.Hq * s.m.D);
    EXPECT_EQ(op_k(s.m, kDown), s.m.I);
    EXPECT_EQ(op_k(s.m, kQkv), s.m.H);
  }
  EXPECT_EQ(page_cols(1000, 768, 1536), 0);
  EXPECT_EQ(page_cols(896, 896, 4864), 0);  // Qwen2.5-0.5B's widths: not taken
}

TEST(DecodeStepLayout, EveryWeightRowInExactlyOnePageRow) {
  for (const Shape& s : kShapes)
    for (int kind : kWeightKinds) {
      SCOPED_TRACE(testing::Message() << s.name << ", kind " << kind);
      const int R = page_rows(s), units = op_units(s.m, kind, R), rows = rows_of(s.m, kind);
      std::vector<int> seen(rows, 0);
      for (int u = 0; u < units; ++u)
        for (int r = 0; r < R; ++r) {
          const int row = unit_row(s.m, kind, R, u, r);
          if (row < 0) {
            EXPECT_EQ(u, units - 1) << "only the last unit may be partial";
            continue;
          }
          ASSERT_LT(row, rows);
          ++seen[row];
        }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
}

TEST(DecodeStepLayout, QkvUnitsHoldRotationPairsOfOneHead) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.name);
    const int R = page_rows(s), D = s.m.D;
    for (int u = 0; u < op_units(s.m, kQkv, R); ++u)
      for (int r = 0; r < R; r += 2) {
        const int a = unit_row(s.m, kQkv, R, u, r), b = unit_row(s.m, kQkv, R, u, r + 1);
        ASSERT_EQ(a < 0, b < 0);
        if (a < 0) continue;
        EXPECT_EQ(b, a + D / 2);
        EXPECT_EQ(a / D, b / D) << "one head";
        EXPECT_LT(a % D, D / 2);
      }
  }
}

TEST(DecodeStepLayout, GateUpUnitsHoldEachOutputsGateAndUpRows) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.name);
    const int R = page_rows(s), P = R / 2;
    for (int u = 0; u < op_units(s.m, kGateUp, R); ++u)
      for (int r = 0; r < P; ++r) {
        const int gate = unit_row(s.m, kGateUp, R, u, r), up = unit_row(s.m, kGateUp, R, u, r + P);
        ASSERT_EQ(gate < 0, up < 0);
        if (gate < 0) continue;
        EXPECT_EQ(gate, P * u + r);
        EXPECT_EQ(up, s.m.I + gate);
      }
  }
}

TEST(DecodeStepLayout, BlocksTakeContiguousRangesWithinOneUnit) {
  for (int units : {1, 7, 24, 132, 384, 512, 3456, 25000})
    for (int grid : {1, 7, 114, 132}) {
      SCOPED_TRACE(testing::Message() << units << " units on " << grid << " blocks");
      EXPECT_EQ(unit_begin(units, 0, grid), 0);
      EXPECT_EQ(unit_begin(units, grid, grid), units);
      int lo = units, hi = 0;
      for (int b = 0; b < grid; ++b) {
        const int n = unit_begin(units, b + 1, grid) - unit_begin(units, b, grid);
        ASSERT_GE(n, 0);
        lo = std::min(lo, n), hi = std::max(hi, n);
      }
      EXPECT_LE(hi - lo, 1);
    }
}

}  // namespace
}  // namespace kiln::decode_layout
