// The multi-turn workload of `origami bench serve` (bench_serve_multiturn.h).
//
// Why /v1/completions with token-id prompts, not /v1/chat/completions: a turn's prompt must
// begin, token for token, with the history the server saw and generated in the previous turn,
// or the benchmark measures the chat template instead of the engine's reuse. A chat template
// re-renders earlier turns (Qwen3's drops the earlier assistant turns' <think> blocks), and
// random-token documents do not survive a text round trip. So the client keeps each
// conversation as token ids: the document and questions exactly, and each answer either as the
// ids the server generated (--answer-ids returned, the default: the request asks for
// "return_token_ids", so the next turn begins with exactly the history the engine retained) or
// as the server's /tokenize of the answer's text (--answer-ids retokenized: what a chat
// client's next request carries, since it sends text). Retokenized ids equal the generated ones
// when the model's output is canonical BPE; turns where they do not (common with
// --dummy-weights) are counted as `answers_retokenized_differently`, since there the history
// matches only up to the answer's first differing token.
#include "bench_serve_multiturn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/error.hpp>
#include <nlohmann/json.hpp>

#include "latency_stats.h"
#include "progress_bar.h"

namespace origami::cli {
namespace {

namespace net = boost::asio;
using Clock = std::chrono::steady_clock;

struct TurnResult {
  bool run = false;  // false: an earlier turn of its conversation failed
  bool ok = false;
  std::string error;
  double ttft = 0.0, e2e = 0.0;
  int output_tokens = 0, prompt_tokens = 0;
  bool retokenized_differently = false;
};

// Random token ids, the same for the same (seed, stream, index) whatever the run's order.
std::vector<int32_t> random_tokens(uint64_t seed, uint64_t stream, uint64_t index, int n, int vocab) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(stream),
                    static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32)};
  std::mt19937_64 rng(seq);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = token(rng);
  return ids;
}

constexpr uint64_t kDocumentStream = 0, kQuestionStream = 1;

// One conversation: its turns in sequence, each sent after the previous answer (+ think time).
net::awaitable<void> run_conversation(const Target& target, const std::string& model, int vocab, const MultiturnWorkload& w,
                                      int conversation, std::vector<TurnResult>* turns, const std::function<void(const TurnResult&)>& on_turn) {
  net::steady_timer timer(co_await net::this_coro::executor);
  std::vector<int32_t> history = random_tokens(w.seed, kDocumentStream, conversation % w.num_documents, w.doc_len, vocab);
  for (int t = 0; t < w.turns; ++t) {
    if (t > 0 && w.think_time > 0) {
      timer.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(w.think_time)));
      boost::beast::error_code ec;
      co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
    }
    const std::vector<int32_t> question =
        random_tokens(w.seed, kQuestionStream, static_cast<uint64_t>(conversation) * kMaxTurns + t, w.question_len, vocab);
    history.insert(history.end(), question.begin(), question.end());
    nlohmann::json request = {{"model", model}, {"prompt", history}, {"max_tokens", w.output_len},
                              {"temperature", w.temperature}, {"ignore_eos", true}, {"stream", true},
                              {"stream_options", {{"include_usage", true}}}};
    if (w.answer_ids == AnswerIds::kReturned) request["return_token_ids"] = true;
    const std::string body = request.dump();
    const RequestResult r = co_await run_request(target, body);
    TurnResult& out = (*turns)[t];
    out.run = true;
    out.ok = r.ok;
    out.error = r.error;
    out.ttft = r.ttft;
    out.e2e = r.e2e;
    out.output_tokens = r.output_tokens;
    out.prompt_tokens = r.prompt_tokens;
    if (r.ok && t + 1 < w.turns && w.answer_ids == AnswerIds::kReturned) {
      // The answer as the engine generated it.
      if (!r.has_token_ids || static_cast<int>(r.token_ids.size()) != r.output_tokens) {
        out.ok = false;
        out.error = !r.has_token_ids ? "the server returned no token_ids (it does not support \"return_token_ids\"; "
                                       "use --answer-ids retokenized)"
                                     : "the server returned " + std::to_string(r.token_ids.size()) + " token_ids for " +
                                           std::to_string(r.output_tokens) + " completion tokens";
      }
      history.insert(history.end(), r.token_ids.begin(), r.token_ids.end());
    } else if (r.ok && t + 1 < w.turns) {
      // The answer as a text client's next request carries it: the server's tokens of its text.
      std::string error;
      const std::vector<int32_t> answer = co_await fetch_tokens(target, model, r.text, &error);
      if (!error.empty()) {
        out.ok = false;
        out.error = error;
      }
      out.retokenized_differently = static_cast<int>(answer.size()) != r.output_tokens;
      history.insert(history.end(), answer.begin(), answer.end());
    }
    on_turn(out);
    if (!out.ok) co_return;  // the conversation cannot go on without its answer
  }
}

// The server's counters that say how much of each prompt was reused: their change over the
// run (gauges: their value at the end). Names with "retain" (retained contexts) are taken
// whatever they are; a server without /metrics gives none.
nlohmann::json server_metrics(const std::map<std::string, double>& before, const std::map<std::string, double>& after) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, value] : after) {
    const bool wanted = name.find("retain") != std::string::npos || name.rfind("prefix_cache_", 0) == 0 ||
                        name == "prompt_tokens_total" || name == "generation_tokens_total" || name == "num_preemptions_total";
    if (!wanted || name == "prefix_cache_hit_rate") continue;
    const auto it = before.find(name);
    j[name] = name.ends_with("_total") && it != before.end() ? value - it->second : value;
  }
  if (j.contains("prefix_cache_queries_total") && j.contains("prefix_cache_hits_total")) {
    const double queries = j["prefix_cache_queries_total"].get<double>();
    j["prefix_cache_hit_rate"] = queries > 0 ? j["prefix_cache_hits_total"].get<double>() / queries : 0.0;
  }
  return j;
}

}  // namespace

std::string check_multiturn_workload(const MultiturnWorkload& w) {
  if (w.conversations < 1 || w.conversations > kMaxConversations)
    return "--conversations must be in [1, " + std::to_string(kMaxConversations) + "], got " + std::to_string(w.conversations);
  if (w.turns < 1 || w.turns > kMaxTurns) return "--turns must be in [1, " + std::to_string(kMaxTurns) + "], got " + std::to_string(w.turns);
  if (w.doc_len < 0 || w.question_len < 1 || w.output_len < 1)
    return "--doc-len must be >= 0, --question-len and --output-len >= 1";
  if (w.num_documents < 1 || w.num_documents > w.conversations)
    return "--num-documents must be in [1, --conversations], got " + std::to_string(w.num_documents);
  if (!(w.think_time >= 0) || w.think_time > 3600) return "--think-time must be in [0, 3600] seconds";
  if (w.max_concurrency < 0) return "--max-concurrency must be >= 0";
  // The last turn's prompt, whose ids are held and sent as JSON: keep it to what a model takes.
  const int64_t longest = static_cast<int64_t>(w.doc_len) + static_cast<int64_t>(w.turns) * (w.question_len + w.output_len);
  if (longest > (int64_t{1} << 24)) return "a conversation of " + std::to_string(longest) + " tokens is beyond any context (2^24)";
  return "";
}

int run_multiturn_bench(const Target& target, const std::string& base_url, const std::string& model, int vocab,
                        const MultiturnWorkload& w, bool json, bool quiet) {
  net::io_context ioc(1);
  std::map<std::string, double> metrics_before, metrics_after;
  net::co_spawn(ioc, [&]() -> net::awaitable<void> { metrics_before = co_await fetch_metrics(target); }, net::detached);
  ioc.run();

  std::vector<std::vector<TurnResult>> results(w.conversations, std::vector<TurnResult>(w.turns));
  const size_t total_turns = static_cast<size_t>(w.conversations) * w.turns;
  size_t done = 0, generated = 0;
  int next = 0;
  ProgressBar bar("bench serve");
  const auto on_turn = [&](const TurnResult& r) {
    ++done;
    generated += r.output_tokens;
    if (!quiet) bar.update(done, total_turns, generated);
  };
  const Clock::time_point start = Clock::now();
  // --max-concurrency workers (one per conversation without a limit), each running whole
  // conversations in order.
  const int workers = w.max_concurrency > 0 ? std::min(w.max_concurrency, w.conversations) : w.conversations;
  for (int k = 0; k < workers; ++k) {
    net::co_spawn(ioc, [&]() -> net::awaitable<void> {
      while (next < w.conversations) {
        const int c = next++;
        co_await run_conversation(target, model, vocab, w, c, &results[c], on_turn);
      }
    }, net::detached);
  }
  ioc.restart();
  ioc.run();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  if (!quiet) bar.finish();
  net::co_spawn(ioc, [&]() -> net::awaitable<void> { metrics_after = co_await fetch_metrics(target); }, net::detached);
  ioc.restart();
  ioc.run();

  std::vector<double> ttft_all, tpot;
  int completed = 0, failed = 0, not_run = 0, retokenized_differently = 0;
  int64_t out_tokens = 0;
  std::string first_error;
  nlohmann::json per_turn = nlohmann::json::array();
  for (int t = 0; t < w.turns; ++t) {
    std::vector<double> ttft;
    double prompt_tokens = 0;
    int turn_failed = 0;
    for (int c = 0; c < w.conversations; ++c) {
      const TurnResult& r = results[c][t];
      if (!r.run) {
        ++not_run;
        continue;
      }
      if (!r.ok) {
        ++turn_failed;
        if (first_error.empty()) first_error = r.error;
        continue;
      }
      ttft.push_back(r.ttft);
      prompt_tokens += r.prompt_tokens;
      out_tokens += r.output_tokens;
      retokenized_differently += r.retokenized_differently;
      if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / (r.output_tokens - 1));
    }
    completed += static_cast<int>(ttft.size());
    failed += turn_failed;
    ttft_all.insert(ttft_all.end(), ttft.begin(), ttft.end());
    per_turn.push_back({{"turn", t + 1},
                        {"completed", ttft.size()},
                        {"failed", turn_failed},
                        {"mean_prompt_tokens", ttft.empty() ? 0.0 : prompt_tokens / ttft.size()},
                        {"mean_ttft_ms", mean_of(ttft) * 1e3},
                        {"median_ttft_ms", percentile_of(ttft, 50) * 1e3},
                        {"p99_ttft_ms", percentile_of(ttft, 99) * 1e3}});
  }
  nlohmann::json j;
  j["workload"] = "multiturn";
  j["temperature"] = w.temperature;
  j["base_url"] = base_url;
  j["model"] = model;
  j["conversations"] = w.conversations;
  j["turns"] = w.turns;
  j["doc_len"] = w.doc_len;
  j["question_len"] = w.question_len;
  j["output_len"] = w.output_len;
  j["think_time"] = w.think_time;
  j["num_documents"] = w.num_documents;
  j["max_concurrency"] = w.max_concurrency;
  j["completed"] = completed;
  j["failed"] = failed;
  j["not_run"] = not_run;  // turns after a failed one of the same conversation
  if (!first_error.empty()) j["first_error"] = first_error;
  j["duration_seconds"] = wall;
  j["request_throughput"] = completed / wall;
  j["output_tokens"] = out_tokens;
  j["output_tokens_per_second"] = out_tokens / wall;
  const bool retokenized = w.answer_ids == AnswerIds::kRetokenized;
  j["answer_ids"] = retokenized ? "retokenized" : "returned";
  // Only retokenized answers can differ from the generated ids (returned ones are them).
  if (retokenized) j["answers_retokenized_differently"] = retokenized_differently;
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<double>*>{"ttft", &ttft_all}, {"tpot", &tpot}}) {
    j[std::string("mean_") + name + "_ms"] = mean_of(*v) * 1e3;
    j[std::string("median_") + name + "_ms"] = percentile_of(*v, 50) * 1e3;
    j[std::string("p99_") + name + "_ms"] = percentile_of(*v, 99) * 1e3;
  }
  j["per_turn"] = per_turn;
  j["server_metrics"] = server_metrics(metrics_before, metrics_after);

  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("========= Multi-turn Serving Benchmark Result =========\n");
    std::printf("%-34s %d x %d turns (%d documents of %d tokens)\n", "Conversations:", w.conversations, w.turns,
                w.num_documents, w.doc_len);
    std::printf("%-34s %d / %d / %d\n", "Turns completed / failed / not run:", completed, failed, not_run);
    if (!first_error.empty()) std::printf("%-34s %s\n", "First error:", first_error.c_str());
    std::printf("%-34s %.2f\n", "Benchmark duration (s):", wall);
    std::printf("%-34s %lld\n", "Total generated tokens:", static_cast<long long>(out_tokens));
    std::printf("%-34s %.2f\n", "Output token throughput (tok/s):", j["output_tokens_per_second"].get<double>());
    std::printf("%-34s %.2f / %.2f / %.2f\n", "TTFT mean / median / p99 (ms):", j["mean_ttft_ms"].get<double>(),
                j["median_ttft_ms"].get<double>(), j["p99_ttft_ms"].get<double>());
    std::printf("%-34s %.2f / %.2f / %.2f\n", "TPOT mean / median / p99 (ms):", j["mean_tpot_ms"].get<double>(),
                j["median_tpot_ms"].get<double>(), j["p99_tpot_ms"].get<double>());
    if (retokenized)
      std::printf("%-34s %d\n", "Answers retokenized differently:", retokenized_differently);
    else
      std::printf("%-34s %s\n", "Answers sent back as:", "the generated ids (return_token_ids)");
    std::printf("%-6s %10s %8s %14s %12s %12s %12s\n", "turn", "completed", "failed", "prompt tokens", "TTFT mean", "TTFT p50",
                "TTFT p99");
    for (const nlohmann::json& t : per_turn)
      std::printf("%-6d %10d %8d %14.0f %9.2f ms %9.2f ms %9.2f ms\n", t["turn"].get<int>(), t["completed"].get<int>(),
                  t["failed"].get<int>(), t["mean_prompt_tokens"].get<double>(), t["mean_ttft_ms"].get<double>(),
                  t["median_ttft_ms"].get<double>(), t["p99_ttft_ms"].get<double>());
    for (const auto& [name, value] : j["server_metrics"].items())
      std::printf("%-34s %g\n", ("server " + name + ":").c_str(), value.get<double>());
    std::printf("=======================================================\n");
  }
  return completed == 0 ? 1 : 0;
}

}  // namespace origami::cli
