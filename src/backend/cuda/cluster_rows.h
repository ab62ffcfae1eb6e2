#pragma once
// Rows shared out over thread-block clusters. A kernel that gives each row one CTA leaves all but
// `rows` SMs idle at small batches (a batch-1 decode step runs its sampling, its SiLU + quantize on
// one SM of 132); sharing each row over a cluster of CTAs, whose partial results (histograms, sums,
// maxima) meet over distributed shared memory, spreads it. Kernels that do so: sampling_kernels.cu,
// fp8_fused_kernels.cu.

namespace origami::cuda {

// The most of 1, 2, 4, 8 CTAs a row (8: the portable cluster size) whose CTAs, rows x the count,
// still fit `num_sms`, one an SM; 1 from num_sms + 1 rows on. Measured for the sampler (H200):
// letting two CTAs share an SM was slower (docs/kernels.md, "Sampling").
int cluster_ctas_per_row(int num_rows, int num_sms);

// The current device's SM count, asked once per device (host code; graph capture safe).
int current_device_sm_count();

}  // namespace origami::cuda
