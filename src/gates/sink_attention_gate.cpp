#include "gates/sink_attention_gate.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace origami::gates {
namespace {

// The dot product of a weight row with a hidden state, vectorized (the projections are the
// gate's whole cost).
double dot(const float* w, const float* h, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += w[i] * h[i];
  return s;
}

// x_hat = x / rms(x), written over `hat`; returns rms(x).
double normalize(const double* x, int n, double* hat) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const double rms = std::sqrt(ss / n + kGateNormEps);
  for (int i = 0; i < n; ++i) hat[i] = x[i] / rms;
  return rms;
}

// One token's forward values, kept for the backward pass.
struct TokenPass {
  std::vector<double> q_raw, k_raw;   // projections
  std::vector<double> q_hat, k_hat;   // normalized, before the norm weights
  std::vector<double> q, k;           // after the norm weights
  std::vector<double> q_rms, k_rms;   // per (h, j) and per h
  std::vector<double> p;              // per (h, j): the query's score
  std::vector<double> sink_share;     // per (h, j, r): exp(sink logit) / denominator
  std::vector<double> bias_share;     // per (h, j): 1 / denominator (in unshifted units)
  std::vector<double> s;              // per h

  explicit TokenPass(const GateShape& g)
      : q_raw(g.q_rows()), k_raw(g.k_rows()), q_hat(g.q_rows()), k_hat(g.k_rows()), q(g.q_rows()), k(g.k_rows()),
        q_rms(static_cast<size_t>(g.num_kv_heads) * g.group_size), k_rms(g.num_kv_heads),
        p(static_cast<size_t>(g.num_kv_heads) * g.group_size),
        sink_share(static_cast<size_t>(g.num_kv_heads) * g.group_size * g.num_sinks),
        bias_share(static_cast<size_t>(g.num_kv_heads) * g.group_size), s(g.num_kv_heads) {}

  void forward(const GateShape& g, const GateLayer& w, const float* h) {
    const int R = g.rank, D = g.hidden_size, S = g.num_sinks, G = g.group_size;
    const double scale = 1.0 / std::sqrt(static_cast<double>(R));
    for (int o = 0; o < g.q_rows(); ++o)
      q_raw[o] = dot(w.q_weight.data() + static_cast<size_t>(o) * D, h, D) + w.q_bias[o];
    for (int o = 0; o < g.k_rows(); ++o) k_raw[o] = dot(w.k_weight.data() + static_cast<size_t>(o) * D, h, D);
    for (int hj = 0; hj < g.num_kv_heads * G; ++hj) {
      q_rms[hj] = normalize(&q_raw[static_cast<size_t>(hj) * R], R, &q_hat[static_cast<size_t>(hj) * R]);
      for (int i = 0; i < R; ++i) q[static_cast<size_t>(hj) * R + i] = q_hat[static_cast<size_t>(hj) * R + i] * w.q_norm[i];
    }
    for (int hd = 0; hd < g.num_kv_heads; ++hd) {
      k_rms[hd] = normalize(&k_raw[static_cast<size_t>(hd) * R], R, &k_hat[static_cast<size_t>(hd) * R]);
      for (int i = 0; i < R; ++i) k[static_cast<size_t>(hd) * R + i] = k_hat[static_cast<size_t>(hd) * R + i] * w.k_norm[i];
    }
    std::vector<double> sink_logit(S);
    for (int hd = 0; hd < g.num_kv_heads; ++hd) {
      const double* kh = &k[static_cast<size_t>(hd) * R];
      double mean = 0.0;
      for (int j = 0; j < G; ++j) {
        const int hj = hd * G + j;
        const double* qj = &q[static_cast<size_t>(hj) * R];
        double logit = 0.0;
        for (int i = 0; i < R; ++i) logit += qj[i] * kh[i];
        logit *= scale;
        double m = logit;
        for (int r = 0; r < S; ++r) {
          const float* sk = w.sink_keys.data() + (static_cast<size_t>(hd) * S + r) * R;
          double l = 0.0;
          for (int i = 0; i < R; ++i) l += qj[i] * sk[i];
          sink_logit[r] = l * scale;
          m = std::max(m, sink_logit[r]);
        }
        // Shifted by the largest logit; the bias term becomes b * exp(-m).
        const double e_self = std::exp(logit - m);
        const double e_bias = w.bias[hj] * std::exp(-m);
        double z = e_self + e_bias;
        for (int r = 0; r < S; ++r) z += std::exp(sink_logit[r] - m);
        p[hj] = e_self / z;
        for (int r = 0; r < S; ++r) sink_share[static_cast<size_t>(hj) * S + r] = std::exp(sink_logit[r] - m) / z;
        bias_share[hj] = std::exp(-m) / z;
        mean += p[hj];
      }
      s[hd] = mean / G;
    }
  }

  // Adds dL/dparams given dL/ds (per head) to `grad`.
  void backward(const GateShape& g, const GateLayer& w, const float* h, const double* ds, GateLayer* grad) {
    const int R = g.rank, D = g.hidden_size, S = g.num_sinks, G = g.group_size;
    const double scale = 1.0 / std::sqrt(static_cast<double>(R));
    std::vector<double> dq(g.q_rows(), 0.0), dk(g.k_rows(), 0.0);
    for (int hd = 0; hd < g.num_kv_heads; ++hd) {
      const double* kh = &k[static_cast<size_t>(hd) * R];
      for (int j = 0; j < G; ++j) {
        const int hj = hd * G + j;
        const double dp = ds[hd] / G;
        const double pj = p[hj];
        const double dlogit = dp * pj * (1.0 - pj) * scale;  // through logit = q.k * scale
        const double* qj = &q[static_cast<size_t>(hj) * R];
        double* dqj = &dq[static_cast<size_t>(hj) * R];
        for (int i = 0; i < R; ++i) {
          dqj[i] += dlogit * kh[i];
          dk[static_cast<size_t>(hd) * R + i] += dlogit * qj[i];
        }
        for (int r = 0; r < S; ++r) {
          const double dsink = -dp * pj * sink_share[static_cast<size_t>(hj) * S + r] * scale;
          const float* sk = w.sink_keys.data() + (static_cast<size_t>(hd) * S + r) * R;
          float* gsk = grad->sink_keys.data() + (static_cast<size_t>(hd) * S + r) * R;
          for (int i = 0; i < R; ++i) {
            dqj[i] += dsink * sk[i];
            gsk[i] += static_cast<float>(dsink * qj[i]);
          }
        }
        grad->bias[hj] += static_cast<float>(-dp * pj * bias_share[hj]);
      }
    }
    // Through the weighted RMSNorms, then the projections.
    auto norm_backward = [&](int rows, const std::vector<double>& hat, const std::vector<double>& rms,
                             const std::vector<float>& weight, std::vector<double>& d, std::vector<float>& gweight) {
      for (int row = 0; row < rows; ++row) {
        double* dr = &d[static_cast<size_t>(row) * R];
        const double* xh = &hat[static_cast<size_t>(row) * R];
        double dot_hat = 0.0;
        for (int i = 0; i < R; ++i) {
          gweight[i] += static_cast<float>(dr[i] * xh[i]);
          dr[i] *= weight[i];
          dot_hat += dr[i] * xh[i];
        }
        for (int i = 0; i < R; ++i) dr[i] = (dr[i] - xh[i] * dot_hat / R) / rms[row];
      }
    };
    norm_backward(g.num_kv_heads * G, q_hat, q_rms, w.q_norm, dq, grad->q_norm);
    norm_backward(g.num_kv_heads, k_hat, k_rms, w.k_norm, dk, grad->k_norm);
    for (int o = 0; o < g.q_rows(); ++o) {
      const float d = static_cast<float>(dq[o]);
      float* row = grad->q_weight.data() + static_cast<size_t>(o) * D;
#pragma omp simd
      for (int i = 0; i < D; ++i) row[i] += d * h[i];
      grad->q_bias[o] += d;
    }
    for (int o = 0; o < g.k_rows(); ++o) {
      const float d = static_cast<float>(dk[o]);
      float* row = grad->k_weight.data() + static_cast<size_t>(o) * D;
#pragma omp simd
      for (int i = 0; i < D; ++i) row[i] += d * h[i];
    }
  }
};

}  // namespace

void gate_scores(const GateShape& shape, const GateLayer& layer, const float* hidden, int num_rows, size_t stride,
                 float* scores) {
  TokenPass pass(shape);
  for (int t = 0; t < num_rows; ++t) {
    pass.forward(shape, layer, hidden + static_cast<size_t>(t) * stride);
    for (int hd = 0; hd < shape.num_kv_heads; ++hd)
      scores[static_cast<size_t>(t) * shape.num_kv_heads + hd] = static_cast<float>(pass.s[hd]);
  }
}

double gate_bce_loss(const GateShape& shape, const GateLayer& layer, const float* hidden, size_t stride,
                     const float* targets, int num_rows, GateLayer* grad) {
  TokenPass pass(shape);
  const int H = shape.num_kv_heads;
  const double count = static_cast<double>(num_rows) * H;
  std::vector<double> ds(H);
  double loss = 0.0;
  for (int t = 0; t < num_rows; ++t) {
    const float* h = hidden + static_cast<size_t>(t) * stride;
    pass.forward(shape, layer, h);
    for (int hd = 0; hd < H; ++hd) {
      const double y = targets[static_cast<size_t>(t) * H + hd];
      const double s = std::clamp(pass.s[hd], kBceEps, 1.0 - kBceEps);
      loss -= y * std::log(s) + (1.0 - y) * std::log(1.0 - s);
      // Zero where the clamp holds the score (its gradient there is 0).
      const bool clamped = pass.s[hd] != s;
      ds[hd] = clamped ? 0.0 : (s - y) / (s * (1.0 - s)) / count;
    }
    if (grad != nullptr) pass.backward(shape, layer, h, ds.data(), grad);
  }
  return loss / count;
}

}  // namespace origami::gates
