#pragma once
// The log-probability of one token under a row of logits (temperature 1, no filters): what
// teacher forcing and perplexity report. Shared by the CPU backend and the GPU kernel's test.
#include <cstdint>

namespace origami {

// log softmax(logits)[token], stable: max-shifted, the sum accumulated in double. NaN logits
// count as -inf. `token` must be in [0, vocab).
float log_softmax_at(const float* logits, int vocab, int32_t token);

}  // namespace origami
