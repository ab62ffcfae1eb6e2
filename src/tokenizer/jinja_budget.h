#pragma once
// What one render of a Jinja template may spend, and the account it spends from. A template is
// code from a model repository (or a request); rendering it must not be able to exhaust the
// process, so every unit of work and every byte a value allocates is charged here:
//   - steps: statements executed, expressions evaluated, container elements visited while
//     printing/comparing/serialising, plus one step per `bytes_per_step` bytes allocated, so a
//     loop that copies a 32 MB string costs 128k steps per copy, not one;
//   - bytes: every string, list, tuple and dict a value allocates during the render (copies
//     included), counted cumulatively, freed or not, so the count is an upper bound on the
//     render's peak memory; builders check their result size before allocating it;
//   - nesting: lists/dicts built by the template nest at most `max_nesting` deep (printing,
//     comparing and destroying them recurses);
//   - a wall-clock deadline, checked every few hundred steps, as a backstop only: the limits
//     above are deterministic and a real chat template stays far below all of them.
// The interpreter is single-threaded; the budget of the render running on a thread is found
// through a thread-local pointer, so that Value, filters and builtins can charge it without
// threading a context through every call. Outside a render nothing is charged.
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace origami::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;
  // Statements, expressions, container elements visited and bytes allocated (see above). A real
  // chat template takes ~60k steps per MB of conversation (Qwen3's: 245k for 4 MB); a step is
  // ~50-100 ns, so the limit alone ends any render within about half a second.
  int64_t max_steps = 5'000'000;
  int max_call_depth = 64;         // nested macro calls
  // Bytes the render's values may allocate in total: this much, plus `memory_per_input_byte`
  // times the size of the variables passed in (a template copies the conversation several
  // times: Qwen3's allocates ~12 bytes per input byte, so 48 leaves 4x headroom); a 150-byte
  // bomb gets the fixed part only.
  size_t max_memory_bytes = size_t{64} << 20;
  size_t memory_per_input_byte = 48;
  int64_t bytes_per_step = 256;  // allocating this many bytes costs one step (~ the same time)
  int max_nesting = 256;        // depth of lists/dicts the template builds
  // Wall-clock backstop; 0 disables it. One second is ~100x what the largest real chat template
  // needs for a long conversation, and bounds what a hostile template costs a request.
  std::chrono::milliseconds max_duration{1000};
};

class RenderBudget {
 public:
  RenderBudget(const RenderLimits& limits, size_t input_bytes);
  const RenderLimits& limits() const { return limits_; }

  // One unit of work (throws JinjaError past max_steps or the deadline).
  void step(int64_t n = 1);
  // `bytes` allocated by a value: charged to memory and, by size, to steps.
  void charge(size_t bytes);
  // Throws when a value of `bytes` could no longer be charged; builders call it before growing a
  // result, so the refused allocation never happens.
  void check(size_t bytes) const;
  size_t bytes_charged() const { return bytes_; }
  int64_t steps_taken() const { return steps_; }

 private:
  void check_deadline();

  RenderLimits limits_;
  size_t memory_limit_;
  size_t bytes_ = 0;
  int64_t steps_ = 0;
  int64_t next_clock_check_ = 0;
  std::chrono::steady_clock::time_point deadline_;
};

// Makes `budget` the one charged on this thread for its lifetime (restores the previous one).
class ActiveBudget {
 public:
  explicit ActiveBudget(RenderBudget* budget);
  ~ActiveBudget();
  ActiveBudget(const ActiveBudget&) = delete;
  ActiveBudget& operator=(const ActiveBudget&) = delete;

 private:
  RenderBudget* previous_;
};

// The active budget's operations; no-ops outside a render.
void budget_step(int64_t n = 1);
void budget_charge(size_t bytes);
void budget_check(size_t bytes);
// The nesting limit of the active render (0: none, outside a render).
int budget_max_nesting();

}  // namespace origami::jinja
