#include "tokenizer/jinja_budget.h"

#include <limits>
#include <string>

#include "tokenizer/jinja_value.h"

namespace origami::jinja {
namespace {

thread_local RenderBudget* g_active = nullptr;

// The clock is read once per this many steps: cheap, and a step is well under a microsecond.
constexpr int64_t kStepsPerClockCheck = 256;

size_t saturating_add(size_t a, size_t b) {
  return a > std::numeric_limits<size_t>::max() - b ? std::numeric_limits<size_t>::max() : a + b;
}

size_t saturating_mul(size_t a, size_t b) {
  return b != 0 && a > std::numeric_limits<size_t>::max() / b ? std::numeric_limits<size_t>::max() : a * b;
}

}  // namespace

RenderBudget::RenderBudget(const RenderLimits& limits, size_t input_bytes)
    : limits_(limits),
      memory_limit_(saturating_add(limits.max_memory_bytes, saturating_mul(limits.memory_per_input_byte, input_bytes))),
      deadline_(std::chrono::steady_clock::now() + limits.max_duration) {}

void RenderBudget::step(int64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps) throw JinjaError("template exceeded the step limit of " + std::to_string(limits_.max_steps));
  if (steps_ >= next_clock_check_) {
    next_clock_check_ = steps_ + kStepsPerClockCheck;
    check_deadline();
  }
}

void RenderBudget::check_deadline() {
  if (limits_.max_duration.count() <= 0) return;
  if (std::chrono::steady_clock::now() > deadline_) {
    throw JinjaError("template exceeded the time limit of " + std::to_string(limits_.max_duration.count()) + " ms");
  }
}

void RenderBudget::check(size_t bytes) const {
  if (bytes > memory_limit_ - bytes_) {  // bytes_ <= memory_limit_ always
    throw JinjaError("template exceeded the memory limit of " + std::to_string(memory_limit_) + " bytes");
  }
}

void RenderBudget::charge(size_t bytes) {
  check(bytes);
  bytes_ += bytes;
  if (limits_.bytes_per_step > 0) step(static_cast<int64_t>(bytes / static_cast<size_t>(limits_.bytes_per_step)));
}

ActiveBudget::ActiveBudget(RenderBudget* budget) : previous_(g_active) { g_active = budget; }
ActiveBudget::~ActiveBudget() { g_active = previous_; }

void budget_step(int64_t n) {
  if (g_active) g_active->step(n);
}

void budget_charge(size_t bytes) {
  if (g_active) g_active->charge(bytes);
}

void budget_check(size_t bytes) {
  if (g_active) g_active->check(bytes);
}

int budget_max_nesting() { return g_active ? g_active->limits().max_nesting : 0; }

}  // namespace origami::jinja
