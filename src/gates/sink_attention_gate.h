#pragma once
// Fast KVzip's sink-attention gate (§3.4, eq. in Fig. 8) for one layer, forward and backward:
//
//   q_hj = q_norm * rms(W_q h + b_q)_hj   (R values per KV head h and query j of its group)
//   k_h  = k_norm * rms(W_k h)_h
//   s_h  = 1/G sum_j exp(q_hj.k_h / sqrt(R)) /
//                    (exp(q_hj.k_h / sqrt(R)) + sum_r exp(q_hj.sink_hr / sqrt(R)) + b_hj)
//
// The 1/sqrt(R) is attention's usual scale (as in the reference implementation); it only
// reparametrizes the norm weights, so the function class is the paper's. b >= 0 is kept by the
// optimizer (gate_trainer.h). The backward is hand-written (the gate is small) and checked
// against finite differences (tests/unit/gates_sink_attention_gate_test.cpp), so training needs
// nothing beyond the build. Internals run in double: scores near 0 or 1 keep their gradients.
#include "gates/gate_weights.h"

namespace origami::gates {

inline constexpr double kGateNormEps = 1e-6;  // the RMSNorm epsilon (Qwen3RMSNorm's default)
// BCE clamps scores into [eps, 1 - eps] so that a saturated score has a finite loss.
inline constexpr double kBceEps = 1e-7;

// Scores of `num_rows` hidden states ([num_rows, D], row stride `stride`), written to
// scores[row * H + head].
void gate_scores(const GateShape& shape, const GateLayer& layer, const float* hidden, int num_rows, size_t stride,
                 float* scores);

// Mean binary cross-entropy over rows and heads of the gate's scores against `targets`
// ([num_rows, H], each in [0, 1]); when `grad` is given (a layer of the same sizes) the gradient of
// that mean is added to it. Returns the mean loss.
double gate_bce_loss(const GateShape& shape, const GateLayer& layer, const float* hidden, size_t stride,
                     const float* targets, int num_rows, GateLayer* grad);

}  // namespace origami::gates
