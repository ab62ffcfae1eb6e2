#include "server/prompt_workers.h"

#include <algorithm>

namespace origami::server {

PromptWorkers::PromptWorkers(int num_threads, int max_queued) : max_queued_(std::max(0, max_queued)) {
  for (int i = 0; i < std::max(1, num_threads); ++i) threads_.emplace_back([this] { run(); });
}

PromptWorkers::~PromptWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

bool PromptWorkers::try_post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || static_cast<int>(queue_.size()) >= max_queued_) return false;
    queue_.push_back(std::move(job));
  }
  wake_.notify_one();
  return true;
}

int PromptWorkers::num_queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(queue_.size());
}

void PromptWorkers::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

}  // namespace origami::server
