#include "gates/gate_trainer.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>

#include "core/check.h"
#include "gates/sink_attention_gate.h"

namespace origami::gates {

void GateTrainingSet::append(const std::vector<std::vector<float>>& doc_hidden,
                             const std::vector<std::vector<float>>& doc_targets, int n) {
  ORIGAMI_CHECK(static_cast<int>(doc_hidden.size()) == shape.num_layers);
  ORIGAMI_CHECK(static_cast<int>(doc_targets.size()) == shape.num_layers);
  hidden.resize(shape.num_layers);
  targets.resize(shape.num_layers);
  for (int l = 0; l < shape.num_layers; ++l) {
    ORIGAMI_CHECK(doc_hidden[l].size() == static_cast<size_t>(n) * shape.hidden_size);
    ORIGAMI_CHECK(doc_targets[l].size() == static_cast<size_t>(n) * shape.num_kv_heads);
    hidden[l].insert(hidden[l].end(), doc_hidden[l].begin(), doc_hidden[l].end());
    targets[l].insert(targets[l].end(), doc_targets[l].begin(), doc_targets[l].end());
  }
  num_tokens += n;
}

GateTrainReport train_gates(const GateTrainingSet& set, const GateTrainOptions& options, GateWeights* weights,
                            const std::function<void(int, int, double)>& progress) {
  const GateShape& shape = set.shape;
  ORIGAMI_CHECK(weights->shape == shape && static_cast<int>(weights->layers.size()) == shape.num_layers);
  ORIGAMI_CHECK(options.batch_size > 0 && options.epochs > 0 && set.num_tokens > 0);
  const int n = set.num_tokens, D = shape.hidden_size, H = shape.num_kv_heads;
  const int steps_per_epoch = (n + options.batch_size - 1) / options.batch_size;

  // Every layer sees the same token order, drawn once per epoch from the seed.
  std::vector<std::vector<int>> orders(options.epochs, std::vector<int>(n));
  std::mt19937_64 rng(options.seed);
  for (auto& order : orders) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
  }

  GateTrainReport report;
  report.steps_per_layer = steps_per_epoch * options.epochs;
  report.epoch_loss.assign(shape.num_layers, std::vector<double>(options.epochs, 0.0));
  std::mutex progress_mutex;

#pragma omp parallel for schedule(dynamic) num_threads(std::max(1, options.num_threads))
  for (int l = 0; l < shape.num_layers; ++l) {
    GateLayer& layer = weights->layers[l];
    GateLayer grad = zero_gate_layer(shape), velocity = zero_gate_layer(shape);
    std::vector<float> batch_hidden(static_cast<size_t>(options.batch_size) * D);
    std::vector<float> batch_targets(static_cast<size_t>(options.batch_size) * H);
    for (int epoch = 0; epoch < options.epochs; ++epoch) {
      double loss_sum = 0.0;
      for (int step = 0; step < steps_per_epoch; ++step) {
        const int begin = step * options.batch_size;
        const int rows = std::min(options.batch_size, n - begin);
        for (int r = 0; r < rows; ++r) {
          const size_t t = static_cast<size_t>(orders[epoch][begin + r]);
          std::memcpy(&batch_hidden[static_cast<size_t>(r) * D], &set.hidden[l][t * D], D * sizeof(float));
          std::memcpy(&batch_targets[static_cast<size_t>(r) * H], &set.targets[l][t * H], H * sizeof(float));
        }
        for (auto& [name, g] : grad.tensors()) std::fill(g->begin(), g->end(), 0.0f);
        loss_sum += gate_bce_loss(shape, layer, batch_hidden.data(), D, batch_targets.data(), rows, &grad) * rows;
        // SGD with momentum (torch's form: v <- mu v + g, p <- p - lr v), then b >= 0.
        auto params = layer.tensors();
        auto grads = grad.tensors();
        auto vels = velocity.tensors();
        for (size_t k = 0; k < params.size(); ++k) {
          std::vector<float>& p = *params[k].second;
          const std::vector<float>& g = *grads[k].second;
          std::vector<float>& v = *vels[k].second;
          for (size_t i = 0; i < p.size(); ++i) {
            v[i] = static_cast<float>(options.momentum) * v[i] + g[i];
            p[i] -= static_cast<float>(options.learning_rate) * v[i];
          }
        }
        for (float& b : layer.bias) b = std::max(b, 0.0f);
      }
      report.epoch_loss[l][epoch] = loss_sum / n;
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        progress(l, epoch, loss_sum / n);
      }
    }
  }
  return report;
}

double gate_layer_loss(const GateTrainingSet& set, const GateLayer& layer, int layer_index) {
  if (set.num_tokens == 0) return 0.0;
  return gate_bce_loss(set.shape, layer, set.hidden[layer_index].data(), set.shape.hidden_size,
                       set.targets[layer_index].data(), set.num_tokens, nullptr);
}

}  // namespace origami::gates
