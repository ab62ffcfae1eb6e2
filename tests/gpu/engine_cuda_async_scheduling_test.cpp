// Asynchronous scheduling on the CUDA backend: step N+1 launched before step N's tokens are read
// back, its pending tokens gathered on the device from step N's samples (outside the decode
// graphs), two launch slots of results. Requests that end by length keep the schedule of one
// step at a time step for step (a request whose last token is in flight is not scheduled), so the
// same kernels run on the same batches: the tokens must be bit-identical to the synchronous run's.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "engine_run_util.h"

namespace origami::testing {
namespace {

// Twelve prompts of 5-90 tokens with 8-60 outputs each through 8 sequences: requests are admitted
// while others decode with a token pending, and the step's sequence count (and the step buffers)
// grows under pending tokens.
struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_tokens;
};
Workload workload() {
  std::mt19937 rng(23);
  Workload w;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p(5 + rng() % 86);
    for (int32_t& t : p) t = static_cast<int32_t>(20 + rng() % 880);
    w.prompts.push_back(std::move(p));
    w.max_tokens.push_back(8 + static_cast<int>(rng() % 53));
  }
  return w;
}

std::vector<std::vector<int32_t>> generate(const EngineConfig& c, const Workload& w, int64_t* pipelined,
                                           int64_t* staged_uploads = nullptr) {
  auto engine = Engine::create(c);
  EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
  if (!engine) return {};
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = w.max_tokens[i];
    p.ignore_eos = true;
    auto id = (*engine)->add_request(w.prompts[i], p);
    EXPECT_TRUE(id.has_value());
    if (id) index[*id] = i;
  }
  std::vector<std::vector<int32_t>> tokens(w.prompts.size());
  while ((*engine)->has_unfinished()) {
    for (const RequestOutput& o : (*engine)->step()) {
      EXPECT_NE(o.finish_reason, FinishReason::kError) << o.error;
      std::vector<int32_t>& t = tokens[index.at(o.request_id)];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }
  }
  EXPECT_EQ((*engine)->num_kv_blocks_used(), 0) << "KV blocks leaked";
  *pipelined = (*engine)->metrics().num_pipelined_steps;
  if (staged_uploads != nullptr) {
    const auto* cuda = dynamic_cast<const cuda::CudaBackend*>(&(*engine)->backend());
    EXPECT_NE(cuda, nullptr);
    *staged_uploads = cuda != nullptr ? cuda->num_staged_uploads() : 0;
  }
  return tokens;
}

TEST(EngineCudaAsyncScheduling, TokensAreBitIdenticalToOneStepAtATime) {
  const Workload w = workload();
  struct Case {
    bool graphs;
    int heads_per_group;
    std::string policy;
  };
  for (const Case& k : {Case{true, 0, "full"}, Case{false, 0, "full"}, Case{true, 1, "full"}, Case{true, 0, "zipage"}}) {
    SCOPED_TRACE(std::string(k.graphs ? "graphs" : "eager") + ", heads per group " + std::to_string(k.heads_per_group) +
                 ", " + k.policy);
    EngineConfig c = tiny_qwen3_engine_config("cuda", k.heads_per_group, k.graphs);
    c.num_kv_blocks = 160;
    c.kv_policy = k.policy;
    c.kv_budget = 48;
    c.async_compression = false;  // compressions finish in their step: the schedule is fixed
    int64_t sync_pipelined = 0;
    const auto expected = generate(c, w, &sync_pipelined);
    EXPECT_EQ(sync_pipelined, 0);
    c.async_scheduling = true;
    // Also with the step inputs staged over the copy stream while the step before runs
    // (StepInputUpload, read from the environment when the backend is made).
    for (bool staged : {false, true}) {
      SCOPED_TRACE(staged ? "inputs staged" : "inputs on the compute stream");
      setenv("ORIGAMI_OVERLAP_INPUT_UPLOAD", staged ? "1" : "0", 1);
      int64_t async_pipelined = 0, staged_uploads = 0;
      const auto got = generate(c, w, &async_pipelined, &staged_uploads);
      unsetenv("ORIGAMI_OVERLAP_INPUT_UPLOAD");
      if (staged) EXPECT_GT(staged_uploads, 40);
      else EXPECT_EQ(staged_uploads, 0);
      ASSERT_EQ(got.size(), expected.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(static_cast<int>(got[i].size()), w.max_tokens[i]) << "request " << i;
        EXPECT_EQ(got[i], expected[i]) << "request " << i;
      }
      EXPECT_GT(async_pipelined, 40);
    }
  }
}

}  // namespace
}  // namespace origami::testing
