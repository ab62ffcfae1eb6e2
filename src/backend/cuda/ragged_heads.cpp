// Device tables of a grouped KV layout and its split maps; see ragged_heads.h.
#include "backend/cuda/ragged_heads.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "kv/split_map.h"

namespace origami::cuda {

RaggedHeadTables::~RaggedHeadTables() { clear(); }

void RaggedHeadTables::clear() {
  if (dev_ != nullptr) cudaFree(dev_);
  dev_ = nullptr;
  num_layers_ = num_kv_heads_ = groups_per_layer_ = max_s_ = 0;
  mean_length_fraction_ = 1.0;
  maps_.clear();
  max_splits_.clear();
  choice_ = SplitMapChoice();
}

Status RaggedHeadTables::build(const KVLayout& layout, int max_uniform_splits, bool use_budgets) {
  const int L = layout.num_layers, H = layout.num_kv_heads, hp = layout.heads_per_group();
  if (!layout.shared_pool || hp <= 0 || H % hp != 0 || layout.num_groups() != L * (H / hp))
    return invalid_argument("ragged paging: the layout is not a grouped one (one layer and H_p heads per group)");
  if (max_uniform_splits < 1) return invalid_argument("ragged paging: max_uniform_splits must be >= 1");
  const int T = H / hp;
  const size_t LH = static_cast<size_t>(L) * H;
  const size_t plain0 = (2 + 2 * static_cast<size_t>(max_uniform_splits)) * LH;  // plain splits' tables
  std::vector<int32_t> host(plain0 + 2 * static_cast<size_t>(max_uniform_splits) * H, -1);
  std::vector<std::vector<double>> weights(L, std::vector<double>(T, 1.0));
  for (int l = 0; l < L; ++l) {
    for (int j = 0; j < T; ++j) {
      const HeadGroup& g = layout.groups[static_cast<size_t>(l * T + j)];
      if (g.layers.size() != 1 || g.layers[0] != l)
        return invalid_argument("ragged paging: group " + std::to_string(l * T + j) + " is not (layer " +
                                std::to_string(l) + ", H_p heads): groups must be numbered layer by layer");
      if (use_budgets) weights[l][j] = g.budget;
      for (size_t s = 0; s < g.kv_heads.size(); ++s) {
        const int h = g.kv_heads[s];
        host[static_cast<size_t>(l) * H + h] = j;
        host[static_cast<size_t>(L + l) * H + h] = static_cast<int32_t>(s);
      }
    }
    for (int h = 0; h < H; ++h)
      if (host[static_cast<size_t>(l) * H + h] < 0)
        return invalid_argument("ragged paging: KV head " + std::to_string(h) + " of layer " + std::to_string(l) +
                                " is in no group");
  }
  double sum = 0, largest_budget = 0;
  for (const auto& layer : weights)
    for (double w : layer) sum += w, largest_budget = std::max(largest_budget, w);
  const double mean_fraction = sum / (static_cast<double>(L) * T) / largest_budget;
  std::vector<std::vector<std::vector<int>>> maps;
  std::vector<int> max_splits;
  for (int s = 1; s <= max_uniform_splits; ++s) {
    auto map = apportion_ctas(weights, s * T);
    if (!map) return invalid_argument("ragged paging: " + map.status().message());
    int largest = 1;
    for (int l = 0; l < L; ++l) {
      int32_t* splits = host.data() + (static_cast<size_t>(2 * L) + static_cast<size_t>(2 * (s - 1)) * L + l) * H;
      int32_t* first = splits + static_cast<size_t>(L) * H;
      int row = 0;
      for (int h = 0; h < H; ++h) {
        splits[h] = (*map)[l][host[static_cast<size_t>(l) * H + h]];
        first[h] = row;
        row += splits[h];
        largest = std::max(largest, splits[h]);
      }
      // apportion_ctas hands out exactly s x T per layer: every layer launches s x H rows.
      if (row != s * H) return internal_error("ragged paging: split map does not sum to s x H");
    }
    maps.push_back(std::move(map).value());
    max_splits.push_back(largest);
    int32_t* plain = host.data() + plain0 + 2 * static_cast<size_t>(s - 1) * H;
    for (int h = 0; h < H; ++h) {
      plain[h] = s;
      plain[H + h] = h * s;
    }
  }
  SplitMapChoice choice(maps);
  int32_t* dev = nullptr;
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMalloc(&dev, host.size() * sizeof(int32_t)));
  const cudaError_t err = cudaMemcpy(dev, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
  if (err != cudaSuccess) {
    cudaFree(dev);
    return cuda_status(err, "ragged paging tables");
  }
  if (dev_ != nullptr) cudaFree(dev_);
  dev_ = dev;
  num_layers_ = L;
  num_kv_heads_ = H;
  groups_per_layer_ = T;
  max_s_ = max_uniform_splits;
  mean_length_fraction_ = mean_fraction;
  maps_ = std::move(maps);
  max_splits_ = std::move(max_splits);
  choice_ = std::move(choice);
  return Status::ok();
}

int RaggedHeadTables::planning_length(int max_kv_len) const {
  if (mean_length_fraction_ >= 1.0) return max_kv_len;
  return std::max(1, static_cast<int>(std::ceil(max_kv_len * mean_length_fraction_)));
}

int RaggedHeadTables::clamp_s(int s) const { return std::clamp(s, 1, max_s_); }

int RaggedHeadTables::max_splits(int uniform_splits, bool split_map) const {
  return split_map ? max_splits_[clamp_s(uniform_splits) - 1] : clamp_s(uniform_splits);
}

const std::vector<std::vector<int>>& RaggedHeadTables::split_map(int uniform_splits) const {
  return maps_[clamp_s(uniform_splits) - 1];
}

RaggedHeads RaggedHeadTables::layer(int layer, int uniform_splits, long long page_stride, bool split_map) const {
  const int s = clamp_s(uniform_splits);
  const size_t LH = static_cast<size_t>(num_layers_) * num_kv_heads_;
  RaggedHeads r;
  r.num_tables = groups_per_layer_;
  r.page_stride = page_stride;
  r.head_table = head_table(layer);
  r.head_slot = head_slot(layer);
  if (split_map) {
    r.head_splits = dev_ + 2 * LH + static_cast<size_t>(2 * (s - 1)) * LH + static_cast<size_t>(layer) * num_kv_heads_;
    r.head_split0 = r.head_splits + LH;
  } else {
    r.head_splits = dev_ + (2 + 2 * static_cast<size_t>(max_s_)) * LH + 2 * static_cast<size_t>(s - 1) * num_kv_heads_;
    r.head_split0 = r.head_splits + num_kv_heads_;
  }
  r.num_work = s * num_kv_heads_;
  r.max_splits = max_splits(s, split_map);
  return r;
}

}  // namespace origami::cuda
