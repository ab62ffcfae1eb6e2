#pragma once
// Whether a sweep point measured its policy at all. A policy that compresses nothing although
// the documents exceed its budget (SnapKV in stream mode: its prompt is one token, and it only
// compresses at the end of a prompt) scores exactly what full KV scores, by construction; that
// number says nothing about the policy and must not be shown as its fidelity.
//
// The rule, from the engine's counters over the point:
//   applies = the point is the full-KV reference
//          or the policy compressed at least once (num_compressions > 0)
//          or no document's KV exceeds the budget (max_document_tokens <= budget: nothing to
//             compress, so full KV's score is the policy's right answer)
//          or every document failed (a failure, reported as such, not a policy that did not act).
// Otherwise the point is "n/a": `applies` false with a reason; tables print n/a, JSON writes
// "applies": false and null metrics, plots leave the point out.
#include "eval/eval_result.h"

namespace origami::eval {

// Sets point->applies and point->not_applied_reason from the fields above.
void decide_applicability(PointResult* point);

}  // namespace origami::eval
