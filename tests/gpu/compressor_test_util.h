#pragma once
// The CudaCompressor set-up the compression tests share: the one-group layout's geometry over a
// paged K / V [L, NB, H, bs, d] and a compression config.
#include <cuda_bf16.h>

#include <cstddef>

#include "backend/cuda/cuda_compression.h"

namespace origami::cuda::testing {

inline CudaCompressor::Geometry one_group_geometry(int L, int H, int G, int d, int bs, int NB, __nv_bfloat16* k,
                                                   __nv_bfloat16* v, size_t kv_layer_pitch) {
  CudaCompressor::Geometry g;
  g.num_layers = L;
  g.num_kv_heads = H;
  g.num_q_heads = H * G;
  g.head_dim = d;
  g.block_size = bs;
  g.num_blocks = NB;
  g.k = k;
  g.v = v;
  g.kv_layer_pitch = kv_layer_pitch;
  return g;
}

inline CompressionConfig compression_config(int num_query_slots, int max_window, bool global_scores,
                                            int layer_stride) {
  CompressionConfig config;
  config.num_query_slots = num_query_slots;
  config.max_window = max_window;
  config.global_scores = global_scores;
  config.layer_stride = layer_stride;
  return config;
}

}  // namespace origami::cuda::testing
