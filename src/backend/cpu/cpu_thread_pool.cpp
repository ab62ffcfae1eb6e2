#include "backend/cpu/cpu_thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ORIGAMI_CPU_RELAX() _mm_pause()
#else
#define ORIGAMI_CPU_RELAX() std::this_thread::yield()
#endif

namespace origami::cpu {
namespace {
// How long an idle worker polls for the next loop before sleeping: decode steps run dozens of
// short loops back to back, and a futex wake-up per loop would cost more than the loop itself.
constexpr int kIdleSpins = 4000;
// Set while a thread runs a loop's items: a loop started from inside an item runs inline, since
// publishing a new job would end the one in progress.
thread_local bool t_in_loop = false;

struct InLoop {
  InLoop() { t_in_loop = true; }
  ~InLoop() { t_in_loop = false; }
};
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool ThreadPool::claim(uint32_t generation, int num_items, int* item) {
  uint64_t v = next_.load(std::memory_order_relaxed);
  while (true) {
    if (static_cast<uint32_t>(v >> 32) != generation) return false;
    const uint32_t index = static_cast<uint32_t>(v);
    if (index >= static_cast<uint32_t>(num_items)) return false;
    if (next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      *item = static_cast<int>(index);
      return true;
    }
  }
}

void ThreadPool::parallel_for(int num_items, const std::function<void(int)>& fn) {
  if (t_in_loop) {
    for (int i = 0; i < num_items; ++i) fn(i);
    return;
  }
  InLoop in_loop;
  uint32_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation = ++generation_;
    job_ = &fn;
    job_items_ = num_items;
    done_.store(0, std::memory_order_relaxed);
    next_.store(static_cast<uint64_t>(generation) << 32, std::memory_order_release);
  }
  wake_.notify_all();
  int item;
  while (claim(generation, num_items, &item)) {
    fn(item);
    done_.fetch_add(1, std::memory_order_release);
  }
  // Every item is claimed; wait only for those still running on workers.
  for (int spins = 0; done_.load(std::memory_order_acquire) < num_items; ++spins) {
    if (spins < 256) {
      ORIGAMI_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  job_ = nullptr;  // `fn` dies with this call; workers that wake up late must not see it
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  while (true) {
    // Poll briefly for the next loop, then sleep.
    for (int i = 0; i < kIdleSpins; ++i) {
      if (static_cast<uint32_t>(next_.load(std::memory_order_acquire) >> 32) != seen) break;
      ORIGAMI_CPU_RELAX();
    }
    const std::function<void(int)>* job;
    int num_items;
    uint32_t generation;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || (generation_ != seen && job_ != nullptr); });
      if (stop_) return;
      seen = generation = generation_;
      job = job_;
      num_items = job_items_;
    }
    InLoop in_loop;
    int item;
    while (claim(generation, num_items, &item)) {
      (*job)(item);
      done_.fetch_add(1, std::memory_order_release);
    }
  }
}

}  // namespace origami::cpu
