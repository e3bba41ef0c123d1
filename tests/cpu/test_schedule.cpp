// Learning-rate schedules (train/schedule.h) against transformers: testdata/schedules.json holds the
// lr torch's optimizer sees at every step under transformers' schedule functions
// (tests/reference/make_schedule_tables.py, transformers 5.17 / torch 2.11).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "test_util.h"
#include "train/schedule.h"

namespace kiln {
namespace {

TEST(LrSchedule, MatchesTransformersValueForValue) {
  std::ifstream in(test::testdata_dir() + "/schedules.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_GE(j["cases"].size(), 10u);
  for (const auto& c : j["cases"]) {
    LrSchedule s;
    auto kind = LrSchedule::parse_kind(c["kind"].get<std::string>());
    ASSERT_TRUE(kind.ok());
    s.kind = *kind;
    s.warmup_steps = c["warmup_steps"];
    s.total_steps = c["total_steps"];
    s.decay_steps = c.value("decay_steps", 0);
    s.min_lr_ratio = c.value("min_lr_ratio", 0.0);
    ASSERT_TRUE(s.validate().ok()) << s.validate().message();
    const double base = c["base_lr"];
    const auto& lrs = c["lr"];
    for (size_t step = 0; step < lrs.size(); ++step) {
      const double want = lrs[step];
      EXPECT_NEAR(base * s.multiplier(static_cast<int64_t>(step)), want, 1e-15 * std::max(1e-3, std::abs(want)))
          << c.dump() << " at step " << step;
    }
  }
}

TEST(LrSchedule, BadSettingsNameTheFlag) {
  auto error = [](LrSchedule s) { return s.validate().message(); };
  EXPECT_NE(LrSchedule::parse_kind("exp").status().message().find("--lr-schedule"), std::string::npos);
  EXPECT_NE(error({LrSchedule::Kind::cosine, -1, 10, 0, 0.0}).find("--warmup-steps"), std::string::npos);
  EXPECT_NE(error({LrSchedule::Kind::cosine, 0, 10, 0, 1.5}).find("--min-lr-ratio"), std::string::npos);
  EXPECT_NE(error({LrSchedule::Kind::cosine, 0, 10, 0, std::nan("")}).find("--min-lr-ratio"), std::string::npos);
  EXPECT_NE(error({LrSchedule::Kind::wsd, 0, 10, 0, 0.0}).find("--decay-steps"), std::string::npos);
  EXPECT_NE(error({LrSchedule::Kind::wsd, 6, 10, 5, 0.0}).find("exceed"), std::string::npos);
  EXPECT_NE(error({LrSchedule::Kind::linear, 0, 10, 3, 0.0}).find("--decay-steps"), std::string::npos);
  EXPECT_NE(error({LrSchedule::Kind::linear, 0, 10, 0, 0.1}).find("--min-lr-ratio"), std::string::npos);
}

}  // namespace
}  // namespace kiln
