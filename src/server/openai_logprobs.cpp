#include "server/openai_logprobs.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace origami::server {
namespace {

// JSON has no -inf: an impossible token gets vLLM's -9999.0.
nlohmann::json logprob_value(float lp) {
  if (std::isnan(lp)) return nullptr;
  return std::max(lp, -9999.0f);
}

int64_t count_characters(const std::string& utf8) {
  int64_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

void ChoiceLogprobs::add(const std::vector<int32_t>& token_ids, const std::vector<TokenLogprobs>& logprobs) {
  const size_t n = std::min(token_ids.size(), logprobs.size());
  tokens_.insert(tokens_.end(), token_ids.begin(), token_ids.begin() + n);
  logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.begin() + n);
}

nlohmann::json ChoiceLogprobs::take() {
  auto text_of = [&](int32_t id) { return tokenizer_->decode({id}); };
  auto bytes_of = [&](int32_t id) {
    const std::string_view piece = tokenizer_->token_decoder().piece(id);
    nlohmann::json bytes = nlohmann::json::array();
    for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
    return bytes;
  };
  nlohmann::json out;
  if (kind_ == ApiKind::kChat) {
    nlohmann::json content = nlohmann::json::array();
    for (size_t i = 0; i < tokens_.size(); ++i) {
      nlohmann::json top = nlohmann::json::array();
      for (int j = 0; j < std::min<int>(num_top_, static_cast<int>(logprobs_[i].top.size())); ++j) {
        const TopLogprob& t = logprobs_[i].top[j];
        top.push_back({{"token", text_of(t.token)}, {"logprob", logprob_value(t.logprob)}, {"bytes", bytes_of(t.token)}});
      }
      content.push_back({{"token", text_of(tokens_[i])},
                         {"logprob", logprob_value(logprobs_[i].logprob)},
                         {"bytes", bytes_of(tokens_[i])},
                         {"top_logprobs", std::move(top)}});
    }
    out = {{"content", std::move(content)}};
  } else {
    nlohmann::json tokens = nlohmann::json::array(), token_logprobs = nlohmann::json::array(),
                   top_logprobs = nlohmann::json::array(), text_offset = nlohmann::json::array();
    for (size_t i = 0; i < tokens_.size(); ++i) {
      const std::string text = text_of(tokens_[i]);
      nlohmann::json top = nlohmann::json::object();
      for (int j = 0; j < std::min<int>(num_top_, static_cast<int>(logprobs_[i].top.size())); ++j) {
        const TopLogprob& t = logprobs_[i].top[j];
        top[text_of(t.token)] = logprob_value(t.logprob);
      }
      top[text] = logprob_value(logprobs_[i].logprob);  // the chosen token is always listed
      tokens.push_back(text);
      token_logprobs.push_back(logprob_value(logprobs_[i].logprob));
      top_logprobs.push_back(std::move(top));
      text_offset.push_back(text_offset_);
      text_offset_ += count_characters(text);
    }
    out = {{"tokens", std::move(tokens)},
           {"token_logprobs", std::move(token_logprobs)},
           {"top_logprobs", std::move(top_logprobs)},
           {"text_offset", std::move(text_offset)}};
  }
  tokens_.clear();
  logprobs_.clear();
  return out;
}

}  // namespace origami::server
