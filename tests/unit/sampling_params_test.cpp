// SamplingParams::validate(): each invalid field is rejected with its name and value in the
// message; boundary values that are valid are accepted.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "sampling/sampling_params.h"

namespace origami {
namespace {

void expect_rejected(const SamplingParams& p, const std::string& field, const std::string& value) {
  const Status st = p.validate();
  ASSERT_FALSE(st.is_ok()) << "expected " << field << " = " << value << " to be rejected";
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(value), std::string::npos) << st.message();
}

TEST(SamplingParamsValidate, DefaultsAreValid) { EXPECT_TRUE(SamplingParams{}.validate().is_ok()); }

TEST(SamplingParamsValidate, RejectsBadTemperature) {
  SamplingParams p;
  p.temperature = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(p, "temperature", "nan");
  p.temperature = std::numeric_limits<float>::infinity();
  expect_rejected(p, "temperature", "inf");
  p.temperature = -0.5f;
  expect_rejected(p, "temperature", "-0.5");
}

TEST(SamplingParamsValidate, RejectsBadTopP) {
  SamplingParams p;
  p.top_p = 0.0f;
  expect_rejected(p, "top_p", "0");
  p.top_p = 1.5f;
  expect_rejected(p, "top_p", "1.5");
  p.top_p = -0.1f;
  expect_rejected(p, "top_p", "-0.1");
  p.top_p = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(p, "top_p", "nan");
}

TEST(SamplingParamsValidate, RejectsBadMinP) {
  SamplingParams p;
  p.min_p = -0.25f;
  expect_rejected(p, "min_p", "-0.25");
  p.min_p = 1.25f;
  expect_rejected(p, "min_p", "1.25");
  p.min_p = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(p, "min_p", "nan");
}

TEST(SamplingParamsValidate, RejectsBadTopK) {
  SamplingParams p;
  p.top_k = -2;
  expect_rejected(p, "top_k", "-2");
}

TEST(SamplingParamsValidate, RejectsBadMaxTokens) {
  SamplingParams p;
  p.max_tokens = 0;
  expect_rejected(p, "max_tokens", "0");
  p.max_tokens = -7;
  expect_rejected(p, "max_tokens", "-7");
}

TEST(SamplingParamsValidate, RejectsEmptyStopString) {
  SamplingParams p;
  p.stop = {"###", ""};
  expect_rejected(p, "stop[1]", "\"\"");
}

TEST(SamplingParamsValidate, RejectsNegativeStopTokenId) {
  SamplingParams p;
  p.stop_token_ids = {5, -3};
  expect_rejected(p, "stop_token_ids[1]", "-3");
}

TEST(SamplingParamsValidate, AcceptsEdgeValues) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.top_k = -1;
  p.max_tokens = 1;
  EXPECT_TRUE(p.validate().is_ok()) << p.validate().message();
  p.top_k = 0;
  p.min_p = 1.0f;
  p.top_p = 1e-6f;
  p.temperature = 100.0f;
  p.stop = {"a"};
  p.stop_token_ids = {0};
  EXPECT_TRUE(p.validate().is_ok()) << p.validate().message();
}

TEST(SamplingParamsValidate, GreedyDetection) {
  SamplingParams p;
  EXPECT_FALSE(p.is_greedy());
  p.temperature = 0.0f;
  EXPECT_TRUE(p.is_greedy());
  p.temperature = 1e-6f;
  EXPECT_TRUE(p.is_greedy());
  p.temperature = 0.7f;
  p.top_k = 1;
  EXPECT_TRUE(p.is_greedy());
}

}  // namespace
}  // namespace origami
