#include "eval/point_applicability.h"

#include <string>

namespace origami::eval {

void decide_applicability(PointResult* p) {
  p->applies = true;
  p->not_applied_reason.clear();
  if (p->point.reference || p->point.budget <= 0) return;  // no budget: nothing it could have skipped
  if (p->num_compressions > 0) return;
  if (p->max_document_tokens <= p->point.budget) return;
  if (p->num_documents > 0 && p->num_failed == p->num_documents) return;
  p->applies = false;
  p->not_applied_reason = "the policy compressed nothing in " + (p->mode.empty() ? std::string("this") : p->mode) +
                          " mode although documents hold up to " + std::to_string(p->max_document_tokens) +
                          " tokens, above the budget of " + std::to_string(p->point.budget);
}

}  // namespace origami::eval
