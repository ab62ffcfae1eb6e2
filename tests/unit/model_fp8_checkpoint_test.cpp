// FP8 checkpoints as users have them (compressed-tensors, ModelOpt), written from the tiny models
// at test time; per-channel quantization against a brute force; TP shards; the schemes that are
// refused, each with an error naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/fp8.h"
#include "model/config.h"
#include "model/fp8_weights.h"
#include "model/weights.h"
#include "unit/fp8_checkpoint_fixture.h"
#include "unit/model_test_util.h"

namespace origami::testing {
namespace {

// The nearest finite E4M3 code to x by exhaustive search (ties to the even code), saturating.
uint8_t brute_force_code(float x) {
  int best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const double err = std::fabs(static_cast<double>(fp8_e4m3_to_f32(static_cast<uint8_t>(c))) - x);
    if (err < best_err || (err == best_err && (c & 1) == 0 && (c & 0x80) == (std::signbit(x) ? 0x80 : 0))) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(Fp8Quantization, PerChannelMatchesBruteForce) {
  const int64_t rows = 24, cols = 40;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<uint16_t> bf16(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)  // rows of very different ranges, one all zero
      bf16[r * cols + c] = f32_to_bf16(r == 5 ? 0.0f : dist(rng) * std::ldexp(1.0f, static_cast<int>(r % 9) - 4));
  TensorView t{"w", DType::kBF16, {rows, cols}, bf16.data()};
  auto m = fp8_matrix(t, {});
  ASSERT_TRUE(m.has_value()) << m.status().message();
  for (int64_t r = 0; r < rows; ++r) {
    double amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(static_cast<double>(bf16_to_f32(bf16[r * cols + c]))));
    const float scale = amax > 0 ? static_cast<float>(amax) / 448.0f : m->scales[r];
    ASSERT_EQ(m->scales[r], scale) << "row " << r;
    for (int64_t c = 0; c < cols; ++c) {
      const float x = bf16_to_f32(bf16[r * cols + c]);
      ASSERT_EQ(m->codes[r * cols + c], brute_force_code(x / scale)) << r << "," << c;
    }
    if (amax > 0) {  // the row's largest element maps to +-448 exactly
      bool has_max = false;
      for (int64_t c = 0; c < cols; ++c) has_max = has_max || (m->codes[r * cols + c] & 0x7f) == 0x7e;
      EXPECT_TRUE(has_max) << r;
    }
  }
  // Dequantized values are within half a step (relative 2^-4) of the originals.
  const std::vector<float> d = m->dequantize();
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float x = bf16_to_f32(bf16[i]);
    EXPECT_LE(std::fabs(d[i] - x), std::fabs(x) / 16 + m->scales[i / cols] * std::ldexp(1.0f, -10)) << i;
  }
}

TEST(Fp8Quantization, ShardsKeepTheirScales) {
  Fp8Matrix m;
  m.rows = 4;
  m.cols = 6;
  for (int i = 0; i < 24; ++i) m.codes.push_back(static_cast<uint8_t>(i));
  m.scales = {1, 2, 3, 4};
  m.input_scale = 0.5f;
  const Fp8Matrix r = fp8_rows(m, 2, 2);
  EXPECT_EQ(r.scales, (std::vector<float>{3, 4}));
  EXPECT_EQ(r.codes.front(), 12);
  EXPECT_EQ(r.input_scale, 0.5f);
  const Fp8Matrix c = fp8_cols(m, 3, 3);
  EXPECT_EQ(c.scales, m.scales);
  EXPECT_EQ(c.codes, (std::vector<uint8_t>{3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23}));
  const Fp8Matrix s = stack_fp8_rows({&r, &m});
  EXPECT_EQ(s.rows, 6);
  EXPECT_EQ(s.scales.size(), 6u);
  Fp8Matrix dynamic = m;
  dynamic.input_scale = 0;
  EXPECT_EQ(stack_fp8_rows({&m, &dynamic}).input_scale, 0.0f);  // any dynamic part: dynamic
}

// Loads the FP8 checkpoint written from `src` and checks every projection against quantizing
// the bf16 original the same way.
void check_loads(const std::filesystem::path& src, Fp8Format format) {
  TempDir dir;
  write_fp8_checkpoint(src, dir.path(), format, 0.05f);
  auto config = load_model_config(dir.path());
  ASSERT_TRUE(config.has_value()) << config.status().message();
  ASSERT_TRUE(config->quantization.fp8());
  const bool per_channel = format == Fp8Format::kCompressedTensorsChannel;
  EXPECT_EQ(config->quantization.static_input_scales, !per_channel);
  EXPECT_EQ(config->quantization.method,
            format == Fp8Format::kCompressedTensorsChannel || format == Fp8Format::kCompressedTensorsStatic
                ? "compressed-tensors"
                : "modelopt");
  auto weights = load_model_weights(dir.path(), *config);
  ASSERT_TRUE(weights.has_value()) << weights.status().message();
  auto original_config = load_model_config(src);
  auto original = load_model_weights(src, *original_config);
  ASSERT_TRUE(original.has_value());
  EXPECT_EQ(weights->embed_tokens.dtype, original->embed_tokens.dtype);
  for (size_t l = 0; l < weights->layers.size(); ++l) {
    const auto fp8 = weights->layers[l].linears();
    const auto bf16 = original->layers[l].linears();
    for (size_t i = 0; i < fp8.size(); ++i) {
      ASSERT_EQ(fp8[i].weight->dtype, DType::kF8E4M3);
      auto m = fp8_matrix(*fp8[i].weight, *fp8[i].scales);
      ASSERT_TRUE(m.has_value()) << m.status().message();
      EXPECT_EQ(m->input_scale, per_channel ? 0.0f : 0.05f);
      if (per_channel) {  // exactly what --quantization fp8 computes from the bf16 checkpoint
        auto q = fp8_matrix(*bf16[i].weight, *bf16[i].scales);
        ASSERT_TRUE(q.has_value());
        ASSERT_EQ(m->codes, q->codes) << fp8[i].weight->name;
        ASSERT_EQ(m->scales, q->scales) << fp8[i].weight->name;
      } else {  // one scale for every row; dequantized within E4M3's precision of the original
        EXPECT_TRUE(std::all_of(m->scales.begin(), m->scales.end(), [&](float s) { return s == m->scales[0]; }));
        const std::vector<float> d = m->dequantize(), w = bf16[i].weight->to_f32();
        for (size_t e = 0; e < w.size(); ++e)
          ASSERT_LE(std::fabs(d[e] - w[e]), std::fabs(w[e]) / 16 + m->scales[0] * std::ldexp(1.0f, -10)) << e;
      }
    }
  }
}

TEST(Fp8Checkpoint, CompressedTensorsPerChannelLoads) { check_loads(tiny_qwen3_dir(), Fp8Format::kCompressedTensorsChannel); }
TEST(Fp8Checkpoint, CompressedTensorsStaticLoads) { check_loads(stories_dir(), Fp8Format::kCompressedTensorsStatic); }
TEST(Fp8Checkpoint, ModelOptConfigLoads) { check_loads(tiny_qwen3_dir(), Fp8Format::kModelOptConfig); }
TEST(Fp8Checkpoint, ModelOptQuantFileLoads) { check_loads(stories_dir(), Fp8Format::kModelOptFile); }

// config.json of stories260k with `quantization_config` replaced.
Status parse_with(const nlohmann::json& quantization_config) {
  std::ifstream in(stories_dir() / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["quantization_config"] = quantization_config;
  return parse_model_config(j.dump(), "config.json").status();
}

TEST(Fp8Checkpoint, RefusedSchemesNameThemselves) {
  EXPECT_TRUE(message_has(parse_with({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}}), {"'awq'", "not supported"}) ||
              message_has(parse_with({{"quant_method", "awq"}}), {"\"awq\"", "not supported"}));
  EXPECT_TRUE(message_has(parse_with({{"quant_method", "gptq"}, {"bits", 4}}), {"\"gptq\"", "not supported"}));
  EXPECT_TRUE(message_has(parse_with({{"quant_method", "bitsandbytes"}}), {"\"bitsandbytes\"", "not supported"}));
  EXPECT_TRUE(message_has(parse_with({{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}),
                          {"block-wise FP8", "weight_block_size", "[128,128]"}));
  nlohmann::json int4 = compressed_tensors_config(true, false);
  int4["format"] = "pack-quantized";
  EXPECT_TRUE(message_has(parse_with(int4), {"\"pack-quantized\"", "not supported"}));
  nlohmann::json w4 = compressed_tensors_config(true, false);
  w4["format"] = "float-quantized";
  w4["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
  w4["config_groups"]["group_0"]["weights"]["type"] = "int";
  EXPECT_TRUE(message_has(parse_with(w4), {"4-bit int", "only 8-bit float"}));
  nlohmann::json block = compressed_tensors_config(true, false);
  block["config_groups"]["group_0"]["weights"]["strategy"] = "block";
  block["config_groups"]["group_0"]["weights"]["block_structure"] = {128, 128};
  EXPECT_TRUE(message_has(parse_with(block), {"block-wise FP8"}));
  nlohmann::json group = compressed_tensors_config(true, false);
  group["config_groups"]["group_0"]["weights"]["strategy"] = "group";
  group["config_groups"]["group_0"]["weights"]["group_size"] = 128;
  EXPECT_TRUE(message_has(parse_with(group), {"per-group FP8"}));
  EXPECT_TRUE(message_has(parse_with({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}}), {"\"NVFP4\"", "ModelOpt"}));
  EXPECT_TRUE(message_has(parse_with({{"quant_method", "modelopt"}, {"quant_algo", "W4A16_AWQ"}}), {"\"W4A16_AWQ\""}));
  // Long values are cut in messages.
  const Status long_name = parse_with({{"quant_method", std::string(5000, 'x')}});
  EXPECT_FALSE(long_name.is_ok());
  EXPECT_LT(long_name.message().size(), 400u);
  EXPECT_TRUE(parse_with(nullptr).is_ok());  // null: unquantized
}

TEST(Fp8Checkpoint, ModelOptFileWithOtherAlgoIsRefused) {
  TempDir dir;
  write_fp8_checkpoint(stories_dir(), dir.path(), Fp8Format::kModelOptFile);
  write_text(dir.path() / "hf_quant_config.json", R"({"quantization": {"quant_algo": "INT4_AWQ"}})");
  EXPECT_TRUE(message_has(load_model_config(dir.path()).status(), {"hf_quant_config.json", "\"INT4_AWQ\""}));
}

TEST(Fp8Checkpoint, MissingScaleAndStrayFp8AreErrors) {
  TempDir dir;
  write_fp8_checkpoint(stories_dir(), dir.path(), Fp8Format::kCompressedTensorsChannel);
  // The same tensors without the quantization_config: the F8_E4M3 tensor is named.
  auto config = load_model_config(dir.path());
  ASSERT_TRUE(config.has_value());
  ModelConfig plain = *config;
  plain.quantization = {};
  EXPECT_TRUE(message_has(load_model_weights(dir.path(), plain).status(), {"F8_E4M3", "quantization_config"}));
  // Static input scales announced but absent.
  ModelConfig needs_inputs = *config;
  needs_inputs.quantization.static_input_scales = true;
  EXPECT_TRUE(message_has(load_model_weights(dir.path(), needs_inputs).status(), {"input_scale", "missing"}));
}

}  // namespace
}  // namespace origami::testing
