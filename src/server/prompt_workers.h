#pragma once
// A small pool of threads for the request work that can take long on the CPU: parsing a JSON
// body, rendering a chat template and tokenizing (a template may loop for seconds, a prompt may
// be megabytes). The HTTP I/O threads only hand jobs over, so /health, /metrics and every other
// connection stay answered however slow a prompt is. The queue is bounded: a job beyond it is
// refused at once (the caller answers 503) instead of waiting behind work that may never end.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace origami::server {

class PromptWorkers {
 public:
  PromptWorkers(int num_threads, int max_queued);
  // Lets the running jobs finish and drops the queued ones (their sessions went with the I/O).
  ~PromptWorkers();
  PromptWorkers(const PromptWorkers&) = delete;
  PromptWorkers& operator=(const PromptWorkers&) = delete;

  // Queues `job`; false when max_queued jobs already wait for a thread. A job must not throw.
  bool try_post(std::function<void()> job);
  // Jobs waiting for a thread (not counting the running ones).
  int num_queued() const;

 private:
  void run();

  const int max_queued_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace origami::server
