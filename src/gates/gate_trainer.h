#pragma once
// Gate training (Fast KVzip §3.3, App. A.2): each layer's gate is fit on its own to the KVzip
// targets of that layer (the maximum attention each KV pair receives while the frozen model
// reconstructs its context) with a binary cross-entropy loss and SGD with momentum, from tuples
// (attention input h, target per KV head) precomputed by forward passes. Layers are independent,
// so they train in parallel, and the result does not depend on the thread count.
#include <cstdint>
#include <functional>
#include <vector>

#include "gates/gate_weights.h"

namespace origami::gates {

// Training tuples: per layer, num_tokens rows of the attention input and of the targets.
struct GateTrainingSet {
  GateShape shape;
  int num_tokens = 0;
  std::vector<std::vector<float>> hidden;   // [layer][token * D + i]
  std::vector<std::vector<float>> targets;  // [layer][token * H + head], each in [0, 1]

  // Appends one document's rows: hidden[l] holds n * D floats and targets[l] n * H, for every l.
  void append(const std::vector<std::vector<float>>& doc_hidden, const std::vector<std::vector<float>>& doc_targets,
              int n);
};

struct GateTrainOptions {
  double learning_rate = 0.2;  // the paper's
  double momentum = 0.9;
  int batch_size = 1024;       // tokens per step (the paper's 1K)
  int epochs = 5;              // the paper's 5 passes over its data
  uint64_t seed = 0;           // the token order of each epoch
  int num_threads = 1;         // layers trained at once
};

struct GateTrainReport {
  int steps_per_layer = 0;
  std::vector<std::vector<double>> epoch_loss;  // [layer][epoch]: mean training BCE of the epoch
};

// Trains `weights` (initialized, of set.shape) in place. `progress(layer, epoch, loss)` is called
// after each layer's epoch (from the training threads, serialized).
GateTrainReport train_gates(const GateTrainingSet& set, const GateTrainOptions& options, GateWeights* weights,
                            const std::function<void(int, int, double)>& progress = {});

// Mean BCE of one layer's gate over the whole set (no gradient): the held-out loss.
double gate_layer_loss(const GateTrainingSet& set, const GateLayer& layer, int layer_index);

}  // namespace origami::gates
