// Next-token selection on the GPU (sampling_kernels.h, one launch over a batch's logits rows):
// time per launch for greedy and for the samplers users run (temperature alone, top-p, top-k),
// then the log-probabilities launched beside it (logprob_kernels.h: the sampled token's, top 5, top 20),
// at decode batch sizes and vocabularies of the models served (Llama-3: 128,256, Qwen3: 151,936).
// Logits are Gaussian (sigma 3) with a few outliers on top, as a language model's rows look; each
// row is read where the LM head left it (L2 when it fits). Also prints how many row-reads' worth
// of bytes one launch's time equals, against the copy bandwidth.
//
// Run: sampling_bench [--rows 1,64,256] [--vocabs 128256,151936] [--iters 50]
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/logprob_kernels.h"
#include "backend/cuda/sampling_kernels.h"
#include "bench_util.cuh"
#include "sampling/sampler.h"

using origami::cuda::RowSamplingParams;

namespace {

struct Mode {
  const char* name;
  float temperature;
  int top_k;
  float top_p;
  float min_p;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rows_list = {1, 64, 256}, vocabs = {128256, 151936};
  int iters = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--rows" && has_value) {
      rows_list = parse_list("--rows", argv[++i]);
    } else if (arg == "--vocabs" && has_value) {
      vocabs = parse_list("--vocabs", argv[++i]);
    } else if (arg == "--iters" && has_value) {
      iters = parse_list("--iters", argv[++i])[0];
    } else {
      std::fprintf(stderr, "usage: sampling_bench [--rows 1,64,256] [--vocabs 128256,151936] [--iters 50]\n");
      return 2;
    }
  }
  print_device("");
  const double copy_gbs = measure_copy_gbs(10);
  const Mode modes[] = {{"greedy", 0.0f, 0, 1.0f, 0.0f},
                        {"T=1", 1.0f, 0, 1.0f, 0.0f},
                        {"T=0.7 top_p=0.9", 0.7f, 0, 0.9f, 0.0f},
                        {"T=0.8 top_k=50", 0.8f, 50, 1.0f, 0.0f},
                        {"T=1 min_p=0.05", 1.0f, 0, 1.0f, 0.05f}};
  std::printf("%-18s %7s %5s %10s %12s\n", "mode", "vocab", "rows", "us/launch", "row reads");
  for (int vocab : vocabs) {
    for (int rows : rows_list) {
      std::mt19937 rng(5);
      std::normal_distribution<float> dist(0.0f, 3.0f);
      std::vector<float> logits(static_cast<size_t>(rows) * vocab);
      for (float& x : logits) x = dist(rng);
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < 8; ++j) logits[static_cast<size_t>(r) * vocab + rng() % vocab] = 12.0f + j;
      float* d_logits = nullptr;
      RowSamplingParams* d_params = nullptr;
      int32_t* d_tokens = nullptr;
      CK(cudaMalloc(&d_logits, logits.size() * sizeof(float)));
      CK(cudaMalloc(&d_params, rows * sizeof(RowSamplingParams)));
      CK(cudaMalloc(&d_tokens, rows * sizeof(int32_t)));
      CK(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
      for (const Mode& m : modes) {
        origami::SamplingParams sp;
        sp.temperature = m.temperature;
        sp.top_k = m.top_k;
        sp.top_p = m.top_p;
        sp.min_p = m.min_p;
        std::vector<RowSamplingParams> params(rows);
        for (int r = 0; r < rows; ++r) params[r] = origami::cuda::row_sampling_params(&sp, origami::sampling_uniform(17, r));
        CK(cudaMemcpy(d_params, params.data(), rows * sizeof(RowSamplingParams), cudaMemcpyHostToDevice));
        for (int w = 0; w < 3; ++w) origami::cuda::launch_sample_rows(d_logits, rows, vocab, vocab, d_params, d_tokens, 0);
        const float ms = median_ms(
            [&](int) { origami::cuda::launch_sample_rows(d_logits, rows, vocab, vocab, d_params, d_tokens, 0); }, iters);
        // Bytes of one read of every row, at half the copy's (read + write) rate: one direction.
        const double row_read_us = static_cast<double>(rows) * vocab * sizeof(float) / (copy_gbs / 2 * 1e3);
        std::printf("%-18s %7d %5d %10.1f %12.1f\n", m.name, vocab, rows, ms * 1e3, ms * 1e3 / row_read_us);
      }
      // Log-probabilities beside the sampler (logprob_kernels.h): of the sampled token, and the top k
      // as the OpenAI API's top_logprobs asks.
      float* d_logprobs = nullptr;
      origami::TopLogprob* d_top = nullptr;
      CK(cudaMalloc(&d_logprobs, rows * sizeof(float)));
      CK(cudaMalloc(&d_top, static_cast<size_t>(rows) * origami::kMaxTopLogprobs * sizeof(origami::TopLogprob)));
      for (int top : {0, 5, origami::kMaxTopLogprobs}) {
        std::vector<RowSamplingParams> params(rows);
        for (RowSamplingParams& p : params) p.num_top_logprobs = top;
        CK(cudaMemcpy(d_params, params.data(), rows * sizeof(RowSamplingParams), cudaMemcpyHostToDevice));
        auto launch = [&] {
          origami::cuda::launch_row_logprobs(d_logits, rows, vocab, vocab, d_params, d_tokens, d_logprobs, d_top, 0);
        };
        for (int w = 0; w < 3; ++w) launch();
        const float ms = median_ms([&](int) { launch(); }, iters);
        const double row_read_us = static_cast<double>(rows) * vocab * sizeof(float) / (copy_gbs / 2 * 1e3);
        const std::string name = "logprobs top " + std::to_string(top);
        std::printf("%-18s %7d %5d %10.1f %12.1f\n", name.c_str(), vocab, rows, ms * 1e3, ms * 1e3 / row_read_us);
      }
      CK(cudaFree(d_logprobs));
      CK(cudaFree(d_top));
      CK(cudaFree(d_logits));
      CK(cudaFree(d_params));
      CK(cudaFree(d_tokens));
    }
  }
  return 0;
}
