#include "sched/query_slot_pool.h"

#include "core/check.h"

namespace origami {

QuerySlotPool::QuerySlotPool(int num_slots) : held_(static_cast<size_t>(num_slots), false), num_free_(num_slots) {
  ORIGAMI_CHECK(num_slots >= 0);
}

int QuerySlotPool::acquire() {
  // Lowest first, so that slot ids are predictable (tests assert them).
  for (size_t i = 0; i < held_.size(); ++i) {
    if (!held_[i]) {
      held_[i] = true;
      --num_free_;
      return static_cast<int>(i);
    }
  }
  return -1;
}

void QuerySlotPool::release(int slot) {
  ORIGAMI_CHECK(slot >= 0 && slot < num_slots());
  ORIGAMI_CHECK_MSG(held_[static_cast<size_t>(slot)], "query slot released twice");
  held_[static_cast<size_t>(slot)] = false;
  ++num_free_;
}

}  // namespace origami
