#include "server/generation_response.h"

namespace origami::server {

std::string sse_event(const nlohmann::json& payload) {
  return "data: " + payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

GenerationResponse::GenerationResponse(const GenerationRequest& request, ResponseHeader header,
                                       const Tokenizer* tokenizer)
    : request_(request), header_(std::move(header)), choices_(request.prompts.size() * request.n) {
  if (request.options.logprobs >= 0)
    for (Choice& c : choices_) c.logprobs.emplace(request.kind, request.options.logprobs, tokenizer);
  for (const auto& p : request.prompts) prompt_tokens_ += static_cast<int64_t>(p.size());  // once per prompt, as vLLM
}

nlohmann::json GenerationResponse::usage() const {
  int64_t completion = 0;
  for (const Choice& c : choices_) completion += c.num_tokens;
  return usage_json(prompt_tokens_, completion);
}

std::string GenerationResponse::consume(std::vector<ChannelEvent>& events) {
  std::string sse;
  for (ChannelEvent& e : events) {
    if (!e.rejection.empty()) {
      rejection_ = ApiError::bad_request(e.rejection);
      continue;
    }
    if (e.choice < 0 || e.choice >= static_cast<int>(choices_.size())) continue;
    Choice& c = choices_[e.choice];
    const RequestOutput& out = e.output;
    c.num_tokens += static_cast<int>(out.new_token_ids.size());
    if (request_.return_token_ids) c.token_ids.insert(c.token_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    if (c.logprobs) c.logprobs->add(out.new_token_ids, out.logprobs);
    std::string finish;
    if (out.finished) {
      ++num_finished_;
      finish = finish_reason_name(out.finish_reason);
      c.finish_reason = finish;
      if (out.finish_reason == FinishReason::kError && !failure_)
        failure_ = ApiError{500, out.error.empty() ? "the engine failed this request" : out.error, "server_error", "", "engine_error"};
    }
    if (!request_.stream) {
      c.text += out.new_text;
      continue;
    }
    if (header_.kind == ApiKind::kChat && !c.opened) {
      nlohmann::json role = chunk_json(header_, e.choice, "", "", /*role_only=*/true);
      if (request_.return_token_ids) {
        role["prompt_token_ids"] = prompt_of(e.choice);
        c.prompt_ids_sent = true;
      }
      sse += sse_event(role);
      c.opened = true;
    }
    if (out.new_text.empty() && !out.finished) continue;  // text held back (partial UTF-8, possible stop)
    nlohmann::json logprobs = c.logprobs ? c.logprobs->take() : nlohmann::json(nullptr);
    nlohmann::json chunk = chunk_json(header_, e.choice, out.new_text, finish, /*role_only=*/false, std::move(logprobs));
    if (request_.return_token_ids) add_chunk_token_ids(e.choice, &chunk);
    if (request_.include_usage) chunk["usage"] = request_.continuous_usage ? usage() : nlohmann::json(nullptr);
    sse += sse_event(chunk);
    if (out.finish_reason == FinishReason::kError) sse += sse_event(failure_->to_json());
  }
  return sse;
}

nlohmann::json GenerationResponse::body() {
  nlohmann::json choices = nlohmann::json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    nlohmann::json choice = choice_json(header_.kind, static_cast<int>(i), c.text, c.finish_reason,
                                        c.logprobs ? c.logprobs->take() : nlohmann::json(nullptr));
    if (request_.return_token_ids) {
      choice["token_ids"] = c.token_ids;
      if (header_.kind == ApiKind::kCompletion) choice["prompt_token_ids"] = prompt_of(static_cast<int>(i));
    }
    choices.push_back(std::move(choice));
  }
  nlohmann::json body = response_json(header_, std::move(choices), usage());
  if (request_.return_token_ids && header_.kind == ApiKind::kChat) body["prompt_token_ids"] = request_.prompts.front();
  return body;
}

void GenerationResponse::add_chunk_token_ids(int choice, nlohmann::json* chunk) {
  Choice& c = choices_[choice];
  nlohmann::json& target = header_.kind == ApiKind::kChat ? *chunk : (*chunk)["choices"][0];
  if (!c.prompt_ids_sent) {
    target["prompt_token_ids"] = prompt_of(choice);
    c.prompt_ids_sent = true;
  }
  (*chunk)["choices"][0]["token_ids"] = std::move(c.token_ids);
  c.token_ids.clear();
}

std::string GenerationResponse::stream_tail() const {
  std::string sse;
  if (request_.include_usage) sse += sse_event(usage_chunk_json(header_, usage()));
  sse += sse_done();
  return sse;
}

}  // namespace origami::server
