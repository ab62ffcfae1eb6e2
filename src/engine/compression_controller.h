#pragma once
// Runs the compressions the scheduler planned on the backend: builds one CompressionJob per
// request, starts the batch, and when the backend reports it done hands each request back to
// the scheduler (complete_compression). With async compression the batch runs while the other
// requests decode (the CUDA backend uses its own stream); otherwise the engine waits for it.
#include <vector>

#include "backend/backend.h"
#include "engine/engine_metrics.h"
#include "sched/scheduler.h"

namespace origami {

class CompressionController {
 public:
  CompressionController(Backend* backend, Scheduler* scheduler, EngineMetrics* metrics);

  bool in_flight() const { return !batch_.empty(); }
  // Requests of the batch in flight.
  const std::vector<Request*>& batch() const { return batch_; }

  struct Result {
    std::vector<Request*> failed;  // their compression was undone; the engine finishes them
    Status error;
  };
  // Starts compressing `requests` (planned by Scheduler::plan_compressions; nothing in flight).
  // A batch the backend refuses is undone at once and reported in Result::failed.
  Result start(const std::vector<Request*>& requests);
  // Completes the batch in flight if the backend is done, or after waiting for it (`wait`).
  // Returns false if it is still running.
  bool poll(bool wait, Result* result);

 private:
  void finish_batch(const Status& status, Result* result);

  Backend* backend_;
  Scheduler* scheduler_;
  EngineMetrics* metrics_;
  std::vector<Request*> batch_;
  std::vector<CompressionJob> jobs_;
};

}  // namespace origami
