// Helpers shared by the CPU kernel tests (test_cpu_kernels.cpp, test_cpu_attention.cpp): host
// tensors from values, element-wise closeness against double references, and the fixture that
// runs ops on a CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "test_util.h"

namespace kiln {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Host tensor of `dtype` holding `values` (rounded to the dtype).
inline TensorBuffer make(Shape shape, DType dtype, const std::vector<float>& values) {
  TensorBuffer t = host_empty(shape, dtype);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (dtype) {
      case DType::f32: t.ptr<float>()[i] = values[i]; break;
      case DType::bf16: t.ptr<uint16_t>()[i] = f32_to_bf16(values[i]); break;
      case DType::f16: t.ptr<uint16_t>()[i] = f32_to_f16(values[i]); break;
      default: ADD_FAILURE() << "not a float dtype";
    }
  }
  return t;
}

inline TensorBuffer filled(Shape shape, DType dtype, float value) {
  return make(shape, dtype, std::vector<float>(static_cast<size_t>(shape.numel()), value));
}

// |got - ref| <= atol + rtol * |ref| everywhere; reports the first few violations.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& ref, double rtol, double atol,
                  const char* what = "") {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(err <= atol + rtol * std::fabs(ref[i]))) {
      if (++failures <= 5)
        ADD_FAILURE() << what << " index " << i << ": got " << got[i] << ", reference " << ref[i] << " (err " << err
                      << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

class CpuKernels : public ::testing::Test {
 protected:
  std::vector<float> read(Tensor t) { return test::to_f32(*be, t); }
  std::unique_ptr<Backend> be = make_cpu_backend();
};

}  // namespace kiln
