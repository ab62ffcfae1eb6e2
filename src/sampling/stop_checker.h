#pragma once
// Stop strings over streamed text. Text arrives in deltas (one detokenized token at a time); a
// stop string may span several deltas, so the search looks back into the text already seen, and
// the streamer holds back a tail that could still grow into a stop string.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sampling/sampling_params.h"

namespace origami {

struct StopMatch {
  bool found = false;
  size_t stop_index = 0;   // which entry of the stop list matched
  size_t match_begin = 0;  // byte offset of the stop string in the text
  size_t match_end = 0;    // one past its last byte
  // Length to cut the text to: match_begin, or match_end with include_stop_str_in_output.
  size_t truncate_at = 0;
};

// `text` is the whole output text so far, whose bytes from `new_text_begin` on arrived in the
// latest delta (text before it was checked by earlier calls). Finds the stop string occurrence
// that ends first among those ending inside the new bytes; on equal ends, the one starting first.
// Ordering by end (not by list order or start) makes the result the same however the text was cut
// into deltas: fed byte by byte, the first stop string to complete is the earliest-ending one.
StopMatch find_stop_string(std::string_view text, size_t new_text_begin, const std::vector<std::string>& stops,
                           bool include_stop_str_in_output);

// How many trailing bytes of `text` must not be streamed yet because they are a proper prefix of
// some stop string (and so might become one with the next delta). 0 when no stop string can
// start in the tail.
size_t stop_string_holdback(std::string_view text, const std::vector<std::string>& stops);

// Whether sampling `token` ends the request: one of params.stop_token_ids, or an EOS id unless
// params.ignore_eos (which, as in vLLM, leaves stop_token_ids in force).
bool is_stop_token(const SamplingParams& params, int32_t token, std::span<const int32_t> eos_token_ids);

}  // namespace origami
