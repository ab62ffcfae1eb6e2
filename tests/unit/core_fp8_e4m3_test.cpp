// E4M3 against a brute force over all 256 codes: decoding matches the format's definition,
// encoding is the nearest code (ties to the even code) with saturation at ±448, and every code
// round-trips. Also the per-(token, head) KV quantization built on it (kv/kv_cache_dtype.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8_e4m3.h"
#include "kv/kv_cache_dtype.h"

namespace origami {
namespace {

bool is_nan_code(int c) { return (c & 0x7f) == 0x7f; }

// The format's definition: (-1)^s * 2^(e-7) * (1 + m/8), subnormals 2^-6 * m/8.
double reference_value(int c) {
  const int s = c >> 7, e = (c >> 3) & 0xf, m = c & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// The nearest finite code to x by exhaustive search; ties go to the even code (mantissa lsb 0);
// beyond the largest finite value the result saturates.
uint8_t reference_encode(float x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xff : 0x7f;
  if (x >= 448.0f) return 0x7e;
  if (x <= -448.0f) return 0xfe;
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    if (is_nan_code(c)) continue;
    if ((c & 0x80) != (std::signbit(x) ? 0x80 : 0)) continue;  // keep the sign (of zero too)
    const double err = std::fabs(reference_value(c) - static_cast<double>(x));
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(Fp8E4M3, DecodesEveryCodeAsDefined) {
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    if (is_nan_code(c)) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), reference_value(c)) << "code " << c;
    EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << "code " << c;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8E4M3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const uint8_t back = f32_to_fp8_e4m3(fp8_e4m3_to_f32(code));
    if (is_nan_code(c)) EXPECT_TRUE(is_nan_code(back)) << c;
    else EXPECT_EQ(back, code) << "code " << c;
  }
}

TEST(Fp8E4M3, MidpointsAndNeighboursRoundToNearestEven) {
  // Between every pair of adjacent finite values: the midpoint (a tie) and the floats right
  // beside it and beside both ends.
  for (int sign = 0; sign < 2; ++sign)
    for (int c = 0; c < 0x7e; ++c) {
      const int lo = c | (sign << 7), hi = (c + 1) | (sign << 7);
      const float a = fp8_e4m3_to_f32(static_cast<uint8_t>(lo)), b = fp8_e4m3_to_f32(static_cast<uint8_t>(hi));
      const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);  // exact in fp32
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + b) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f * (sign ? -1 : 1)),
                      std::nextafter(a, b), std::nextafter(b, a)}) {
        EXPECT_EQ(f32_to_fp8_e4m3(x), reference_encode(x)) << "x = " << x;
      }
      // The tie goes to the even code.
      const uint8_t tie = f32_to_fp8_e4m3(mid);
      EXPECT_EQ(tie & 1, 0) << "midpoint of codes " << lo << " and " << hi;
    }
}

TEST(Fp8E4M3, RandomFloatsMatchTheBruteForce) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> log_mag(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(log_mag(rng)) * (rng() & 1 ? -1.0f : 1.0f);
    ASSERT_EQ(f32_to_fp8_e4m3(x), reference_encode(x)) << "x = " << x;
  }
}

TEST(Fp8E4M3, SaturatesAndKeepsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_fp8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(463.9f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7e);  // would round to 480, which E4M3 lacks
  EXPECT_EQ(f32_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(inf), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-inf), 0xfe);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(f32_to_fp8_e4m3(std::nanf("")))));
  EXPECT_EQ(f32_to_fp8_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest subnormal
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half of it: a tie, to even (0)
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 x 2^-9: a tie, to even (2)
}

TEST(KVFp8Quantization, EachHeadVectorUsesItsOwnAmaxScale) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int d = 64;
    const float magnitude = std::exp2(static_cast<float>(trial % 40 - 20));
    std::vector<float> v(d);
    for (float& x : v) x = normal(rng) * magnitude;
    std::vector<float> r = v;
    round_head_vector_fp8(r.data(), d);
    float amax = 0;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    const float scale = amax / 448.0f;
    for (int i = 0; i < d; ++i) {
      // The brute force: the nearest E4M3 value of x / scale, times scale.
      const float want = fp8_e4m3_to_f32(reference_encode(v[i] / scale)) * scale;
      ASSERT_EQ(r[i], want) << "trial " << trial << " element " << i;
      // 3 mantissa bits: within 1/16 relative, or the subnormal step below 2^-6 (times scale).
      EXPECT_LE(std::fabs(r[i] - v[i]), std::max(std::fabs(v[i]) / 16.0f, std::ldexp(scale, -10)) * 1.0001f);
    }
  }
  std::vector<float> zeros(8, 0.0f);
  round_head_vector_fp8(zeros.data(), 8);
  EXPECT_EQ(zeros, std::vector<float>(8, 0.0f));
}

}  // namespace
}  // namespace origami
