// Stop strings over streamed text, checked against a brute-force oracle that scans the whole
// text at once, plus hold-back lengths and stop tokens.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "sampling/stop_checker.h"

namespace origami {
namespace {

// Feeds `text` in the given delta sizes, as the engine does, and returns the final output text
// (truncated at a stop string, if any) and what a streamer could have emitted before the end.
struct StreamResult {
  std::string text;
  bool stopped = false;
  size_t stop_index = 0;
  std::string streamed;  // what was safe to emit while the request was still running
};

StreamResult stream(const std::string& full, const std::vector<size_t>& deltas, const std::vector<std::string>& stops,
                    bool include) {
  StreamResult r;
  size_t pos = 0;
  for (size_t d : deltas) {
    const size_t before = r.text.size();
    r.text += full.substr(pos, d);
    pos += d;
    const StopMatch m = find_stop_string(r.text, before, stops, include);
    if (m.found) {
      r.text.resize(m.truncate_at);
      r.stopped = true;
      r.stop_index = m.stop_index;
      return r;
    }
    const size_t safe = r.text.size() - stop_string_holdback(r.text, stops);
    if (safe > r.streamed.size()) r.streamed = r.text.substr(0, safe);
  }
  return r;
}

// The oracle: the stop occurrence with the smallest end (then smallest start) in the whole text.
StopMatch whole_text_oracle(const std::string& text, const std::vector<std::string>& stops, bool include) {
  StopMatch best;
  for (size_t s = 0; s < stops.size(); ++s) {
    for (size_t pos = text.find(stops[s]); pos != std::string::npos; pos = text.find(stops[s], pos + 1)) {
      const size_t end = pos + stops[s].size();
      if (!best.found || end < best.match_end || (end == best.match_end && pos < best.match_begin)) {
        best = {true, s, pos, end, include ? end : pos};
      }
    }
  }
  return best;
}

TEST(SamplingStopChecker, FindsStopStringInsideOneDelta) {
  const StopMatch m = find_stop_string("Hello world. END more", 0, {"END"}, false);
  ASSERT_TRUE(m.found);
  EXPECT_EQ(m.match_begin, 13u);
  EXPECT_EQ(m.truncate_at, 13u);
  const StopMatch inc = find_stop_string("Hello world. END more", 0, {"END"}, true);
  EXPECT_EQ(inc.truncate_at, 16u);
}

TEST(SamplingStopChecker, StopStringSpanningDeltas) {
  // "<|stop|>" arrives as "<|", "st", "op|", ">".
  const StreamResult r = stream("abc<|stop|>xyz", {3, 2, 2, 3, 1, 3}, {"<|stop|>"}, false);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "abc");
  // While the stop string was incomplete, its prefix was never streamed.
  EXPECT_EQ(r.streamed, "abc");
  const StreamResult inc = stream("abc<|stop|>xyz", {3, 2, 2, 3, 1, 3}, {"<|stop|>"}, true);
  EXPECT_EQ(inc.text, "abc<|stop|>");
}

TEST(SamplingStopChecker, IgnoresMatchesThatEndedInEarlierText) {
  // "ab" ended before the new text starts: it was already handled (or the caller chose to go on).
  const StopMatch m = find_stop_string("xxabyy", 4, {"ab"}, false);
  EXPECT_FALSE(m.found);
  const StopMatch m2 = find_stop_string("xxabyy", 3, {"ab"}, false);
  EXPECT_TRUE(m2.found);
  EXPECT_EQ(m2.match_begin, 2u);
  EXPECT_FALSE(find_stop_string("abc", 3, {"c"}, false).found);  // empty delta
}

TEST(SamplingStopChecker, EarliestStopStringWins) {
  // List order does not matter; the earliest-ending occurrence does.
  const StopMatch m = find_stop_string("one two three", 0, {"three", "two"}, false);
  ASSERT_TRUE(m.found);
  EXPECT_EQ(m.stop_index, 1u);
  EXPECT_EQ(m.truncate_at, 4u);
  // Overlapping: "abc" starts first but "b" completes first; fed byte by byte, "b" is seen first.
  const StopMatch m2 = find_stop_string("xabc", 0, {"abc", "b"}, false);
  EXPECT_EQ(m2.stop_index, 1u);
  EXPECT_EQ(m2.truncate_at, 2u);
  // Same end: the longer (earlier-starting) one.
  const StopMatch m3 = find_stop_string("xabc", 0, {"c", "bc"}, false);
  EXPECT_EQ(m3.stop_index, 1u);
  EXPECT_EQ(m3.truncate_at, 2u);
}

TEST(SamplingStopChecker, HoldBackLength) {
  const std::vector<std::string> stops = {"</answer>", "STOP"};
  EXPECT_EQ(stop_string_holdback("result </ans", stops), 5u);
  EXPECT_EQ(stop_string_holdback("result <", stops), 1u);
  EXPECT_EQ(stop_string_holdback("result ST", stops), 2u);
  EXPECT_EQ(stop_string_holdback("result", stops), 0u);
  EXPECT_EQ(stop_string_holdback("", stops), 0u);
  // The longest candidate counts, even when a shorter one also matches.
  EXPECT_EQ(stop_string_holdback("x aaa", {"aaab", "ab"}), 3u);
  // A proper prefix only: a completed stop string is the finder's business.
  EXPECT_EQ(stop_string_holdback("abc", {"abc"}), 0u);
  EXPECT_EQ(stop_string_holdback("xab", {"abc"}), 2u);
}

// Random texts over a small alphabet, random stop lists and random delta cuts: the streamed
// result must equal the whole-text oracle however the text is cut, and nothing streamed early
// may go past the final truncation.
TEST(SamplingStopChecker, StreamingMatchesWholeTextOracle) {
  std::mt19937 rng(5);
  auto random_string = [&](size_t len) {
    std::string s;
    for (size_t i = 0; i < len; ++i) s += static_cast<char>('a' + rng() % 3);
    return s;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string text = random_string(5 + rng() % 30);
    std::vector<std::string> stops;
    const int num_stops = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < num_stops; ++s) stops.push_back(random_string(1 + rng() % 4));
    std::vector<size_t> deltas;
    for (size_t left = text.size(); left > 0;) {
      const size_t d = std::min<size_t>(left, 1 + rng() % 4);
      deltas.push_back(d);
      left -= d;
    }
    const bool include = rng() % 2;
    const StreamResult r = stream(text, deltas, stops, include);
    const StopMatch oracle = whole_text_oracle(text, stops, include);
    ASSERT_EQ(r.stopped, oracle.found) << text;
    if (oracle.found) {
      ASSERT_EQ(r.text, text.substr(0, oracle.truncate_at)) << text;
      ASSERT_EQ(r.stop_index, oracle.stop_index) << text;
    } else {
      ASSERT_EQ(r.text, text);
    }
    ASSERT_EQ(r.text.compare(0, r.streamed.size(), r.streamed), 0) << "streamed text was later retracted: " << text;
  }
}

TEST(SamplingStopChecker, StopTokens) {
  SamplingParams p;
  const std::vector<int32_t> eos = {2, 7};
  EXPECT_TRUE(is_stop_token(p, 2, eos));
  EXPECT_FALSE(is_stop_token(p, 3, eos));
  p.stop_token_ids = {3};
  EXPECT_TRUE(is_stop_token(p, 3, eos));
  p.ignore_eos = true;
  EXPECT_FALSE(is_stop_token(p, 7, eos));
  EXPECT_TRUE(is_stop_token(p, 3, eos));  // ignore_eos leaves stop_token_ids in force
}

}  // namespace
}  // namespace origami
