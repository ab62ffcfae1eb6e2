#include "sched/request.h"

namespace origami {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kEos: return "stop";  // OpenAI reports EOS as "stop"
    case FinishReason::kAborted: return "abort";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

}  // namespace origami
