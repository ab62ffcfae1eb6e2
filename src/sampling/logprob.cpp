#include "sampling/logprob.h"

#include <cmath>
#include <limits>

namespace origami {

float log_softmax_at(const float* logits, int vocab, int32_t token) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i]) && logits[i] > max_logit) max_logit = logits[i];
  if (std::isinf(max_logit) && max_logit < 0) return -std::numeric_limits<float>::infinity();
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const float t = std::isnan(logits[token]) ? -std::numeric_limits<float>::infinity() : logits[token];
  return static_cast<float>(static_cast<double>(t) - max_logit - std::log(sum));
}

}  // namespace origami
