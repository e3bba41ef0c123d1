// core (dtype conversions, shapes, views, Result) and the CPU backend (buffers, copies, events).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/backend.h"
#include "test_util.h"

namespace kiln::test {

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway too, and rounds up to the even 1 + 2^-6.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(INFINITY)), INFINITY);
}

TEST(DType, F16ConversionsCoverNormalsSubnormalsAndSpecials) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);                    // overflow -> inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);   // underflow -> 0
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  for (uint32_t h = 0; h < 0x7c00; ++h)  // every finite positive f16 survives a round trip
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h);
}

TEST(Tensor, ViewsAndRows) {
  TensorBuffer t = host_empty({4, 3}, DType::f32);
  for (int i = 0; i < 12; ++i) t.ptr<float>()[i] = static_cast<float>(i);
  Tensor r = t.view().rows(1, 3);
  EXPECT_EQ(r.shape, (Shape{2, 3}));
  EXPECT_EQ(r.ptr<float>()[0], 3.0f);
  EXPECT_EQ(t.view().view({2, 6}).shape, (Shape{2, 6}));
  EXPECT_EQ(t.view().nbytes(), 48);
  EXPECT_FALSE(TensorBuffer().allocated());
  EXPECT_TRUE(t.allocated());
}

TEST(Result, CarriesValueOrStatus) {
  Result<int> ok = 5;
  Result<int> bad = invalid_argument("nope");
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 5);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::invalid_argument);
  EXPECT_EQ(bad.status().message(), "nope");
}

TEST(CpuBackend, CopyZeroAndEvents) {
  auto be = make_cpu_backend();
  TensorBuffer src = random_host({5, 7}, DType::f32, 3);
  Result<TensorBuffer> dst = to_device(*be, src);
  ASSERT_TRUE(dst.ok());
  EXPECT_EQ(0, std::memcmp(src.ptr<float>(), dst->ptr<float>(), 35 * sizeof(float)));
  be->zero(*dst);
  for (int i = 0; i < 35; ++i) EXPECT_EQ(dst->ptr<float>()[i], 0.0f);
  auto a = be->create_event(), b = be->create_event();
  a->record();
  b->record();
  EXPECT_TRUE(b->wait().ok());
  EXPECT_GE(b->elapsed_ms(*a), 0.0f);
}

TEST(CpuBackend, OpMemoryRunningOutThrowsTheStatusMessage) {
  auto be = make_cpu_backend();
  try {
    empty_for_op(*be, {int64_t(1) << 50}, DType::f32);  // 4 PiB
    ADD_FAILURE() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("4503599627370496 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(host_empty({int64_t(1) << 50}, DType::f32), OutOfMemory);
}

TEST(Devices, ParseDevice) {
  EXPECT_TRUE(parse_device("cpu").ok());
  EXPECT_EQ(parse_device("cuda:1")->index, 1);
  EXPECT_FALSE(parse_device("tpu").ok());
  EXPECT_FALSE(parse_device("cuda:x").ok());
}

}  // namespace kiln::test
