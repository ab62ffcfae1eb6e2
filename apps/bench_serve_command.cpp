// `origami bench serve`: an online serving benchmark in the manner of vLLM's
// benchmark_serving.py. It sends --num-prompts streaming completions of random token-id prompts
// (the same prompts `origami bench` draws for the same --dataset-seed) to a running server,
// arriving as a Poisson process of --request-rate (inf: all at once) with at most
// --max-concurrency in flight, and reports request throughput, output tokens/s, TTFT, TPOT and
// ITL (mean, median, p99) and failed requests. The client is Boost.Beast on one thread.
// --multiturn runs conversations instead (bench_serve_multiturn.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <utility>  // Boost 1.74 awaitable.hpp uses std::exchange without including it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "latency_stats.h"
#include "progress_bar.h"
#include "bench_serve_multiturn.h"
#include "serve_client.h"

namespace origami::cli {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

struct BenchServeFlags {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;  // default: the server's first model
  int num_prompts = 64;
  int input_len = 128;
  int output_len = 128;
  double request_rate = std::numeric_limits<double>::infinity();
  int max_concurrency = 0;  // 0: no limit
  uint64_t dataset_seed = 0;
  int vocab_size = 0;  // 0: the server's (model card "vocab_size")
  uint64_t arrival_seed = 0;
  bool json = false;
  bool quiet = false;
  bool multiturn = false;
  MultiturnWorkload turns;
  std::string answer_ids = "returned";  // --answer-ids (checked by the parser)
  double temperature = 0.0;  // --temperature of every request (0: greedy)
  // The flags of the single-turn workload that were given (refused with --multiturn).
  std::vector<std::string> single_turn_flags_given;
};

int run_bench_serve(const BenchServeFlags& f) {
  Target target;
  if (!parse_base_url(f.base_url, &target)) {
    print_error("--base-url must look like http://HOST:PORT, got '" + f.base_url + "'");
    return 2;
  }
  if (f.multiturn && !f.single_turn_flags_given.empty()) {
    print_error(f.single_turn_flags_given.front() + " does not apply to --multiturn (see --conversations, --turns, --doc-len)");
    return 2;
  }
  MultiturnWorkload turns = f.turns;
  turns.output_len = f.output_len;
  turns.max_concurrency = f.max_concurrency;
  turns.seed = f.dataset_seed;
  turns.answer_ids = f.answer_ids == "retokenized" ? AnswerIds::kRetokenized : AnswerIds::kReturned;
  turns.temperature = f.temperature;
  // The server's own check of a request's temperature (SamplingParams::validate, on the float it
  // parses: a double beyond float's range is inf there), made here once, not on every request.
  SamplingParams sampling;
  sampling.temperature = static_cast<float>(f.temperature);
  if (Status st = sampling.validate(); !st.is_ok()) {
    print_error("--temperature must be one the server takes: " + st.message());
    return 2;
  }
  if (f.multiturn) {
    if (const std::string e = check_multiturn_workload(turns); !e.empty()) {
      print_error(e);
      return 2;
    }
  }
  if (f.num_prompts < 1 || f.input_len < 1 || f.output_len < 1 || f.max_concurrency < 0 || !(f.request_rate > 0)) {
    print_error("--num-prompts, --input-len, --output-len and --request-rate must be positive, --max-concurrency >= 0");
    return 2;
  }
  net::io_context ioc(1);
  std::string model = f.model, error;
  int vocab = f.vocab_size;
  net::co_spawn(ioc, fetch_model(target, &model, &vocab, &error), net::detached);
  ioc.run();
  if (!error.empty() || vocab <= 0) {
    print_error(!error.empty() ? error : "the server does not say its vocab_size; pass --vocab-size");
    return 1;
  }
  if (f.multiturn) return run_multiturn_bench(target, f.base_url, model, vocab, turns, f.json, f.quiet);

  // The prompts `origami bench` draws (same generator, same order), greedy unless --temperature,
  // exactly output_len tokens each (ignore_eos).
  std::mt19937_64 rng(f.dataset_seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<std::string> bodies(f.num_prompts);
  for (auto& body : bodies) {
    std::vector<int32_t> ids(f.input_len);
    for (auto& t : ids) t = token(rng);
    body = nlohmann::json{{"model", model}, {"prompt", ids}, {"max_tokens", f.output_len}, {"temperature", f.temperature},
                          {"ignore_eos", true}, {"stream", true}, {"stream_options", {{"include_usage", true}}}}.dump();
  }
  // Poisson arrivals: exponential gaps of mean 1/rate (all at t = 0 when the rate is inf).
  std::vector<double> arrival(f.num_prompts, 0.0);
  if (std::isfinite(f.request_rate)) {
    std::mt19937_64 arng(f.arrival_seed);
    std::exponential_distribution<double> gap(f.request_rate);
    double t = 0.0;
    for (double& a : arrival) a = (t += gap(arng));
  }

  std::vector<RequestResult> results(f.num_prompts);
  size_t next = 0, done = 0;
  int64_t generated = 0;
  ProgressBar bar("bench serve");
  const Clock::time_point start = Clock::now();
  // --max-concurrency workers (one per request without a limit) take requests in arrival order.
  const int workers = f.max_concurrency > 0 ? std::min(f.max_concurrency, f.num_prompts) : f.num_prompts;
  for (int w = 0; w < workers; ++w) {
    net::co_spawn(ioc, [&]() -> net::awaitable<void> {
      net::steady_timer timer(co_await net::this_coro::executor);
      while (next < bodies.size()) {
        const size_t i = next++;
        timer.expires_at(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival[i])));
        beast::error_code ec;
        co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
        results[i] = co_await run_request(target, bodies[i]);
        generated += results[i].output_tokens;
        ++done;
        if (!f.quiet) bar.update(done, bodies.size(), generated);
      }
    }, net::detached);
  }
  ioc.restart();
  ioc.run();
  if (!f.quiet) bar.finish();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> ttft, tpot, itl, e2e;
  int failed = 0;
  int64_t out_tokens = 0;
  std::string first_error;
  for (const RequestResult& r : results) {
    if (!r.ok) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    out_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / (r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  const int completed = f.num_prompts - failed;
  nlohmann::json j;
  j["base_url"] = f.base_url;
  j["model"] = model;
  j["num_prompts"] = f.num_prompts;
  j["input_len"] = f.input_len;
  j["output_len"] = f.output_len;
  j["temperature"] = f.temperature;
  j["request_rate"] = std::isfinite(f.request_rate) ? nlohmann::json(f.request_rate) : nlohmann::json("inf");
  j["max_concurrency"] = f.max_concurrency;
  j["completed"] = completed;
  j["failed"] = failed;
  if (!first_error.empty()) j["first_error"] = first_error;
  j["duration_seconds"] = wall;
  j["request_throughput"] = completed / wall;
  j["output_tokens"] = out_tokens;
  j["output_tokens_per_second"] = out_tokens / wall;
  j["total_tokens_per_second"] = (out_tokens + static_cast<int64_t>(completed) * f.input_len) / wall;
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<double>*>{"ttft", &ttft}, {"tpot", &tpot}, {"itl", &itl}, {"e2el", &e2e}}) {
    j[std::string("mean_") + name + "_ms"] = mean_of(*v) * 1e3;
    j[std::string("median_") + name + "_ms"] = percentile_of(*v, 50) * 1e3;
    j[std::string("p99_") + name + "_ms"] = percentile_of(*v, 99) * 1e3;
  }
  if (f.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("============ Serving Benchmark Result ============\n");
    std::printf("%-34s %d\n", "Successful requests:", completed);
    std::printf("%-34s %d\n", "Failed requests:", failed);
    if (!first_error.empty()) std::printf("%-34s %s\n", "First error:", first_error.c_str());
    std::printf("%-34s %s\n", "Request rate (req/s):", j["request_rate"].dump().c_str());
    std::printf("%-34s %d\n", "Max concurrency:", f.max_concurrency);
    std::printf("%-34s %.2f\n", "Benchmark duration (s):", wall);
    std::printf("%-34s %lld\n", "Total generated tokens:", static_cast<long long>(out_tokens));
    std::printf("%-34s %.2f\n", "Request throughput (req/s):", j["request_throughput"].get<double>());
    std::printf("%-34s %.2f\n", "Output token throughput (tok/s):", j["output_tokens_per_second"].get<double>());
    std::printf("%-34s %.2f\n", "Total token throughput (tok/s):", j["total_tokens_per_second"].get<double>());
    for (const char* name : {"ttft", "tpot", "itl", "e2el"}) {
      std::printf("%-34s %.2f\n", (std::string("Mean ") + name + " (ms):").c_str(), j[std::string("mean_") + name + "_ms"].get<double>());
      std::printf("%-34s %.2f\n", (std::string("Median ") + name + " (ms):").c_str(), j[std::string("median_") + name + "_ms"].get<double>());
      std::printf("%-34s %.2f\n", (std::string("P99 ") + name + " (ms):").c_str(), j[std::string("p99_") + name + "_ms"].get<double>());
    }
    std::printf("==================================================\n");
  }
  return failed == f.num_prompts ? 1 : 0;
}

}  // namespace

void register_bench_serve_command(CLI::App& bench) {
  auto flags = std::make_shared<BenchServeFlags>();
  CLI::App* cmd = bench.add_subcommand("serve", "Online benchmark of a running `origami serve` (or any OpenAI-compatible server)");
  cmd->add_option("--base-url", flags->base_url, "The server, http://HOST:PORT")->capture_default_str();
  cmd->add_option("--model", flags->model, "Model name to send (default: the server's)");
  cmd->add_option("--num-prompts", flags->num_prompts, "Number of requests")->capture_default_str();
  cmd->add_option("--input-len", flags->input_len, "Prompt length (random token ids, as `origami bench`)")->capture_default_str();
  cmd->add_option("--output-len", flags->output_len, "Tokens generated per request (ignore_eos)")->capture_default_str();
  cmd->add_option("--request-rate", flags->request_rate, "Requests per second, Poisson arrivals (inf: all at once)");
  cmd->add_option("--max-concurrency", flags->max_concurrency, "Most requests in flight (0: no limit)")->capture_default_str();
  cmd->add_option("--dataset-seed", flags->dataset_seed, "Seed of the random prompts (as `origami bench`)");
  cmd->add_option("--arrival-seed", flags->arrival_seed, "Seed of the Poisson arrivals");
  cmd->add_option("--vocab-size", flags->vocab_size, "Token ids are drawn below this (default: the server's vocab_size)");
  cmd->add_flag("--multiturn", flags->multiturn,
                "Conversations over shared documents, each turn sent with the whole conversation after the previous answer");
  cmd->add_option("--conversations", flags->turns.conversations, "--multiturn: number of conversations")->capture_default_str();
  cmd->add_option("--turns", flags->turns.turns, "--multiturn: questions per conversation")->capture_default_str();
  cmd->add_option("--doc-len", flags->turns.doc_len, "--multiturn: document length (random tokens)")->capture_default_str();
  cmd->add_option("--question-len", flags->turns.question_len, "--multiturn: question length (random tokens)")->capture_default_str();
  cmd->add_option("--think-time", flags->turns.think_time, "--multiturn: seconds between an answer and the next question")
      ->capture_default_str();
  cmd->add_option("--num-documents", flags->turns.num_documents,
                  "--multiturn: distinct documents; conversation c uses document c mod N")->capture_default_str();
  cmd->add_option("--answer-ids", flags->answer_ids,
                  "--multiturn: how an answer joins the next turn's prompt: returned (the generated ids, through the "
                  "request field return_token_ids) or retokenized (the server's /tokenize of its text, as a text "
                  "client resends it)")
      ->check(CLI::IsMember({"returned", "retokenized"}))
      ->capture_default_str();
  cmd->add_option("--temperature", flags->temperature, "Sampling temperature of every request (0 = greedy)")
      ->capture_default_str();
  cmd->add_flag("--json", flags->json, "Print the results as one JSON object");
  cmd->add_flag("--quiet", flags->quiet, "No progress bar");
  // `bench` runs its own (offline) benchmark when its callback runs; ending the parse here with
  // the exit code keeps it from running after `bench serve`.
  cmd->callback([flags, cmd] {
    for (const char* name : {"--num-prompts", "--input-len", "--request-rate", "--arrival-seed"})
      if (cmd->count(name) > 0) flags->single_turn_flags_given.emplace_back(name);
    const int code = run_bench_serve(*flags);
    if (code != 0) throw CLI::RuntimeError(code);
    throw CLI::Success();
  });
}

}  // namespace origami::cli
