// The CUDA backend: host/device copies, the caching allocator's reuse and out-of-memory status,
// events, and graph capture/replay.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cuda_backend.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace kiln::test {

TEST(CudaBackend, CopiesRoundTrip) {
  KILN_REQUIRE_GPU(be);
  TensorBuffer src = random_host({1001, 3}, DType::bf16, 9);
  Result<TensorBuffer> dev = to_device(*be, src);
  ASSERT_TRUE(dev.ok());
  Result<TensorBuffer> dev2 = empty(*be, src.shape(), DType::bf16);
  ASSERT_TRUE(dev2.ok());
  be->copy(*dev2, *dev);  // device to device
  TensorBuffer back = to_host(*be, *dev2);
  EXPECT_EQ(0, std::memcmp(src.ptr<uint16_t>(), back.ptr<uint16_t>(), 3003 * 2));
}

TEST(CudaBackend, CachingAllocatorReusesFreedBlocks) {
  KILN_REQUIRE_GPU(be);
  auto& cuda = static_cast<CudaBackend&>(*be);
  void* first = nullptr;
  {
    Result<TensorBuffer> t = empty(*be, {1 << 20}, DType::f32);
    ASSERT_TRUE(t.ok());
    first = t->view().data;
  }
  EXPECT_GE(cuda.allocator().bytes_cached(), int64_t(4) << 20);
  Result<TensorBuffer> again = empty(*be, {1 << 20}, DType::f32);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->view().data, first);
}

TEST(CudaBackend, OutOfMemoryIsAStatus) {
  KILN_REQUIRE_GPU(be);
  Result<TensorBuffer> huge = empty(*be, {int64_t(1) << 50}, DType::f32);  // 4 PiB
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::out_of_memory);
  Result<TensorBuffer> small = empty(*be, {16}, DType::f32);  // the device still works
  EXPECT_TRUE(small.ok());
}

TEST(CudaBackend, OpMemoryRunningOutThrowsTheStatusMessage) {
  KILN_REQUIRE_GPU(be);
  auto& cuda = static_cast<CudaBackend&>(*be);
  try {
    cuda.scratch(int64_t(1) << 52);  // 4 PiB of op scratch
    ADD_FAILURE() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  EXPECT_NE(cuda.scratch(1024), nullptr);  // the device still works
  EXPECT_THROW(empty_for_op(*be, {int64_t(1) << 50}, DType::f32), OutOfMemory);
}

TEST(CudaBackend, EventsTimeDeviceWork) {
  KILN_REQUIRE_GPU(be);
  Result<TensorBuffer> t = empty(*be, {int64_t(64) << 20}, DType::f32);
  ASSERT_TRUE(t.ok());
  auto a = be->create_event(), b = be->create_event();
  a->record();
  for (int i = 0; i < 5; ++i) ops::fill_constant(*be, *t, 1.0f);
  b->record();
  ASSERT_TRUE(b->wait().ok());
  EXPECT_GT(b->elapsed_ms(*a), 0.0f);
}

TEST(CudaBackend, CapturedWorkReplaysWithNewInputs) {
  KILN_REQUIRE_GPU(be);
  Result<TensorBuffer> x = empty(*be, {257}, DType::f32);
  Result<TensorBuffer> y = empty(*be, {257}, DType::f32);
  ASSERT_TRUE(x.ok() && y.ok());
  be->zero(*y);
  Result<std::unique_ptr<CapturedWork>> g = be->capture([&] { ops::add_inplace(*be, *y, *x); });
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (float v : {1.0f, 2.5f}) {
    ops::fill_constant(*be, *x, v);
    (*g)->replay();
  }
  std::vector<float> out = to_f32(*be, *y);
  for (float o : out) EXPECT_EQ(o, 3.5f);
}

}  // namespace kiln::test
