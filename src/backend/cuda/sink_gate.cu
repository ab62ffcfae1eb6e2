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

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// x (lane i holds element i < r, 0 elsewhere) -> x / rms(x) * w, in the same lanes.
__device__ __forceinline__ float weighted_rms_norm(float x, const float* w, int r, float eps, int lane) {
  const float ss = warp_sum(x * x);
  return lane < r ? x * (1.0f / sqrtf(ss / r + eps)) * w[lane] : 0.0f;
}

// One warp per (token, KV head): gates::gate_scores' formula in fp32. Lane i holds element i of
// the key and of the current query (rank <= 32); each lane scores sinks lane, lane + 32, ... and
// keeps their running max and exp-sum, which the warp then merges with the token's own logit
// and the bias. A thread per (token, head) doing it all serially was latency-bound (~50 us per
// layer at any token count on an H100).
__global__ void __launch_bounds__(kWarpsPerBlock * 32) sink_gate_scores_kernel(const GateKernelArgs a) {
  const int lane = threadIdx.x & 31;
  const long long w = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (w >= static_cast<long long>(a.num_tokens) * a.num_kv_heads) return;  // whole warps leave
  const int h = static_cast<int>(w % a.num_kv_heads);
  const long long t = w / a.num_kv_heads;
  const int R = a.rank, S = a.num_sinks, G = a.group_size, H = a.num_kv_heads;
  const int q_rows = H * G * R;
  const float* q_bias = a.params;
  const float* q_norm = q_bias + q_rows;
  const float* k_norm = q_norm + R;
  const float* all_sinks = k_norm + R;                                     // [H, S, R]
  const float* sinks = all_sinks + static_cast<size_t>(h) * S * R;         // this head's [S, R]
  const float* bias = all_sinks + static_cast<size_t>(H) * S * R + h * G;  // this head's [G]
  const float* row = a.proj + t * (q_rows + H * R);

  const float k = weighted_rms_norm(lane < R ? row[q_rows + h * R + lane] : 0.0f, k_norm, R, a.eps, lane);
  float mean = 0.0f;
  for (int j = 0; j < G; ++j) {
    const int hj = h * G + j;
    const float q = weighted_rms_norm(lane < R ? row[hj * R + lane] + q_bias[hj * R + lane] : 0.0f, q_norm, R,
                                      a.eps, lane);
    const float self = warp_sum(q * k) * a.scale;
    float qv[kMaxDeviceGateRank];  // the whole query in every lane (constant indices: registers)
#pragma unroll
    for (int i = 0; i < kMaxDeviceGateRank; ++i) qv[i] = i < R ? __shfl_sync(kFullMask, q, i) : 0.0f;
    float m = -INFINITY, z = 0.0f;  // this lane's sinks: max logit, sum of exp(logit - m)
    for (int r = lane; r < S; r += 32) {
      const float* sk = sinks + static_cast<size_t>(r) * R;
      float l = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxDeviceGateRank; ++i)
        if (i < R) l = fmaf(qv[i], sk[i], l);
      l *= a.scale;
      if (l > m) {
        z = z * expf(m - l) + 1.0f;
        m = l;
      } else {
        z += expf(l - m);
      }
    }
    const float mx = fmaxf(self, warp_max(m));
    float zsum = warp_sum(z > 0.0f ? z * expf(m - mx) : 0.0f) + expf(self - mx);
    // b exp(-m) as exp(log b - m): no 0 * inf for a zero bias, no overflow for a very negative m.
    if (bias[j] > 0.0f) zsum += expf(logf(bias[j]) - mx);
    mean += expf(self - mx) / zsum;
  }
  if (lane != 0) return;
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
  const long long warps = static_cast<long long>(num_tokens) * s.num_kv_heads;
  sink_gate_scores_kernel<<<static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                            stream>>>(a);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
