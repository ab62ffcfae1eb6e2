// Reports (does not assert) the CPU backend's decode and prefill speed on origami-tiny-qwen3 at
// batch 1 and 16, with the weight bytes streamed per decode step for a GB/s figure.
#include <chrono>
#include <cstdio>

#include "backend_cpu_test_util.h"

namespace origami::test {
namespace {

TEST(CpuThroughput, TinyQwen3Decode) {
  const std::string model = "origami-tiny-qwen3";
  const nlohmann::json golden = load_golden(model);
  const std::vector<int32_t> prompt = golden["greedy"][2]["prompt_ids"].get<std::vector<int32_t>>();
  const int block_size = 16, decode_steps = 32;
  for (int threads : {1, 0})
  for (int batch : {1, 16}) {
    auto backend = make_cpu_backend(model, block_size, 1 + batch * 8, threads);
    ASSERT_NE(backend, nullptr);
    const ModelConfig& c = backend->config();
    const double weight_bytes = 4.0 * c.num_parameters();
    PageCounter pages;
    std::vector<TestSequence> seqs;
    for (int i = 0; i < batch; ++i) seqs.emplace_back(i);
    std::vector<StepPart> parts;
    for (auto& s : seqs) parts.push_back({&s, prompt, LogitsMode::kLast});
    auto t0 = std::chrono::steady_clock::now();
    StepOutput out = run_step(*backend, parts, block_size, &pages);
    const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t0 = std::chrono::steady_clock::now();
    for (int step = 0; step < decode_steps; ++step) {
      for (int i = 0; i < batch; ++i) {
        ASSERT_GE(out.sampled_tokens[i], 0);
        parts[i].tokens = {out.sampled_tokens[i]};
      }
      out = run_step(*backend, parts, block_size, &pages);
    }
    const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ info ] %s cpu (%d threads): batch %2d: prefill %.0f tok/s (%d x %zu tokens); decode %.1f tok/s "
                "(%.2f ms/step, %.1f GB/s of weights)\n",
                model.c_str(), backend->num_threads(), batch, batch * prompt.size() / prefill_s, batch, prompt.size(),
                batch * decode_steps / decode_s, 1e3 * decode_s / decode_steps,
                weight_bytes * decode_steps / decode_s / 1e9);
  }
}

}  // namespace
}  // namespace origami::test
