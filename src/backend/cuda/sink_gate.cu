// Fast KVzip's sink-attention gates on the CUDA backend; see sink_gate.h.
#include "backend/cuda/sink_gate.h"

#include <cmath>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "core/check.h"
#include "core/dtype.h"
#include "gates/sink_attention_gate.h"

namespace origami::cuda {
namespace {

struct GateKernelArgs {
  const float* proj = nullptr;    // [num_tokens, q_rows + k_rows]
  const float* params = nullptr;  // DeviceSinkGates::Layer::params
  int num_tokens = 0, num_kv_heads = 0, group_size = 0, rank = 0, num_sinks = 0;
  float eps = 0.0f, scale = 0.0f;
  GateScoreDestination dst;
};

// RMSNorm of r values with weight w, in place.
__device__ __forceinline__ void weighted_rms_norm(float* x, const float* w, int r, float eps) {
  float ss = 0.0f;
  for (int i = 0; i < r; ++i) ss = fmaf(x[i], x[i], ss);
  const float inv = 1.0f / sqrtf(ss / r + eps);
  for (int i = 0; i < r; ++i) x[i] = x[i] * inv * w[i];
}

// One thread per (token, KV head): gates::gate_scores' formula in fp32, the softmax over the
// token's own logit, the sinks' and the bias accumulated online (running max).
__global__ void sink_gate_scores_kernel(const GateKernelArgs a) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long long>(a.num_tokens) * a.num_kv_heads) return;
  const int h = static_cast<int>(idx % a.num_kv_heads);
  const long long t = idx / a.num_kv_heads;
  const int R = a.rank, S = a.num_sinks, G = a.group_size, H = a.num_kv_heads;
  const int q_rows = H * G * R;
  const float* q_bias = a.params;
  const float* q_norm = q_bias + q_rows;
  const float* k_norm = q_norm + R;
  const float* all_sinks = k_norm + R;                               // [H, S, R]
  const float* sinks = all_sinks + static_cast<size_t>(h) * S * R;    // this head's [S, R]
  const float* bias = all_sinks + static_cast<size_t>(H) * S * R + h * G;  // this head's [G]
  const float* row = a.proj + t * (q_rows + H * R);

  float k[kMaxDeviceGateRank], q[kMaxDeviceGateRank];
  for (int i = 0; i < R; ++i) k[i] = row[q_rows + h * R + i];
  weighted_rms_norm(k, k_norm, R, a.eps);
  float mean = 0.0f;
  for (int j = 0; j < G; ++j) {
    const int hj = h * G + j;
    for (int i = 0; i < R; ++i) q[i] = row[hj * R + i] + q_bias[hj * R + i];
    weighted_rms_norm(q, q_norm, R, a.eps);
    float self = 0.0f;
    for (int i = 0; i < R; ++i) self = fmaf(q[i], k[i], self);
    self *= a.scale;
    float m = self, z = 1.0f;  // z = sum exp(logit - m) so far
    for (int r = 0; r < S; ++r) {
      float l = 0.0f;
      for (int i = 0; i < R; ++i) l = fmaf(q[i], sinks[r * R + i], l);
      l *= a.scale;
      if (l > m) {
        z = z * expf(m - l) + 1.0f;
        m = l;
      } else {
        z += expf(l - m);
      }
    }
    // b exp(-m) as exp(log b - m): no 0 * inf for a zero bias, no overflow for a very negative m.
    if (bias[j] > 0.0f) z += expf(logf(bias[j]) - m);
    mean += expf(self - m) / z;
  }
  const float s = mean / G;
  if (a.dst.token_scores != nullptr) a.dst.token_scores[t * H + h] = s;
  if (a.dst.f != nullptr) {
    const bool ragged = a.dst.head_table != nullptr;
    const int slot = a.dst.slot_mapping[(ragged ? a.dst.head_table[h] * static_cast<long long>(a.num_tokens) : 0) + t];
    if (slot < 0) return;
    const int in_page = ragged ? a.dst.head_slot[h] : h;
    const long long page = slot / a.dst.block_size;
    a.dst.f[(page * a.dst.page_heads + in_page) * a.dst.block_size + slot % a.dst.block_size] = s;
  }
}

}  // namespace

DeviceSinkGates::~DeviceSinkGates() { release(); }

void DeviceSinkGates::release() {
  for (Layer& l : layers_) {
    if (l.proj != nullptr) cudaFree(l.proj);
    if (l.params != nullptr) cudaFree(l.params);
  }
  layers_.clear();
  if (proj_out_ != nullptr) cudaFree(proj_out_);
  proj_out_ = nullptr;
  capacity_ = 0;
}

Status DeviceSinkGates::load(const gates::GateWeights& g) {
  const gates::GateShape& s = g.shape;
  if (s.rank < 1 || s.rank > kMaxDeviceGateRank)
    return Status(ErrorCode::kUnimplemented, "CUDA gates: rank (D') " + std::to_string(s.rank) +
                                                 " is not supported (1 to " +
                                                 std::to_string(kMaxDeviceGateRank) + " is)");
  if (s.num_sinks < 0 || s.group_size < 1 || static_cast<int>(g.layers.size()) != s.num_layers)
    return invalid_argument("CUDA gates: malformed gate weights (sinks, group size or layer count)");
  release();
  shape_ = s;
  const size_t proj_rows = static_cast<size_t>(s.q_rows()) + s.k_rows();
  for (const gates::GateLayer& gl : g.layers) {
    // The projections as bf16 (the GEMM's operands), everything else as stored.
    std::vector<uint16_t> proj(proj_rows * s.hidden_size);
    for (size_t i = 0; i < gl.q_weight.size(); ++i) proj[i] = f32_to_bf16(gl.q_weight[i]);
    for (size_t i = 0; i < gl.k_weight.size(); ++i) proj[gl.q_weight.size() + i] = f32_to_bf16(gl.k_weight[i]);
    std::vector<float> params;
    for (const std::vector<float>* v : {&gl.q_bias, &gl.q_norm, &gl.k_norm, &gl.sink_keys, &gl.bias})
      params.insert(params.end(), v->begin(), v->end());
    Layer l;
    cudaError_t err = cudaMalloc(&l.proj, proj.size() * sizeof(uint16_t));
    if (err == cudaSuccess) err = cudaMalloc(&l.params, params.size() * sizeof(float));
    if (err == cudaSuccess) err = cudaMemcpy(l.proj, proj.data(), proj.size() * sizeof(uint16_t), cudaMemcpyHostToDevice);
    if (err == cudaSuccess)
      err = cudaMemcpy(l.params, params.data(), params.size() * sizeof(float), cudaMemcpyHostToDevice);
    layers_.push_back(l);  // freed by release() on failure too
    if (err != cudaSuccess) {
      cudaGetLastError();
      release();
      return Status(ErrorCode::kResourceExhausted, std::string("CUDA gates: cannot upload the gate weights (") +
                                                       cudaGetErrorString(err) + ")");
    }
  }
  return Status::ok();
}

Status DeviceSinkGates::reserve(int tokens) {
  if (tokens <= capacity_) return Status::ok();
  if (proj_out_ != nullptr) cudaFree(proj_out_);
  proj_out_ = nullptr;
  capacity_ = 0;
  const size_t bytes = static_cast<size_t>(tokens) * (shape_.q_rows() + shape_.k_rows()) * sizeof(float);
  if (cudaMalloc(&proj_out_, bytes) != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kResourceExhausted, "CUDA gates: out of device memory for the gate projections");
  }
  capacity_ = tokens;
  return Status::ok();
}

void DeviceSinkGates::enqueue(int layer, const __nv_bfloat16* hidden, int num_tokens, const GateScoreDestination& dst,
                              Gemm& gemm, cudaStream_t stream) const {
  ORIGAMI_CHECK_MSG(layer >= 0 && layer < static_cast<int>(layers_.size()) && num_tokens <= capacity_,
                    "CUDA gates: layer or token count out of range");
  if (num_tokens <= 0) return;
  const gates::GateShape& s = shape_;
  const int proj_rows = s.q_rows() + s.k_rows();
  gemm.linear(hidden, num_tokens, s.hidden_size, layers_[layer].proj, proj_rows, proj_out_, true);
  GateKernelArgs a;
  a.proj = proj_out_;
  a.params = layers_[layer].params;
  a.num_tokens = num_tokens;
  a.num_kv_heads = s.num_kv_heads;
  a.group_size = s.group_size;
  a.rank = s.rank;
  a.num_sinks = s.num_sinks;
  a.eps = static_cast<float>(gates::kGateNormEps);
  a.scale = 1.0f / std::sqrt(static_cast<float>(s.rank));
  a.dst = dst;
  const long long threads = static_cast<long long>(num_tokens) * s.num_kv_heads;
  constexpr int kThreads = 128;
  sink_gate_scores_kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(a);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
