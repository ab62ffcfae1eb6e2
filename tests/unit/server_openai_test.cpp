// The server's I/O-free parts: OpenAI request parsing (fields, defaults, errors with their
// param and status) and response assembly from engine outputs (JSON bodies, SSE chunks, usage),
// and the Prometheus rendering of the metrics registry.
#include <gtest/gtest.h>

#include <limits>
#include <mutex>

#include "server/generation_response.h"
#include "server/metrics_registry.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace origami::server {
namespace {

class ServerOpenAITest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::load(std::filesystem::path(ORIGAMI_SHARED_DIR) / "models/origami-tiny-qwen3");
    ASSERT_TRUE(tok.has_value()) << tok.status().to_string();
    tokenizer_ = *tok;
  }
  RequestContext context() {
    if (!builder_) builder_ = std::make_unique<PromptBuilder>(tokenizer_);
    return RequestContext{builder_.get(), &mutex_, "tiny", 64};
  }
  std::optional<ApiError> parse(const std::string& body, ApiKind kind, GenerationRequest* out) {
    return parse_generation_request(nlohmann::json::parse(body), kind, context(), out);
  }
  static inline std::shared_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<PromptBuilder> builder_;
  std::mutex mutex_;
};

TEST_F(ServerOpenAITest, CompletionFieldsAndDefaults) {
  GenerationRequest r;
  ASSERT_FALSE(parse(R"({"model": "tiny", "prompt": ["a b", [5, 6, 7]], "n": 2, "temperature": 0, "stop": "x",
                        "top_k": 3, "kv_policy": "zipage", "kv_budget": 512, "stream": true,
                        "stream_options": {"include_usage": true}})", ApiKind::kCompletion, &r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0], tokenizer_->encode("a b", true));
  EXPECT_EQ(r.prompts[1], (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.sampling.max_tokens, 16);  // OpenAI's completions default
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(r.options.kv_policy, "zipage");
  EXPECT_EQ(r.options.kv_budget, 512);
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_FALSE(r.return_token_ids);
  GenerationRequest ids;
  ASSERT_FALSE(parse(R"({"prompt": "a", "return_token_ids": true})", ApiKind::kCompletion, &ids));
  EXPECT_TRUE(ids.return_token_ids);
}

TEST_F(ServerOpenAITest, ChatDefaultsToTheRestOfTheContext) {
  GenerationRequest r;
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})", ApiKind::kChat, &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.sampling.max_tokens, 64 - static_cast<int>(r.prompts[0].size()));
  GenerationRequest same;
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5})", ApiKind::kChat, &same));
  EXPECT_EQ(same.prompts[0], r.prompts[0]);
  EXPECT_EQ(same.sampling.max_tokens, 5);
}

TEST_F(ServerOpenAITest, ErrorsNameTheFieldAndStatus) {
  struct Case {
    const char* body;
    ApiKind kind;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {R"({"model": "other", "prompt": "a"})", ApiKind::kCompletion, 404, ""},
      {R"({"prompt": 5})", ApiKind::kCompletion, 400, "prompt"},
      {R"({"prompt": []})", ApiKind::kCompletion, 400, "prompt"},
      {R"({})", ApiKind::kCompletion, 400, "prompt"},
      {R"({"prompt": "a", "n": 0})", ApiKind::kCompletion, 400, "n"},
      {R"({"prompt": "a", "logprobs": -1})", ApiKind::kCompletion, 400, "logprobs"},
      {R"({"prompt": "a", "logprobs": 21})", ApiKind::kCompletion, 400, "logprobs"},
      {R"({"prompt": "a", "logprobs": 1.5})", ApiKind::kCompletion, 400, "logprobs"},
      {R"({"prompt": "a", "logprobs": true})", ApiKind::kCompletion, 400, "logprobs"},
      {R"({"prompt": "a", "logprobs": 18446744073709551615})", ApiKind::kCompletion, 400, "logprobs"},
      {R"({"prompt": "a", "top_logprobs": 2})", ApiKind::kCompletion, 400, "top_logprobs"},
      {R"({"prompt": "a", "logprobs": 30, "n": 2, "stream": true})", ApiKind::kCompletion, 400, "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 3})", ApiKind::kChat, 400, "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", ApiKind::kChat, 400, "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": -1})", ApiKind::kChat, 400, "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", ApiKind::kChat, 400, "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false, "top_logprobs": 2, "stream": true})", ApiKind::kChat, 400, "top_logprobs"},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", ApiKind::kCompletion, 400, "stream_options"},
      {R"({"prompt": "a", "presence_penalty": 2.5})", ApiKind::kCompletion, 400, ""},
      {R"({"prompt": "a", "temprature": 0.5})", ApiKind::kCompletion, 400, "temprature"},
      {R"({"prompt": "a", "messages": []})", ApiKind::kCompletion, 400, "messages"},
      {R"({"messages": [{"role": "user", "content": "x"}], "prompt": "a"})", ApiKind::kChat, 400, "prompt"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})", ApiKind::kChat, 400, "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", ApiKind::kChat, 400, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"})", ApiKind::kChat, 400, "tool_choice"},
      {R"({"prompt": "a", "echo": true})", ApiKind::kCompletion, 400, "echo"},
      {R"({"prompt": "a", "suffix": "z"})", ApiKind::kCompletion, 400, "suffix"},
      {R"({"prompt": "a", "guided_json": {}})", ApiKind::kCompletion, 400, "guided_json"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": 5}})", ApiKind::kChat, 400, "response_format"},
      {R"({"prompt": "a", "use_beam_search": true})", ApiKind::kCompletion, 400, "use_beam_search"},
      {R"({"prompt": "a", "return_token_ids": "yes"})", ApiKind::kCompletion, 400, "return_token_ids"},
      {R"({"messages": [{"role": "user", "content": "x"}], "return_token_ids": 1})", ApiKind::kChat, 400, "return_token_ids"},
      {R"({"prompt": "a", "logit_bias": {"x1": 2}})", ApiKind::kCompletion, 400, ""},
      {R"({"prompt": "a", "logit_bias": {"3": 200}})", ApiKind::kCompletion, 400, ""},
      {R"({"prompt": "a", "max_tokens": "many"})", ApiKind::kCompletion, 400, ""},
      {R"({"messages": [{"content": "no role"}]})", ApiKind::kChat, 400, "messages"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", ApiKind::kChat, 400, "messages"},
  };
  for (const Case& c : cases) {
    GenerationRequest r;
    const std::optional<ApiError> e = parse(c.body, c.kind, &r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, c.status) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body;
    EXPECT_FALSE(e->message.empty());
    EXPECT_TRUE(e->to_json()["error"].contains("type"));
  }
  // A prompt that fills the context leaves no room for the completion.
  GenerationRequest r;
  std::vector<int> ids(64, 5);
  auto e = parse_generation_request(nlohmann::json{{"prompt", ids}}, ApiKind::kCompletion, context(), &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("maximum context length is 64"), std::string::npos);
}

TEST_F(ServerOpenAITest, SamplingControlsAndAcceptedFields) {
  GenerationRequest r;
  ASSERT_FALSE(parse(R"({"prompt": "a", "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
                        "min_tokens": 3, "logit_bias": {"7": -100, "12": 2.5}, "user": "u", "echo": false,
                        "suffix": null, "response_format": null, "best_of": 1})",
                     ApiKind::kCompletion, &r));
  EXPECT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(r.sampling.frequency_penalty, -1.0f);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(r.sampling.min_tokens, 3);
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias[0], (std::pair<int32_t, float>{12, 2.5f}));  // object keys in sorted order
  EXPECT_EQ(r.sampling.logit_bias[1], (std::pair<int32_t, float>{7, -100.0f}));
  // Chat: OpenAI fields at their defaults and harmless ones pass.
  ASSERT_FALSE(parse(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"},
                        "tool_choice": "none", "tools": [], "metadata": {"a": "b"}, "store": false,
                        "parallel_tool_calls": true, "modalities": ["text"]})",
                     ApiKind::kChat, &r));
  // A typo names the closest field; a huge unknown name is not echoed whole.
  auto e = parse(R"({"prompt": "a", "temprature": 0.5})", ApiKind::kCompletion, &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->message, "unknown field 'temprature' (did you mean 'temperature'?)");
  e = parse(R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokns": 3})", ApiKind::kChat, &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("did you mean 'max_completion_tokens'?"), std::string::npos) << e->message;
  const std::string huge(5000, 'q');
  e = parse_generation_request(nlohmann::json{{"prompt", "a"}, {huge, 1}}, ApiKind::kCompletion, context(), &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_LT(e->message.size(), 200u);
  EXPECT_EQ(e->message.find("did you mean"), std::string::npos);
}

TEST_F(ServerOpenAITest, LogprobsFieldsOfBothApis) {
  struct Case {
    const char* body;
    ApiKind kind;
    int logprobs;
  };
  const Case cases[] = {
      {R"({"prompt": "a"})", ApiKind::kCompletion, -1},
      {R"({"prompt": "a", "logprobs": null})", ApiKind::kCompletion, -1},
      {R"({"prompt": "a", "logprobs": 0})", ApiKind::kCompletion, 0},
      {R"({"prompt": "a", "logprobs": 5, "n": 2, "stream": true})", ApiKind::kCompletion, 5},
      {R"({"prompt": "a", "logprobs": 20})", ApiKind::kCompletion, 20},
      {R"({"messages": [{"role": "user", "content": "x"}]})", ApiKind::kChat, -1},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false})", ApiKind::kChat, -1},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false, "top_logprobs": 0})", ApiKind::kChat, -1},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})", ApiKind::kChat, 0},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 20, "stream": true})", ApiKind::kChat, 20},
  };
  for (const Case& c : cases) {
    GenerationRequest r;
    const std::optional<ApiError> e = parse(c.body, c.kind, &r);
    ASSERT_FALSE(e.has_value()) << c.body << ": " << e->message;
    EXPECT_EQ(r.options.logprobs, c.logprobs) << c.body;
  }
}

RequestOutput output(std::vector<int32_t> ids, std::string text, FinishReason reason = FinishReason::kNone) {
  RequestOutput o;
  o.new_token_ids = std::move(ids);
  o.new_text = std::move(text);
  o.finished = reason != FinishReason::kNone;
  o.finish_reason = reason;
  return o;
}

std::vector<ChannelEvent> events(int choice, RequestOutput out) {
  std::vector<ChannelEvent> e(1);
  e[0].choice = choice;
  e[0].output = std::move(out);
  return e;
}

TEST_F(ServerOpenAITest, NonStreamingBodyJoinsEachChoice) {
  GenerationRequest r;
  r.kind = ApiKind::kChat;
  r.prompts = {{1, 2, 3}};
  r.n = 2;
  GenerationResponse resp(r, ResponseHeader{ApiKind::kChat, "chatcmpl-1", 7, "tiny"}, tokenizer_.get());
  auto e = events(1, output({4}, "Hel"));
  EXPECT_EQ(resp.consume(e), "");
  e = events(0, output({5, 6}, "ab", FinishReason::kEos));
  resp.consume(e);
  EXPECT_FALSE(resp.done());
  e = events(1, output({7}, "lo", FinishReason::kLength));
  resp.consume(e);
  ASSERT_TRUE(resp.done());
  const nlohmann::json body = resp.body();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "ab");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][1]["message"]["content"], "Hello");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(body["usage"], (nlohmann::json{{"prompt_tokens", 3}, {"completion_tokens", 4}, {"total_tokens", 7}}));
}

TEST_F(ServerOpenAITest, StreamingChunksThenUsageThenDone) {
  GenerationRequest r;
  r.kind = ApiKind::kCompletion;
  r.prompts = {{1, 2}};
  r.stream = true;
  r.include_usage = true;
  GenerationResponse resp(r, ResponseHeader{ApiKind::kCompletion, "cmpl-1", 7, "tiny"}, tokenizer_.get());
  auto e = events(0, output({3}, ""));  // held back (partial character or possible stop)
  EXPECT_EQ(resp.consume(e), "");
  e = events(0, output({4}, "hi"));
  const std::string first = resp.consume(e);
  ASSERT_EQ(first.rfind("data: ", 0), 0u);
  ASSERT_EQ(first.substr(first.size() - 2), "\n\n");
  const nlohmann::json chunk = nlohmann::json::parse(first.substr(6));
  EXPECT_EQ(chunk["choices"][0]["text"], "hi");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk["usage"].is_null());
  e = events(0, output({}, "!", FinishReason::kLength));
  const nlohmann::json last = nlohmann::json::parse(resp.consume(e).substr(6));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  ASSERT_TRUE(resp.done());
  const std::string tail = resp.stream_tail();
  const size_t split = tail.find("\n\n");
  const nlohmann::json usage = nlohmann::json::parse(tail.substr(6, split - 6));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
  EXPECT_EQ(tail.substr(split + 2), "data: [DONE]\n\n");
}

// return_token_ids while streaming: a chunk carries the ids since the choice's previous chunk
// (ids whose text is held back wait for it), its first chunk the ids of its own prompt, and
// together they are all the generated ids; completions put both lists in the choice.
TEST_F(ServerOpenAITest, StreamedTokenIdsFollowTheirText) {
  GenerationRequest r;
  r.kind = ApiKind::kCompletion;
  r.prompts = {{1, 2}, {8, 9, 10}};
  r.n = 2;
  r.stream = true;
  r.return_token_ids = true;
  GenerationResponse resp(r, ResponseHeader{ApiKind::kCompletion, "cmpl-1", 7, "tiny"}, tokenizer_.get());
  auto e = events(2, output({3}, ""));  // held back: so are its ids
  EXPECT_EQ(resp.consume(e), "");
  e = events(2, output({4}, "hi"));
  nlohmann::json chunk = nlohmann::json::parse(resp.consume(e).substr(6));
  EXPECT_EQ(chunk["choices"][0]["index"], 2);
  EXPECT_EQ(chunk["choices"][0]["prompt_token_ids"], (nlohmann::json{8, 9, 10}));  // choice 2: the second prompt
  EXPECT_EQ(chunk["choices"][0]["token_ids"], (nlohmann::json{3, 4}));
  EXPECT_FALSE(chunk.contains("prompt_token_ids"));
  e = events(2, output({5}, "!", FinishReason::kLength));
  chunk = nlohmann::json::parse(resp.consume(e).substr(6));
  EXPECT_FALSE(chunk["choices"][0].contains("prompt_token_ids"));  // once per choice
  EXPECT_EQ(chunk["choices"][0]["token_ids"], (nlohmann::json{5}));
  e = events(1, output({6}, "a", FinishReason::kLength));
  chunk = nlohmann::json::parse(resp.consume(e).substr(6));
  EXPECT_EQ(chunk["choices"][0]["prompt_token_ids"], (nlohmann::json{1, 2}));
  EXPECT_EQ(chunk["choices"][0]["token_ids"], (nlohmann::json{6}));
}

// Chat puts prompt_token_ids beside choices (vLLM's shape): in the role chunk when streaming,
// in the body otherwise, and each choice's token_ids in it.
TEST_F(ServerOpenAITest, ChatTokenIdsBesideChoices) {
  GenerationRequest r;
  r.kind = ApiKind::kChat;
  r.prompts = {{1, 2, 3}};
  r.return_token_ids = true;
  GenerationResponse whole(r, ResponseHeader{ApiKind::kChat, "chatcmpl-1", 7, "tiny"}, tokenizer_.get());
  auto e = events(0, output({4}, ""));
  whole.consume(e);
  e = events(0, output({5, 6}, "abc", FinishReason::kEos));
  whole.consume(e);
  const nlohmann::json body = whole.body();
  EXPECT_EQ(body["prompt_token_ids"], (nlohmann::json{1, 2, 3}));
  EXPECT_EQ(body["choices"][0]["token_ids"], (nlohmann::json{4, 5, 6}));
  EXPECT_FALSE(body["choices"][0].contains("prompt_token_ids"));

  r.stream = true;
  GenerationResponse streamed(r, ResponseHeader{ApiKind::kChat, "chatcmpl-1", 7, "tiny"}, tokenizer_.get());
  e = events(0, output({4}, "a"));
  const std::string sse = streamed.consume(e);
  const size_t split = sse.find("\n\n");
  const nlohmann::json role = nlohmann::json::parse(sse.substr(6, split - 6));
  const nlohmann::json first = nlohmann::json::parse(sse.substr(split + 2 + 6));
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(role["prompt_token_ids"], (nlohmann::json{1, 2, 3}));
  EXPECT_FALSE(first.contains("prompt_token_ids"));
  EXPECT_EQ(first["choices"][0]["token_ids"], (nlohmann::json{4}));

  // Not asked for: neither list.
  r.return_token_ids = false;
  GenerationResponse plain(r, ResponseHeader{ApiKind::kChat, "chatcmpl-1", 7, "tiny"}, tokenizer_.get());
  e = events(0, output({4}, "a", FinishReason::kLength));
  for (const std::string& part : {plain.consume(e)}) EXPECT_EQ(part.find("token_ids"), std::string::npos);
}

RequestOutput with_logprobs(RequestOutput o, std::vector<TokenLogprobs> lp) {
  o.logprobs = std::move(lp);
  return o;
}

// Completions: tokens, their log-probs, a dict of the top N plus the chosen token, character
// offsets; a streamed chunk carries the tokens since the previous chunk (held-back text delays
// them), and offsets keep counting across chunks.
TEST_F(ServerOpenAITest, CompletionLogprobsStreamWithTheirText) {
  const int32_t hello = tokenizer_->encode("Hello", false).at(0), world = tokenizer_->encode(" world", false).at(0);
  const std::string hello_text = tokenizer_->decode({hello}), world_text = tokenizer_->decode({world});
  GenerationRequest r;
  r.kind = ApiKind::kCompletion;
  r.prompts = {{1, 2}};
  r.stream = true;
  r.options.logprobs = 1;
  GenerationResponse resp(r, ResponseHeader{ApiKind::kCompletion, "cmpl-1", 7, "tiny"}, tokenizer_.get());
  auto e = events(0, with_logprobs(output({hello}, ""), {{-0.5f, {{world, -0.25f}}}}));
  EXPECT_EQ(resp.consume(e), "");  // text held back: so are its logprobs
  e = events(0, with_logprobs(output({world}, hello_text + world_text, FinishReason::kLength),
                              {{-std::numeric_limits<float>::infinity(), {{hello, -0.1f}}}}));
  const nlohmann::json chunk = nlohmann::json::parse(resp.consume(e).substr(6));
  const nlohmann::json& lp = chunk["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], (nlohmann::json{hello_text, world_text}));
  EXPECT_EQ(lp["token_logprobs"], (nlohmann::json{-0.5, -9999.0}));
  EXPECT_EQ(lp["top_logprobs"][0], (nlohmann::json{{hello_text, -0.5}, {world_text, -0.25}}));
  EXPECT_EQ(lp["top_logprobs"][1], (nlohmann::json{{hello_text, -0.1f}, {world_text, -9999.0}}));
  EXPECT_EQ(lp["text_offset"], (nlohmann::json{0, hello_text.size()}));
}

// Chat: content entries with token, logprob, bytes and exactly top_logprobs alternatives; the
// non-streaming body carries every token of each choice.
TEST_F(ServerOpenAITest, ChatLogprobsContent) {
  const int32_t hi = tokenizer_->encode("Hi", false).at(0);
  GenerationRequest r;
  r.kind = ApiKind::kChat;
  r.prompts = {{1}};
  r.options.logprobs = 2;
  GenerationResponse resp(r, ResponseHeader{ApiKind::kChat, "chatcmpl-1", 7, "tiny"}, tokenizer_.get());
  auto e = events(0, with_logprobs(output({hi}, "Hi", FinishReason::kLength), {{-1.0f, {{hi, -1.0f}, {5, -2.0f}}}}));
  resp.consume(e);
  ASSERT_TRUE(resp.done());
  const nlohmann::json content = resp.body()["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  const std::string hi_text = tokenizer_->decode({hi});
  EXPECT_EQ(content[0]["token"], hi_text);
  EXPECT_EQ(content[0]["logprob"], -1.0);
  nlohmann::json bytes = nlohmann::json::array();
  for (unsigned char ch : hi_text) bytes.push_back(static_cast<int>(ch));
  EXPECT_EQ(content[0]["bytes"], bytes);
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], tokenizer_->decode({5}));
  EXPECT_EQ(content[0]["top_logprobs"][1]["logprob"], -2.0);
}

TEST_F(ServerOpenAITest, RejectionBecomesA400) {
  GenerationRequest r;
  r.prompts = {{1}};
  GenerationResponse resp(r, ResponseHeader{}, tokenizer_.get());
  std::vector<ChannelEvent> e(1);
  e[0].rejection = "unknown policy 'x'";
  resp.consume(e);
  ASSERT_TRUE(resp.rejection().has_value());
  EXPECT_EQ(resp.rejection()->status, 400);
  EXPECT_EQ(resp.rejection()->message, "unknown policy 'x'");
}

TEST(ServerMetricsTest, PrometheusTextWithCumulativeBuckets) {
  MetricsRegistry m("tiny");
  EngineSnapshot s;
  s.num_running = 3;
  s.kv_blocks_used = 5;
  s.kv_blocks_total = 20;
  s.prefix_cache_queries = 10;
  s.prefix_cache_hits = 4;
  s.metrics.num_generated_tokens = 42;
  m.record_step(s);
  m.record_finished("length", 0.003, 0.5, 11);  // TPOT (0.5 - 0.003) / 10
  m.record_finished("abort", -1, 0.1, 0);
  const std::string text = m.render();
  EXPECT_NE(text.find("origami:num_requests_running{model_name=\"tiny\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("origami:kv_cache_usage_perc{model_name=\"tiny\"} 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("origami:prefix_cache_hit_rate{model_name=\"tiny\"} 0.4\n"), std::string::npos);
  EXPECT_NE(text.find("origami:generation_tokens_total{model_name=\"tiny\"} 42\n"), std::string::npos);
  EXPECT_NE(text.find("origami:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.001\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("origami:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.005\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("origami:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("origami:time_per_output_token_seconds_bucket{model_name=\"tiny\",le=\"0.04\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("origami:time_per_output_token_seconds_bucket{model_name=\"tiny\",le=\"0.05\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("origami:request_success_total{model_name=\"tiny\",finished_reason=\"abort\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("origami:e2e_request_latency_seconds_count{model_name=\"tiny\"} 1\n"), std::string::npos);
}

}  // namespace
}  // namespace origami::server
