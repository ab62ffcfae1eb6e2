#pragma once
// The M query slots of the backend's query cache Q[L, M, w, h_q, d] (Zipage §4.2): a request
// holds one while it computes the tokens whose queries its next compression scores with.
#include <vector>

namespace origami {

class QuerySlotPool {
 public:
  explicit QuerySlotPool(int num_slots);

  // The lowest free slot, or -1 when all are held.
  int acquire();
  void release(int slot);
  int num_slots() const { return static_cast<int>(held_.size()); }
  int num_free() const { return num_free_; }

 private:
  std::vector<bool> held_;
  int num_free_ = 0;
};

}  // namespace origami
