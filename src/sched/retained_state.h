#pragma once
// What a retained context carries of its request's compression (kv/retained_contexts.h), and how
// a continuation takes it back: the continuation is the same conversation going on, so it resumes
// where its context's policy stood (compressions done, global scores valid, the one-off
// end-of-prefill decision taken) and its new prompt tokens are computed as that request's next
// tokens would have been.
#include <string>

#include "kv/retained_contexts.h"
#include "sched/request.h"

namespace origami {

// Names the policy, budget and options a request compresses under: a compressed context is
// continued only by a request with the same key. Empty for full KV.
std::string retained_policy_key(const RequestCompression& compression);

// The request's compression state as its context keeps it. A compression decided but not done
// (pending when the request finished) is not carried: the continuation decides again.
RetainedPolicyState retained_policy_state(const Request& request);

// A continuation under the context's own policy key resumes its state.
void resume_retained_policy_state(const RetainedPolicyState& state, RequestCompression* compression);

}  // namespace origami
