#pragma once
// A small pool for the CPU backend's parallel loops. Unlike a fork-join region, a loop never
// waits for a worker that has not started: items are claimed one at a time from a shared counter,
// the calling thread claims too, and the call returns once every claimed item is done. A worker
// descheduled by a busy machine (tests beside other jobs on few cores) therefore costs nothing
// unless it is in the middle of an item, where a fork-join barrier would stall every loop.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace origami::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread; 0 = one per hardware thread.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) for every i in [0, num_items), spread over the pool. One loop at a time, from one
  // calling thread; a loop started from inside fn runs inline on the thread that started it.
  void parallel_for(int num_items, const std::function<void(int)>& fn);

 private:
  void worker_loop();
  // Claims the next item of job `generation`; false when that job has none left (or is over).
  bool claim(uint32_t generation, int num_items, int* item);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  // The current job, published under mutex_.
  uint32_t generation_ = 0;
  const std::function<void(int)>* job_ = nullptr;
  int job_items_ = 0;
  // High 32 bits: generation of the job; low 32 bits: next unclaimed item. A worker holding a
  // stale generation can never claim an item of a newer job.
  std::atomic<uint64_t> next_{0};
  std::atomic<int> done_{0};
};

// Runs fn(i) for i in [0, num_items): on the pool when there is one and more than one item,
// else inline.
inline void parallel_for(ThreadPool* pool, int num_items, const std::function<void(int)>& fn) {
  if (pool && pool->num_threads() > 1 && num_items > 1) {
    pool->parallel_for(num_items, fn);
  } else {
    for (int i = 0; i < num_items; ++i) fn(i);
  }
}

}  // namespace origami::cpu
