#pragma once
// A calibrated head budget file for origami-tiny-qwen3 (6 layers, 4 KV heads), for tests that
// serve non-uniform head budgets. Heads 0 and 2 of every layer retain little (0.2, 0.3), heads 1
// and 3 much (0.9, 0.8): clustered into groups of 2, each layer's groups are {0, 2} (ratio 0.3,
// share 1/3 of the largest) and {1, 3} (ratio 0.9, share 1), groups numbered layer by layer with
// the smaller first.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/head_budget_loader.h"
#include "engine_test_util.h"
#include "kv/head_budgets.h"
#include "model/config.h"

namespace origami::testing {

inline std::string write_head_budgets(const std::string& name,
                                      const std::vector<double>& layer = {0.2, 0.9, 0.3, 0.8}) {
  auto mc = load_model_config(tiny_qwen3_dir());
  EXPECT_TRUE(mc.has_value());
  HeadBudgets b;
  b.model = model_identity(*mc);
  b.scorer = "knorm";
  b.samples = 2;
  b.sample_tokens = {100, 100};
  b.ratios.assign(mc->num_layers, layer);
  b.mean = b.ratios;
  b.stddev.assign(mc->num_layers, std::vector<double>(layer.size(), 0.0));
  const std::string path = ::testing::TempDir() + name;
  EXPECT_TRUE(save_head_budgets(b, path).is_ok());
  return path;
}

}  // namespace origami::testing
