// Context mode emulated in one request (`origami eval retrieval --mode context-emulated`; `--mode context` runs it as two requests on retained contexts): the document is the prompt and every
// compression it triggers must happen before the first question token is computed, for every
// registered policy, whatever its trigger. A backend that forwards to the CPU backend records,
// in execution order, each compression job (which request, how many entries it scores) and each
// forward sequence (which positions it computes). For a document over the budget, the first
// sequence that computes a question position must come after a compression of that request, and
// that compression must have scored exactly the document's entries: no question token was in
// the cache (or in the observation window) when the document was compressed.
#include <algorithm>

#include "cpu_backend_wrapper.h"
#include "engine_test_util.h"
#include "head_budgets_test_util.h"
#include "eval/eval_runner.h"
#include "eval/retrieval_task.h"
#include "policy/policy_registry.h"

namespace origami::testing {
namespace {

constexpr int kBudget = 64;

class RecordingBackend : public CpuBackendWrapper {
 public:
  RecordingBackend() : CpuBackendWrapper("recording-cpu") {}

  struct Event {
    uint64_t request_id = 0;
    bool compression = false;
    int num_entries = 0;                  // compression: entries it scores
    int first_position = 0, end_position = 0;  // forward: positions computed [first, end)
  };

  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    // Jobs of a step run before its forward pass on the CPU backend (and a request being
    // compressed is never among the sequences of the step on any backend).
    for (const CompressionJob& j : batch.compressions) events.push_back({j.request_id, true, j.num_entries, 0, 0});
    for (const SequenceInput& s : batch.sequences)
      events.push_back({s.request_id, false, 0, s.start_position, s.start_position + s.num_query_tokens});
    return inner_->execute(batch, out);
  }

  std::vector<Event> events;
};

std::string document(int filler_sentences, const std::string& thing, const std::string& digits) {
  std::string text;
  for (int i = 0; i < filler_sentences; ++i) {
    text += "The river ran past the old mill and the village where people worked in the fields. ";
    if (i == filler_sentences / 3) text += "The secret number of the " + thing + " is " + digits + ". ";
  }
  return text + "\nQuestion: What is the secret number of the " + thing + "?\nAnswer: The secret number of the " + thing + " is";
}

TEST(EvalContextMode, EveryPolicyCompressesTheDocumentBeforeTheFirstQuestionToken) {
  EngineConfig config = cpu_config(tiny_qwen3_dir());  // the eval's engine: full KV by default
  config.kv_gates = tiny_qwen3_gates();                 // for fastkvzip
  const std::vector<eval::RetrievalExample> examples = {
      {"long", document(12, "red fox", "1234"), "1234"},       // ~220 tokens: over the budget
      {"longer", document(18, "blue whale", "5678"), "5678"},  // ~330 tokens
      {"short", document(1, "green tiger", "9012"), "9012"},   // fits the budget: nothing to compress
  };
  int num_policies = 0;
  for (const PolicyInfo& info : PolicyRegistry::builtin().policies()) {
    auto policy = PolicyRegistry::builtin().create(info.name);
    ASSERT_TRUE(policy.has_value()) << info.name;
    if (!(*policy)->compresses()) continue;
    // A policy without a budget (kvllm: its periodic trigger compresses windows of what decoding
    // writes) makes no promise about the document as a whole; its context-mode points measure
    // what that trigger does.
    if (!(*policy)->takes_budget()) continue;
    SCOPED_TRACE(info.name);
    ++num_policies;
    auto backend = std::make_unique<RecordingBackend>();
    RecordingBackend* recording = backend.get();
    // A policy that needs calibrated head budgets (tangram) is served with a budget file.
    EngineConfig policy_config = config;
    const bool calibrated = (*policy)->budget_split() == BudgetSplit::kCalibrated;
    if (calibrated)
      policy_config.kv_head_budgets = write_head_budgets("context_mode_budgets.json");
    auto created = Engine::create(policy_config, std::move(backend));
    ASSERT_TRUE(created.has_value()) << created.status().to_string();
    Engine& engine = **created;
    auto tokenizer = engine.tokenizer();

    std::vector<eval::EvalItem> items;
    for (const eval::RetrievalExample& ex : examples) {
      auto item = eval::make_retrieval_item(*tokenizer, ex, eval::RetrievalMode::kContextEmulated, 3);
      ASSERT_TRUE(item.has_value()) << item.status().to_string();
      items.push_back(std::move(*item));
    }
    ASSERT_GT(items[0].prompt_token_ids.size(), 2u * kBudget);
    ASSERT_LT(items[2].prompt_token_ids.size(), static_cast<size_t>(kBudget));
    // fastkvzip's default window of 128 exceeds the budget.
    const std::map<std::string, std::string> options =
        (*policy)->needs().gate_scores ? std::map<std::string, std::string>{{"window", "16"}}
                                       : std::map<std::string, std::string>{};
    const std::vector<eval::EvalItemResult> results =
        eval::run_eval_batch(engine, items, {info.name, kBudget, options});
    for (const eval::EvalItemResult& r : results) ASSERT_TRUE(r.ok) << r.error;

    // Request ids are given in order from 1 (one engine per policy).
    for (size_t d = 0; d < items.size(); ++d) {
      SCOPED_TRACE(examples[d].id);
      const uint64_t id = d + 1;
      const int prompt_len = static_cast<int>(items[d].prompt_token_ids.size());
      bool compressed = false, question_seen = false;
      int first_compression_entries = -1;
      for (const RecordingBackend::Event& e : recording->events) {
        if (e.request_id != id) continue;
        if (e.compression) {
          if (!compressed) first_compression_entries = e.num_entries;
          compressed = true;
          if (!question_seen) {
            EXPECT_LE(e.num_entries, prompt_len) << "a compression before the question scored more than the document";
          }
          continue;
        }
        if (e.end_position > prompt_len && !question_seen) {
          question_seen = true;
          EXPECT_GE(e.first_position, prompt_len) << "the first question token was computed with the document";
          if (prompt_len > kBudget) {
            EXPECT_TRUE(compressed) << "the first question token was computed before the document was compressed";
            EXPECT_EQ(first_compression_entries, prompt_len) << "the compression did not see exactly the document";
          } else if (!calibrated) {
            // Calibrated budgets are an average per head: a group under the average keeps fewer
            // entries, so a document within the budget may still be compressed there.
            EXPECT_FALSE(compressed) << "a document within the budget was compressed";
          }
        }
      }
      EXPECT_TRUE(question_seen);
    }
  }
  EXPECT_GE(num_policies, 3);
}

}  // namespace
}  // namespace origami::testing
