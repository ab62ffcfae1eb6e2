#pragma once
// What a forward pass computed layer by layer, for the tests that locate where two backends (or
// two tensor-parallel sizes) part: recorded by a backend only while one is attached
// (set_layer_trace; eager steps, never inside a CUDA graph), from the last step it ran.
#include <array>
#include <vector>

namespace origami {

struct LayerTrace {
  // One sublayer's output projection (attention's o, the MLP's down) on one tensor-parallel rank.
  struct Sublayer {
    std::vector<float> partial_exact;  // this rank's partial sum (its heads / MLP columns), fp32 GEMM
    std::vector<float> partial;        // the same as the step used it (bf16)
    std::vector<float> applied;        // what the step added to the residual stream: every rank's sum
  };
  std::vector<float> embedded;                     // the residual stream before layer 0; CUDA backend only
  std::vector<std::vector<float>> residual;        // [layer]: the residual stream after the layer, [tokens x hidden]
  std::vector<std::array<Sublayer, 2>> sublayers;  // [layer]: {attention, MLP}; CUDA backend only
};

}  // namespace origami
