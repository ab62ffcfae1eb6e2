#include "backend/compression_stepper.h"

#include <chrono>

#include "core/check.h"

namespace origami {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void CompressionStepper::report(const Status& status, const KVCompressor* compressor, StepOutput* out) {
  const std::vector<int>* evicted = compressor != nullptr ? &compressor->evicted_blocks() : nullptr;
  const std::vector<int>* kept = compressor != nullptr ? &compressor->kept_entries() : nullptr;
  const std::vector<std::vector<float>>* sums = compressor != nullptr ? &compressor->evicted_block_sums() : nullptr;
  for (size_t j = 0; j < in_flight_.size(); ++j) {
    CompressionResult result{in_flight_[j].request_id, status, in_flight_[j].group};
    // A block eviction's result names the block (the scheduler drops it from the table).
    if (status.is_ok() && evicted != nullptr && j < evicted->size()) result.evicted_block = (*evicted)[j];
    // A compaction's kept count (a runtime allocation's: the scheduler trims the table to it).
    if (status.is_ok() && kept != nullptr && j < kept->size()) result.num_kept = (*kept)[j];
    if (status.is_ok() && sums != nullptr && j < sums->size()) result.block_score_sums = (*sums)[j];
    out->finished_compressions.push_back(result);
  }
  in_flight_.clear();
}

void CompressionStepper::start(KVCompressor* compressor, const ForwardBatch& batch, StepOutput* out) {
  out->finished_compressions.clear();
  out->compression_seconds = 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  if (!batch.compressions.empty()) {
    // The scheduler starts a batch only once the previous one was reported.
    ORIGAMI_CHECK_MSG(in_flight_.empty(), "a compression batch started while another one is in flight");
    for (const CompressionJob& job : batch.compressions) in_flight_.push_back({job.request_id, job.group});
    const Status st = compressor == nullptr
                          ? invalid_argument("KV compression is not set up: configure_compression() was not called")
                          : compressor->begin(batch.compressions);
    if (!st.is_ok()) report(st, nullptr, out);  // refused whole: nothing was written
  }
  if (batch.wait_for_compressions && !in_flight_.empty() && compressor != nullptr) {
    const Status st = compressor->wait();
    report(st, compressor, out);
  }
  out->compression_seconds = seconds_since(t0);
  out->compression_device_seconds = compressor != nullptr ? compressor->device_seconds() : 0.0;
}

void CompressionStepper::collect(KVCompressor* compressor, StepOutput* out) {
  if (in_flight_.empty()) return;
  if (!compressor->done()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = compressor->wait();  // done: returns at once with the batch's status
  report(st, compressor, out);
  out->compression_seconds += seconds_since(t0);
  out->compression_device_seconds = compressor->device_seconds();
}

}  // namespace origami
