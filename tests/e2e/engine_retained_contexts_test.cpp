// Retained contexts through the engine on the CPU backend (tiny Qwen3):
//  - full KV: continuing a finished request's context gives bit-identical greedy tokens and
//    log-probabilities to prefilling the whole history in a fresh engine, and prefills only the rest;
//  - compressed (snapkv at the prompt's end): a retain-only document, then the question continuing
//    it, equals the one-request emulation (document prompt, question as forced tokens);
//  - several continuations of one context at once, under a policy that compacts while they decode
//    (streaming: shared pages are copied, never written), equal each continuation run alone;
//  - abort, preemption and release of a context mid-use; every page back in the pool at the end;
//  - Fast KVzip's unequal per-head counts (per-head pages) continued over two turns.
#include <functional>
#include <map>
#include <vector>

#include "engine_test_util.h"

namespace origami::testing {
namespace {

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // of each output token
  FinishReason reason = FinishReason::kNone;
};

RequestOptions options_for(const std::string& policy, int budget) {
  RequestOptions o;
  o.kv_policy = policy;
  o.kv_budget = budget;
  o.logprobs = 0;
  return o;
}

// Adds the requests, steps until all finished (calling `each_step` after every step).
std::vector<Outcome> run_all(Engine& engine, const std::vector<std::pair<std::vector<int32_t>, RequestOptions>>& reqs,
                         int max_tokens, const std::function<void(int, const std::vector<RequestId>&)>& each_step = {}) {
  std::vector<RequestId> ids;
  for (const auto& [prompt, options] : reqs) {
    auto id = engine.add_request(prompt, greedy(max_tokens), options);
    EXPECT_TRUE(id.has_value()) << id.status().to_string();
    ids.push_back(id.has_value() ? *id : 0);
  }
  std::map<RequestId, Outcome> runs;
  int step = 0;
  while (engine.has_unfinished()) {
    for (const RequestOutput& out : engine.step()) {
      Outcome& r = runs[out.request_id];
      r.tokens.insert(r.tokens.end(), out.new_token_ids.begin(), out.new_token_ids.end());
      for (const TokenLogprobs& lp : out.logprobs) r.logprobs.push_back(lp.logprob);
      if (out.finished) r.reason = out.finish_reason;
    }
    if (each_step) each_step(step++, ids);
  }
  std::vector<Outcome> result;
  for (RequestId id : ids) {
    result.push_back(runs[id]);
    engine.release_request(id);
  }
  return result;
}

std::vector<int32_t> document(const Engine& engine, int n) {
  const std::string text =
      "The lighthouse keeper counted the ships that passed the northern rocks every night. "
      "The secret number of the blue heron is 4821. Winds came from the west, and the keeper wrote "
      "each storm into a small leather book beside the lamp. The secret number of the red fox is 1973. ";
  std::vector<int32_t> ids = engine.tokenizer()->encode(text + text + text, true);
  EXPECT_GE(static_cast<int>(ids.size()), n);
  ids.resize(static_cast<size_t>(n));
  return ids;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

EngineConfig retaining(EngineConfig c) {
  c.retain_contexts = true;
  return c;
}

TEST(EngineRetainedContexts, FullKVContinuationEqualsPrefillingTheWholeHistory) {
  auto engine = make_engine(retaining(cpu_config(tiny_qwen3_dir())));
  ASSERT_NE(engine, nullptr);
  const int free_pages = engine->num_kv_blocks_used();
  const std::vector<int32_t> doc = document(*engine, 70);
  const std::vector<int32_t> question = engine->tokenizer()->encode(" Question: the heron's number?", false);
  const RequestOptions full = options_for("full", 0);
  const Outcome first = run_all(*engine, {{doc, full}}, 6)[0];
  ASSERT_EQ(first.tokens.size(), 6u);
  EXPECT_EQ(engine->metrics().num_retained_contexts, 1);

  const std::vector<int32_t> turn2 = concat(concat(doc, first.tokens), question);
  const int64_t computed_before = engine->metrics().num_prompt_tokens_computed;
  const Outcome second = run_all(*engine, {{turn2, full}}, 8)[0];
  // The history (document + all outputs but the last, whose KV was never computed) was served.
  EXPECT_EQ(engine->metrics().num_retained_hits, 1);
  EXPECT_EQ(engine->metrics().num_retained_hit_tokens, 70 + 5);
  EXPECT_EQ(engine->metrics().num_prompt_tokens_computed - computed_before,
            static_cast<int64_t>(turn2.size()) - 75);

  auto fresh = make_engine(cpu_config(tiny_qwen3_dir()));
  const Outcome reference = run_all(*fresh, {{turn2, full}}, 8)[0];
  EXPECT_EQ(second.tokens, reference.tokens);
  ASSERT_EQ(second.logprobs.size(), reference.logprobs.size());
  for (size_t i = 0; i < reference.logprobs.size(); ++i) EXPECT_EQ(second.logprobs[i], reference.logprobs[i]) << i;

  // Opting out: neither continued nor kept.
  RequestOptions no_retain = full;
  no_retain.retain_context = false;
  const int64_t contexts = engine->metrics().num_retained_contexts;
  const Outcome third = run_all(*engine, {{turn2, no_retain}}, 8)[0];
  EXPECT_EQ(third.tokens, reference.tokens);
  EXPECT_EQ(engine->metrics().num_retained_hits, 1);
  EXPECT_EQ(engine->metrics().num_retained_contexts, contexts);

  engine->release_retained_contexts();
  EXPECT_EQ(engine->num_kv_blocks_used(), free_pages);
}

TEST(EngineRetainedContexts, CompressedContinuationEqualsTheContextModeEmulation) {
  auto engine = make_engine(retaining(cpu_config(tiny_qwen3_dir())));
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> doc = document(*engine, 90);
  const std::vector<int32_t> question = engine->tokenizer()->encode(" Question: the heron's number is", false);
  const int answer = 6;
  for (const char* policy : {"snapkv", "keydiff"}) {
    SCOPED_TRACE(policy);
    // The emulation: the document as the prompt, the question forced after it.
    auto emulation_engine = make_engine(cpu_config(tiny_qwen3_dir()));
    RequestOptions forced = options_for(policy, 48);
    forced.forced_output_tokens = question;
    const Outcome emulated = run_all(*emulation_engine, {{doc, forced}}, static_cast<int>(question.size()) + answer)[0];
    ASSERT_EQ(emulated.tokens.size(), question.size() + answer);
    const std::vector<int32_t> expected(emulated.tokens.begin() + static_cast<std::ptrdiff_t>(question.size()),
                                        emulated.tokens.end());

    // Two requests: the document retained (compressed at its end), then the question continuing it.
    RequestOptions retain_only = options_for(policy, 48);
    retain_only.retain_only = true;
    const int64_t compressions = engine->metrics().num_compressions;
    const Outcome doc_run = run_all(*engine, {{doc, retain_only}}, 1)[0];
    EXPECT_TRUE(doc_run.tokens.empty());
    EXPECT_EQ(doc_run.reason, FinishReason::kLength);
    EXPECT_EQ(engine->metrics().num_compressions, compressions + 1);
    const int64_t hits = engine->metrics().num_retained_hits;
    const Outcome continued = run_all(*engine, {{concat(doc, question), options_for(policy, 48)}}, answer)[0];
    EXPECT_EQ(engine->metrics().num_retained_hits, hits + 1);
    EXPECT_EQ(engine->metrics().num_compressions, compressions + 1);  // the continuation did not compress again
    EXPECT_EQ(continued.tokens, expected);

    // Under another policy the compressed context is not continued: a miss, computed from scratch.
    const Outcome other = run_all(*engine, {{concat(doc, question), options_for("full", 0)}}, answer)[0];
    EXPECT_EQ(engine->metrics().num_retained_hits, hits + 1);
    EXPECT_EQ(other.tokens.size(), static_cast<size_t>(answer));
  }
  engine->release_retained_contexts();
  EXPECT_EQ(engine->num_kv_blocks_used(), 0);
}

// PagedEviction evicts a whole block when the request holds exactly N_max full blocks; a
// continuation's prompt carries a compacted context past N_max blocks in one prefill, to a count
// that is not N_max blocks (the eval's context mode once failed an internal check here). That
// prompt is compacted token-wise to k, as a first prompt's end is, then decoding evicts blocks.
TEST(EngineRetainedContexts, PagedEvictionContinuationPastItsBlocksIsCompacted) {
  auto engine = make_engine(retaining(cpu_config(tiny_qwen3_dir())));
  ASSERT_NE(engine, nullptr);
  const int block = engine->config().block_size;
  const int budget = 3 * block;  // k = 3 blocks, N_max = 4
  const std::vector<int32_t> doc = document(*engine, 90);
  std::vector<int32_t> long_question = engine->tokenizer()->encode(
      " Question: what is the secret number of the blue heron that the keeper wrote into the small leather book "
      "beside the lamp, and which winds came from the west?",
      false);
  ASSERT_GT(static_cast<int>(long_question.size()), 2 * block);
  const int answer = block + 4;  // decodes past N_max blocks once more: a block eviction
  // Past N_max blocks by a count no whole block evens out, then by whole blocks.
  for (int question_len : {block + 5, 2 * block}) {
    SCOPED_TRACE(question_len);
    const std::vector<int32_t> question(long_question.begin(), long_question.begin() + question_len);
    RequestOptions retain_only = options_for("pagedeviction", budget);
    retain_only.retain_only = true;
    const int64_t compressions = engine->metrics().num_compressions;
    run_all(*engine, {{doc, retain_only}}, 1);
    EXPECT_EQ(engine->metrics().num_compressions, compressions + 1);  // the document, to k
    const int64_t hits = engine->metrics().num_retained_hits;
    const Outcome continued = run_all(*engine, {{concat(doc, question), options_for("pagedeviction", budget)}}, answer)[0];
    EXPECT_EQ(engine->metrics().num_retained_hits, hits + 1);
    EXPECT_EQ(continued.tokens.size(), static_cast<size_t>(answer));
    EXPECT_EQ(continued.reason, FinishReason::kLength);
    // The question's end (k + question > N_max blocks: a compaction), then the decode's block eviction.
    EXPECT_GE(engine->metrics().num_compressions, compressions + 3);
    engine->release_retained_contexts();
  }
  EXPECT_EQ(engine->num_kv_blocks_used(), 0);
}

// Per-head pages under a runtime allocation (adakv): a compressed context's head groups hold
// different numbers of entries, and its continuation grows each by the new tokens (admission
// once sized every group from one count and failed an internal check).
TEST(EngineRetainedContexts, PerHeadPagesContinuationEqualsTheContextModeEmulation) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.heads_per_group = 1;
  auto engine = make_engine(retaining(c));
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> doc = document(*engine, 90);
  const std::vector<int32_t> question = engine->tokenizer()->encode(" Question: the heron's number is", false);
  const int answer = 6;
  auto emulation_engine = make_engine(c);
  RequestOptions forced = options_for("adakv", 48);
  forced.forced_output_tokens = question;
  const Outcome emulated = run_all(*emulation_engine, {{doc, forced}}, static_cast<int>(question.size()) + answer)[0];
  ASSERT_EQ(emulated.tokens.size(), question.size() + answer);
  const std::vector<int32_t> expected(emulated.tokens.begin() + static_cast<std::ptrdiff_t>(question.size()),
                                      emulated.tokens.end());
  RequestOptions retain_only = options_for("adakv", 48);
  retain_only.retain_only = true;
  run_all(*engine, {{doc, retain_only}}, 1);
  const int64_t hits = engine->metrics().num_retained_hits;
  const Outcome continued = run_all(*engine, {{concat(doc, question), options_for("adakv", 48)}}, answer)[0];
  EXPECT_EQ(engine->metrics().num_retained_hits, hits + 1);
  EXPECT_EQ(continued.tokens, expected);
  engine->release_retained_contexts();
  EXPECT_EQ(engine->num_kv_blocks_used(), 0);
}

// Fast KVzip's global threshold keeps a different count per head (per-head pages): a context it
// compressed holds unequal tables, and a continuation must grow each from its own count. Admission
// once grew every table to the heads' mean count plus the new tokens, which is below the fuller
// heads' counts when the new chunk is short (a question): an internal check aborted the engine on
// the second turn of `eval retrieval --mode multiturn --kv-policy fastkvzip`. Two turns continued
// here equal the one-request emulation (the questions forced), which grows every table per step.
TEST(EngineRetainedContexts, ContinuationOfUnequalPerHeadCountsEqualsTheEmulation) {
  EngineConfig config = retaining(cpu_config(tiny_qwen3_dir()));
  config.heads_per_group = 1;
  config.kv_gates = tiny_qwen3_gates();
  auto engine = make_engine(config);
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> doc = document(*engine, 150);
  const std::vector<int32_t> q1 = engine->tokenizer()->encode(" Heron?", false);
  const std::vector<int32_t> q2 = engine->tokenizer()->encode(" Fox?", false);
  const int answer = 4;
  const int budget = 64;
  // A window of 16 (default 128) so that a short document overshoots the budget.
  auto fastkvzip = [](int b) {
    RequestOptions o = options_for("fastkvzip", b);
    o.kv_policy_options = {{"window", "16"}};
    return o;
  };

  // Two turns, each a request continuing the previous one's retained context.
  RequestOptions retain_only = fastkvzip(budget);
  retain_only.retain_only = true;
  const Outcome doc_run = run_all(*engine, {{doc, retain_only}}, 1)[0];
  EXPECT_EQ(doc_run.reason, FinishReason::kLength);
  EXPECT_EQ(engine->metrics().num_compressions, 1);
  const std::vector<int32_t> turn1 = concat(doc, q1);
  const Outcome a1 = run_all(*engine, {{turn1, fastkvzip(budget)}}, answer)[0];
  ASSERT_EQ(a1.tokens.size(), static_cast<size_t>(answer));
  const std::vector<int32_t> turn2 = concat(concat(turn1, a1.tokens), q2);
  const Outcome a2 = run_all(*engine, {{turn2, fastkvzip(budget)}}, answer)[0];
  ASSERT_EQ(a2.tokens.size(), static_cast<size_t>(answer));
  EXPECT_EQ(engine->metrics().num_retained_hits, 2);
  EXPECT_EQ(engine->metrics().num_compressions, 1);  // the turns fit the budget's pages: no other compression

  auto emulation_engine = make_engine([&] { EngineConfig c = config; c.retain_contexts = false; return c; }());
  for (const auto& [forced_tokens, expected] : {std::pair{q1, a1.tokens}, std::pair{concat(concat(q1, a1.tokens), q2), a2.tokens}}) {
    RequestOptions forced = fastkvzip(budget);
    forced.forced_output_tokens = forced_tokens;
    const int64_t compressions = emulation_engine->metrics().num_compressions;
    const Outcome emulated = run_all(*emulation_engine, {{doc, forced}}, static_cast<int>(forced_tokens.size()) + answer)[0];
    EXPECT_EQ(emulation_engine->metrics().num_compressions, compressions + 1);
    ASSERT_EQ(emulated.tokens.size(), forced_tokens.size() + answer);
    EXPECT_EQ(std::vector<int32_t>(emulated.tokens.end() - answer, emulated.tokens.end()), expected);
  }
  engine->release_retained_contexts();
  EXPECT_EQ(engine->num_kv_blocks_used(), 0);
}

TEST(EngineRetainedContexts, ConcurrentContinuationsEqualEachAlone) {
  // streaming compacts whenever a request reaches N_max blocks: the continuations compact pages
  // they share with the context and with each other while they decode.
  const std::string policy = "streaming";
  const int budget = 48;
  EngineConfig config = retaining(cpu_config(tiny_qwen3_dir()));
  auto engine = make_engine(config);
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> doc = document(*engine, 60);
  std::vector<std::vector<int32_t>> prompts;
  for (const char* q : {" Question: heron?", " Question: the red fox's number?", " Tell me about storms."})
    prompts.push_back(concat(doc, engine->tokenizer()->encode(q, false)));
  RequestOptions retain_only = options_for(policy, budget);
  retain_only.retain_only = true;

  // Each alone (the context stays retained between them).
  run_all(*engine, {{doc, retain_only}}, 1);
  std::vector<Outcome> alone;
  for (const auto& p : prompts) alone.push_back(run_all(*engine, {{p, options_for(policy, budget)}}, 40)[0]);
  EXPECT_EQ(engine->metrics().num_retained_hits, 3);
  EXPECT_GT(engine->metrics().num_compressions, 3);

  // All at once, continuing the same context.
  auto together_engine = make_engine(config);
  run_all(*together_engine, {{doc, retain_only}}, 1);
  std::vector<std::pair<std::vector<int32_t>, RequestOptions>> reqs;
  for (const auto& p : prompts) reqs.push_back({p, options_for(policy, budget)});
  const std::vector<Outcome> together = run_all(*together_engine, reqs, 40);
  EXPECT_EQ(together_engine->metrics().num_retained_hits, 3);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << i;
  for (auto* e : {engine.get(), together_engine.get()}) {
    e->release_retained_contexts();
    EXPECT_EQ(e->num_kv_blocks_used(), 0);
  }
}

TEST(EngineRetainedContexts, AbortPreemptionAndReleaseMidUse) {
  EngineConfig config = retaining(cpu_config(tiny_qwen3_dir()));
  config.num_kv_blocks = 1 + 14;  // tight: three continuations growing together cannot all fit
  auto engine = make_engine(config);
  ASSERT_NE(engine, nullptr);
  const RequestOptions full = options_for("full", 0);
  const std::vector<int32_t> doc = document(*engine, 70);  // 5 pages of 16
  std::vector<std::vector<int32_t>> prompts;
  for (const char* q : {" One.", " Two and", " Three, then"}) prompts.push_back(concat(doc, engine->tokenizer()->encode(q, false)));

  std::vector<Outcome> reference;
  auto fresh = make_engine(cpu_config(tiny_qwen3_dir()));
  for (const auto& p : prompts) reference.push_back(run_all(*fresh, {{p, full}}, 60)[0]);

  // Abort a continuation mid-decode; a later one still continues the intact context.
  run_all(*engine, {{doc, [&] { RequestOptions o = full; o.retain_only = true; return o; }()}}, 1);
  const Outcome aborted = run_all(*engine, {{prompts[0], full}}, 60, [&](int step, const std::vector<RequestId>& ids) {
    if (step == 2) engine->abort_request(ids[0]);
  })[0];
  EXPECT_EQ(aborted.reason, FinishReason::kAborted);
  const Outcome after_abort = run_all(*engine, {{prompts[1], full}}, 60)[0];
  EXPECT_EQ(after_abort.tokens, reference[1].tokens);
  EXPECT_EQ(engine->metrics().num_retained_hits, 2);

  // Released while two continuations run on its pages: they go on unharmed.
  engine->release_retained_contexts();
  run_all(*engine, {{doc, [&] { RequestOptions o = full; o.retain_only = true; return o; }()}}, 1);
  const std::vector<Outcome> released = run_all(*engine, {{prompts[0], full}, {prompts[2], full}}, 60,
                                            [&](int step, const std::vector<RequestId>&) {
                                              if (step == 3) engine->release_retained_contexts();
                                            });
  EXPECT_EQ(released[0].tokens, reference[0].tokens);
  EXPECT_EQ(released[1].tokens, reference[2].tokens);

  // Three at once do not fit 14 pages: contexts go first, then running requests are preempted and
  // recomputed; every output is still the reference's.
  engine->release_retained_contexts();
  run_all(*engine, {{doc, [&] { RequestOptions o = full; o.retain_only = true; return o; }()}}, 1);
  const int64_t preemptions = engine->metrics().num_preemptions;
  const std::vector<Outcome> crowded = run_all(*engine, {{prompts[0], full}, {prompts[1], full}, {prompts[2], full}}, 60);
  EXPECT_GT(engine->metrics().num_preemptions, preemptions);
  EXPECT_GT(engine->metrics().num_retained_releases, 0);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(crowded[i].tokens, reference[i].tokens) << i;
  engine->release_retained_contexts();
  EXPECT_EQ(engine->num_kv_blocks_used(), 0);
  EXPECT_EQ(engine->retained_stats().num_pages, 0);
}

TEST(EngineRetainedContexts, RetainOnlyNeedsRetainedContexts) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  RequestOptions o;
  o.retain_only = true;
  auto id = engine->add_request({1, 2, 3}, greedy(1), o);
  ASSERT_FALSE(id.has_value());
  EXPECT_NE(id.status().message().find("kv_retain"), std::string::npos);
}

}  // namespace
}  // namespace origami::testing
