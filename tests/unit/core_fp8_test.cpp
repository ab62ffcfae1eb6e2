// FP8 E4M3 encoder/decoder: every one of the 256 codes, the rounding boundaries between
// neighbouring values (ties to even), saturation, subnormals and NaN; per-row quantization.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"

namespace origami {
namespace {

// The E4M3 value of a code from its definition, independent of the decoder under test.
double reference_value(int code) {
  const int sign = code >> 7, exp = (code >> 3) & 15, mant = code & 7;
  if (exp == 15 && mant == 7) return std::nan("");
  const double mag = exp == 0 ? mant / 8.0 * std::pow(2.0, -6) : (1.0 + mant / 8.0) * std::pow(2.0, exp - 7);
  return sign ? -mag : mag;
}

TEST(Fp8E4M3, DecodesEveryCode) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const double ref = reference_value(c);
    const float got = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), ref) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
  }
  EXPECT_EQ(nans, 2);  // 0x7f and 0xff only
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
}

TEST(Fp8E4M3, EncodeInvertsDecodeForEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if (c == 0x7f || c == 0xff) continue;
    EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
}

// Between two neighbouring positive values: below the midpoint rounds down, above rounds up, the
// midpoint itself to the code with an even mantissa; and the same mirrored for negatives.
TEST(Fp8E4M3, RoundsToNearestEvenAtEveryBoundary) {
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = fp8_e4m3_to_f32(static_cast<uint8_t>(c)), hi = fp8_e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = 0.5f * (lo + hi);  // exact: both have few mantissa bits
    const float below = std::nextafter(mid, lo), above = std::nextafter(mid, hi);
    EXPECT_EQ(f32_to_fp8_e4m3(below), c) << "below midpoint of " << c;
    EXPECT_EQ(f32_to_fp8_e4m3(above), c + 1) << "above midpoint of " << c;
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(f32_to_fp8_e4m3(mid), even) << "midpoint of " << c;
    EXPECT_EQ(f32_to_fp8_e4m3(-below), 0x80 | c);
    EXPECT_EQ(f32_to_fp8_e4m3(-mid), 0x80 | even);
    EXPECT_EQ(f32_to_fp8_e4m3(-above), 0x80 | (c + 1));
  }
}

TEST(Fp8E4M3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(f32_to_fp8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(460.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(std::nanf("")) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest subnormal
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half of it: ties to even (0)
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

// Brute force: the nearest code by value over all finite codes, ties to the even code.
uint8_t nearest_code(float x) {
  if (std::fabs(x) >= 448.0f) return x < 0 ? 0xfe : 0x7e;
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    if (c == 0x7f || c == 0xff) continue;
    if ((c & 0x80) != (std::signbit(x) ? 0x80 : 0)) continue;
    const double err = std::fabs(reference_value(c) - x);
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(Fp8E4M3, MatchesBruteForceOnAWideSweep) {
  // Every float on a log grid from 2^-12 to 512, plus jitter: 20 000 values either sign.
  for (int i = 0; i < 10000; ++i) {
    const float x = std::ldexp(1.0f + (i % 97) / 97.0f, -12 + i * 21 / 10000);
    ASSERT_EQ(f32_to_fp8_e4m3(x), nearest_code(x)) << x;
    ASSERT_EQ(f32_to_fp8_e4m3(-x), nearest_code(-x)) << -x;
  }
}

TEST(Fp8E4M3, DTypeNamesAndConversion) {
  DType d;
  ASSERT_TRUE(parse_dtype("F8_E4M3", &d));
  EXPECT_EQ(d, DType::kF8E4M3);
  EXPECT_EQ(dtype_size(d), 1u);
  EXPECT_STREQ(dtype_name(d), "F8_E4M3");
  const uint8_t codes[3] = {0x38, 0xb8, 0x7e};  // 1, -1, 448
  float out[3];
  convert_to_f32(codes, DType::kF8E4M3, 3, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -1.0f);
  EXPECT_EQ(out[2], 448.0f);
}

TEST(Fp8Rows, ScaleMapsTheRowMaximumToTheLargestCode) {
  const std::vector<float> x = {0.5f, -3.0f, 1.25f, 0.0f, /* row 2: */ 0.0f, 0.0f, 0.0f, 0.0f};
  std::vector<uint8_t> codes(8);
  std::vector<float> scales(2);
  quantize_rows_fp8(x.data(), 2, 4, 4, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 3.0f / 448.0f);
  EXPECT_EQ(codes[1], 0xfe);  // -448
  EXPECT_GT(scales[1], 0.0f);  // an all-zero row: a positive scale and zero codes
  for (int i = 4; i < 8; ++i) EXPECT_EQ(codes[i], 0);
  std::vector<float> y = x;
  fake_quantize_rows_fp8(y.data(), 2, 4, 4);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], fp8_e4m3_to_f32(codes[i]) * scales[i / 4]) << i;
  // A static scale: values past 448 * scale saturate.
  std::vector<float> z = {1.0f, 100.0f};
  fake_quantize_rows_fp8(z.data(), 1, 2, 2, 0.1f);
  EXPECT_FLOAT_EQ(z[0], 1.0f);
  EXPECT_FLOAT_EQ(z[1], 44.8f);
}

}  // namespace
}  // namespace origami
