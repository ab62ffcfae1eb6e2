#include "backend/cpu/kvzip_scores.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace origami::cpu {

void accumulate_reconstruction_scores(const ReconstructionLayer& a, float* const* best, ThreadPool* pool) {
  const int d = a.head_dim, group = a.num_heads / a.num_kv_heads, r = a.num_tokens, num_ctx = a.num_context;
  const int q_size = a.num_heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  parallel_for(pool, a.num_kv_heads, [&](int h) {
    std::vector<float> keys(static_cast<size_t>(num_ctx + r) * d);
    for (int i = 0; i < num_ctx; ++i) std::memcpy(&keys[static_cast<size_t>(i) * d], a.context_key(h, i), d * sizeof(float));
    for (int t = 0; t < r; ++t)
      std::memcpy(&keys[static_cast<size_t>(num_ctx + t) * d], a.qkv + static_cast<size_t>(t) * a.qkv_width + q_size + h * d,
                  d * sizeof(float));
    std::vector<float> logits(num_ctx + r);
    float* out = best[h];
    for (int j = 0; j < group; ++j) {
      for (int t = 0; t < r; ++t) {
        const float* q = a.qkv + static_cast<size_t>(t) * a.qkv_width + static_cast<size_t>(h * group + j) * d;
        const int len = num_ctx + t + 1;
        float m = -INFINITY;
        for (int k = 0; k < len; ++k) {
          const float* key = &keys[static_cast<size_t>(k) * d];
          float dot = 0.0f;
          for (int i = 0; i < d; ++i) dot += q[i] * key[i];
          logits[k] = dot * scale;
          m = std::max(m, logits[k]);
        }
        double sum = 0.0;
        for (int k = 0; k < len; ++k) sum += std::exp(static_cast<double>(logits[k] - m));
        for (int k = a.first_scored; k < num_ctx; ++k) {
          const float p = static_cast<float>(std::exp(static_cast<double>(logits[k] - m)) / sum);
          out[k - a.first_scored] = std::max(out[k - a.first_scored], p);
        }
      }
    }
  });
}

}  // namespace origami::cpu
