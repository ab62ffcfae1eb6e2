// Programmatic dependent launch (backend/cuda/programmatic_launch.h): the decode kernels may be
// scheduled while the kernel before them finishes, each waiting for it before touching the step's
// memory, so the outputs must be bit for bit those of ordinary stream order. Greedy tokens and
// forced log-probabilities of tiny-qwen3 with and without it: graphs and eager, bf16 and FP8
// weights + FP8 KV (where one or two rows take the FP8 GEMV), one group and per-head pages,
// async scheduling on and off.
#include <gtest/gtest.h>

#include "backend/cuda/programmatic_launch.h"
#include "engine_run_util.h"

namespace origami::testing {
namespace {

TEST(EngineCudaProgrammaticLaunch, OutputsAreBitIdenticalToStreamOrder) {
  const std::vector<std::vector<int32_t>> prompts = shared_prefix_prompts(31, 20, 17);
  struct Case {
    bool graphs;
    bool fp8;
    int heads_per_group;
    bool async;
  };
  for (const Case& k : {Case{true, false, 0, false}, Case{false, false, 0, false}, Case{true, true, 0, true},
                        Case{false, true, 0, false}, Case{true, false, 1, true}}) {
    SCOPED_TRACE(std::string(k.graphs ? "graphs" : "eager") + (k.fp8 ? ", fp8" : ", bf16") + ", heads per group " +
                 std::to_string(k.heads_per_group) + (k.async ? ", async" : ""));
    EngineConfig c = tiny_qwen3_engine_config("cuda", k.heads_per_group, k.graphs);
    c.async_scheduling = k.async;
    if (k.fp8) {
      c.quantization = "fp8";
      c.kv_cache_dtype = KVCacheDType::kFP8;
    }
    const bool default_setting = cuda::programmatic_launch_enabled();
    cuda::set_programmatic_launch(false);
    const RunResult ordered = run(c, prompts, 24);
    const RunResult forced_ordered = run(c, prompts, 24, &ordered.tokens);
    cuda::set_programmatic_launch(true);
    const RunResult programmatic = run(c, prompts, 24);
    const RunResult forced_programmatic = run(c, prompts, 24, &ordered.tokens);
    cuda::set_programmatic_launch(default_setting);
    expect_bit_identical_runs(ordered, forced_ordered, programmatic, forced_programmatic, 24);
  }
}

}  // namespace
}  // namespace origami::testing
