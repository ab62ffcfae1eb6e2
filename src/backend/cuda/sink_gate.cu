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
constexpr size_t kMaxSinkBytes = 48 * 1024;  // every head's sink keys, in shared memory
constexpr int kThreads = 256;

// x[0..r) -> x / rms(x) * w, in registers (loops unrolled to the largest rank, so x stays in
// registers whatever r is).
__device__ __forceinline__ void weighted_rms_norm(float (&x)[kMaxDeviceGateRank], const float* w, int r, float eps) {
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxDeviceGateRank; ++i)
    if (i < r) ss = fmaf(x[i], x[i], ss);
  const float inv = 1.0f / sqrtf(ss / r + eps);
#pragma unroll
  for (int i = 0; i < kMaxDeviceGateRank; ++i)
    if (i < r) x[i] = x[i] * inv * w[i];
}

// One thread per (token, query head): gates::gate_scores' formula in fp32. The G threads of a KV
// head are consecutive lanes (G padded to a power of two, group_pow2), and the head's score, the
// mean of their shares, is summed by shuffles within them. The query and the key live in
// registers; every head's sink keys are staged in shared memory. (A thread per (token, KV head)
// doing its G queries in turn, with the vectors in local memory, took ~50 us a layer at any token
// count on an H100; a warp per (token, KV head) with a lane per vector element spent its time in
// shuffles at prefill sizes.)
__global__ void __launch_bounds__(kThreads) sink_gate_scores_kernel(const GateKernelArgs a, int group_pow2) {
  extern __shared__ float sink_smem[];  // [H, S * R + 1]: +1 so that the heads of a warp read distinct banks
  const int R = a.rank, S = a.num_sinks, G = a.group_size, H = a.num_kv_heads;
  const int q_rows = H * G * R;
  const float* q_bias = a.params;
  const float* q_norm = q_bias + q_rows;
  const float* k_norm = q_norm + R;
  const float* all_sinks = k_norm + R;
  const float* biases = all_sinks + static_cast<size_t>(H) * S * R;  // [H, G]
  const int head_stride = S * R + 1;
  for (int i = threadIdx.x; i < H * S * R; i += blockDim.x) sink_smem[i / (S * R) * head_stride + i % (S * R)] = all_sinks[i];
  __syncthreads();

  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int j = static_cast<int>(idx % group_pow2);
  const long long th = idx / group_pow2;  // token * H + head
  const int h = static_cast<int>(th % H);
  const long long t = th / H;
  // Threads past the end and padding queries take part in the shuffles with a share of 0.
  const bool active = t < a.num_tokens && j < G;
  float share = 0.0f;
  if (active) {
    const int hj = h * G + j;
    const float* row = a.proj + t * (q_rows + H * R);
    float k[kMaxDeviceGateRank], q[kMaxDeviceGateRank];
#pragma unroll
    for (int i = 0; i < kMaxDeviceGateRank; ++i) {
      k[i] = i < R ? row[q_rows + h * R + i] : 0.0f;
      q[i] = i < R ? row[hj * R + i] + q_bias[hj * R + i] : 0.0f;
    }
    weighted_rms_norm(k, k_norm, R, a.eps);
    weighted_rms_norm(q, q_norm, R, a.eps);
    float self = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDeviceGateRank; ++i)
      if (i < R) self = fmaf(q[i], k[i], self);
    self *= a.scale;
    // Softmax over the token's own logit, the sinks' and the bias, with a running max.
    float m = self, z = 1.0f;
    const float* sinks = sink_smem + static_cast<size_t>(h) * head_stride;
    for (int r = 0; r < S; ++r) {
      float l = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxDeviceGateRank; ++i)
        if (i < R) l = fmaf(q[i], sinks[r * R + i], l);
      l *= a.scale;
      if (l > m) {
        z = z * expf(m - l) + 1.0f;
        m = l;
      } else {
        z += expf(l - m);
      }
    }
    // b exp(-m) as exp(log b - m): no 0 * inf for a zero bias, no overflow for a very negative m.
    const float b = biases[hj];
    if (b > 0.0f) z += expf(logf(b) - m);
    share = expf(self - m) / z;
  }
  for (int o = group_pow2 / 2; o > 0; o >>= 1) share += __shfl_xor_sync(kFullMask, share, o, group_pow2);
  if (!active || j != 0) return;
  const float s = share / G;
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

DeviceSinkGates::~DeviceSinkGates() {
  if (side_ != nullptr) cudaStreamSynchronize(side_);
  release();
  side_gemm_.reset();
  if (forked_ != nullptr) cudaEventDestroy(forked_);
  if (joined_ != nullptr) cudaEventDestroy(joined_);
  if (side_ != nullptr) cudaStreamDestroy(side_);
}

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
  if (s.group_size > 32)
    return Status(ErrorCode::kUnimplemented, "CUDA gates: " + std::to_string(s.group_size) +
                                                 " query heads per KV head (at most 32 are supported)");
  if (static_cast<size_t>(s.num_kv_heads) * (s.num_sinks * s.rank + 1) * sizeof(float) > kMaxSinkBytes)
    return Status(ErrorCode::kUnimplemented, "CUDA gates: the sink keys (" + std::to_string(s.num_kv_heads) + " x " +
                                                 std::to_string(s.num_sinks) + " x " + std::to_string(s.rank) +
                                                 ") do not fit the kernel's 48 KB of shared memory");
  if (side_ == nullptr) {
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&forked_, cudaEventDisableTiming));
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
    side_gemm_ = std::make_unique<Gemm>();
    side_gemm_->set_stream(side_);
  }
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(side_));
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
  int group_pow2 = 1;
  while (group_pow2 < s.group_size) group_pow2 *= 2;
  const long long threads = static_cast<long long>(num_tokens) * s.num_kv_heads * group_pow2;
  const size_t smem = static_cast<size_t>(s.num_kv_heads) * (s.num_sinks * s.rank + 1) * sizeof(float);
  sink_gate_scores_kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, smem, stream>>>(
      a, group_pow2);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void DeviceSinkGates::fork(int layer, const __nv_bfloat16* hidden, int num_tokens, const GateScoreDestination& dst,
                           cudaStream_t main) {
  ORIGAMI_CUDA_CHECK(cudaEventRecord(forked_, main));
  ORIGAMI_CUDA_CHECK(cudaStreamWaitEvent(side_, forked_, 0));
  enqueue(layer, hidden, num_tokens, dst, *side_gemm_, side_);
  ORIGAMI_CUDA_CHECK(cudaEventRecord(joined_, side_));
}

void DeviceSinkGates::join(cudaStream_t main) { ORIGAMI_CUDA_CHECK(cudaStreamWaitEvent(main, joined_, 0)); }

}  // namespace origami::cuda
