#include "sampling/logprob.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace origami {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float clean(float x) { return std::isnan(x) ? kNegInf : x; }

// max and sum(exp(x - max)) of a row (NaN as -inf); max = -inf for a row without a finite value
// above -inf.
struct Normalizer {
  float max_logit = kNegInf;
  double sum = 0.0;
  float logprob(float logit) const {
    if (max_logit == kNegInf) return kNegInf;
    return static_cast<float>(static_cast<double>(clean(logit)) - max_logit - std::log(sum));
  }
};

Normalizer normalizer(const float* logits, int vocab) {
  Normalizer n;
  for (int i = 0; i < vocab; ++i) n.max_logit = std::max(n.max_logit, clean(logits[i]));
  if (n.max_logit == kNegInf) return n;
  for (int i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) n.sum += std::exp(static_cast<double>(logits[i]) - n.max_logit);
  return n;
}

}  // namespace

float log_softmax_at(const float* logits, int vocab, int32_t token) {
  return normalizer(logits, vocab).logprob(logits[token]);
}

TokenLogprobs token_logprobs(const float* logits, int vocab, int32_t token, int num_top) {
  TokenLogprobs out;
  const Normalizer n = normalizer(logits, vocab);
  out.logprob = token >= 0 && token < vocab ? n.logprob(logits[token]) : std::numeric_limits<float>::quiet_NaN();
  const int k = std::clamp(num_top, 0, std::min(vocab, kMaxTopLogprobs));
  if (k == 0) return out;
  // A bounded selection: keep the k best (logit desc, id asc) seen so far, sorted.
  std::vector<TopLogprob> best;  // logprob holds the cleaned logit until the end
  best.reserve(k + 1);
  auto before = [](const TopLogprob& a, const TopLogprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
  };
  for (int i = 0; i < vocab; ++i) {
    const TopLogprob c{i, clean(logits[i])};
    if (static_cast<int>(best.size()) == k && !before(c, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), c, before), c);
    if (static_cast<int>(best.size()) > k) best.pop_back();
  }
  for (TopLogprob& t : best) t.logprob = n.logprob(t.logprob);
  out.top = std::move(best);
  return out;
}

}  // namespace origami
