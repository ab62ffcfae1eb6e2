#include "tokenizer/unicode.h"

#include <algorithm>
#include <vector>

#include "tokenizer/unicode_tables.h"

namespace origami::unicode {
namespace {

namespace t = unicode_tables;

bool in_ranges(const t::CodePointRange* ranges, size_t n, char32_t cp) {
  const t::CodePointRange* end = ranges + n;
  const t::CodePointRange* it =
      std::upper_bound(ranges, end, cp, [](char32_t c, const t::CodePointRange& r) { return c < r.lo; });
  return it != ranges && cp <= (it - 1)->hi;
}

// Outcome of reading one UTF-8 sequence: its length in bytes, or how many bytes form the
// maximal invalid subpart, or that the input ended inside a so-far valid sequence.
enum class SeqKind { kValid, kInvalid, kTruncated };
struct Seq {
  SeqKind kind;
  size_t length;
  char32_t cp;
};

Seq read_sequence(std::string_view s, size_t pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  if (b0 < 0x80) return {SeqKind::kValid, 1, b0};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {SeqKind::kInvalid, 1, kReplacementChar};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (pos + k >= s.size()) return {SeqKind::kTruncated, k, kReplacementChar};
    const auto b = static_cast<unsigned char>(s[pos + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {SeqKind::kInvalid, k, kReplacementChar};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {SeqKind::kValid, need + 1, cp};
}

// Hangul syllable constants (Unicode chapter 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

bool nfc_unsafe(char32_t cp) {
  return cp >= 0x300 && in_ranges(t::kNfcUnsafeRanges, t::kNfcUnsafeRanges_size, cp);
}

void decompose_into(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp < 0xC0) {
    out.push_back(cp);
    return;
  }
  const t::Decomposition* end = t::kDecompositions + t::kDecompositions_size;
  const t::Decomposition* it = std::lower_bound(
      t::kDecompositions, end, cp, [](const t::Decomposition& d, char32_t c) { return d.cp < c; });
  if (it != end && it->cp == cp) {
    out.insert(out.end(), t::kDecompositionPool + it->offset,
               t::kDecompositionPool + it->offset + it->length);
  } else {
    out.push_back(cp);
  }
}

// Canonical ordering: stable sort of each run of non-starters by combining class.
void canonical_order(std::vector<char32_t>& cps, std::vector<uint8_t>& ccc) {
  ccc.resize(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) ccc[i] = combining_class(cps[i]);
  for (size_t i = 0; i < cps.size();) {
    if (ccc[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc[j] != 0) ++j;
    if (j - i > 1) {
      // Runs are short; insertion sort keeps it stable.
      for (size_t a = i + 1; a < j; ++a) {
        for (size_t b = a; b > i && ccc[b - 1] > ccc[b]; --b) {
          std::swap(ccc[b - 1], ccc[b]);
          std::swap(cps[b - 1], cps[b]);
        }
      }
    }
    i = j;
  }
}

bool compose_pair(char32_t a, char32_t b, char32_t& out) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    out = kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    return true;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    out = a + (b - kTBase);
    return true;
  }
  const t::Composition* end = t::kCompositions + t::kCompositions_size;
  const t::Composition* it = std::lower_bound(
      t::kCompositions, end, std::pair<char32_t, char32_t>{a, b},
      [](const t::Composition& c, const std::pair<char32_t, char32_t>& k) {
        return c.first < k.first || (c.first == k.first && c.second < k.second);
      });
  if (it != end && it->first == a && it->second == b) {
    out = it->composite;
    return true;
  }
  return false;
}

std::vector<char32_t> decompose_all(std::string_view text) {
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) decompose_into(next_code_point(text, pos), cps);
  return cps;
}

std::string nfc_segment(std::string_view text) {
  std::vector<char32_t> cps = decompose_all(text);
  std::vector<uint8_t> ccc;
  canonical_order(cps, ccc);
  std::vector<char32_t> out;
  out.reserve(cps.size());
  std::vector<uint8_t> out_ccc;
  out_ccc.reserve(cps.size());
  ptrdiff_t starter = -1;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const uint8_t cc = ccc[i];
    if (starter >= 0) {
      const bool adjacent = static_cast<ptrdiff_t>(out.size()) - 1 == starter;
      const int prev_cc = adjacent ? -1 : out_ccc.back();
      // Not blocked: adjacent to the starter, or every char in between has a lower, non-zero class.
      if (adjacent || (prev_cc != 0 && prev_cc < cc)) {
        char32_t composite;
        if (compose_pair(out[starter], c, composite)) {
          out[starter] = composite;
          continue;
        }
      }
    }
    out.push_back(c);
    out_ccc.push_back(cc);
    if (cc == 0) starter = static_cast<ptrdiff_t>(out.size()) - 1;
  }
  std::string result;
  result.reserve(text.size());
  for (char32_t c : out) append_utf8(result, c);
  return result;
}

}  // namespace

char32_t next_code_point(std::string_view text, size_t& pos) {
  const Seq seq = read_sequence(text, pos);
  pos += seq.length;
  return seq.cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_utf8(char32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

bool is_valid_utf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Seq seq = read_sequence(text, pos);
    if (seq.kind != SeqKind::kValid) return false;
    pos += seq.length;
  }
  return true;
}

std::string to_valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Seq seq = read_sequence(text, pos);
    if (seq.kind == SeqKind::kValid) {
      out.append(text.substr(pos, seq.length));
    } else {
      append_utf8(out, kReplacementChar);
    }
    pos += seq.length;
  }
  return out;
}

size_t complete_utf8_prefix(std::string_view bytes) {
  // Only the last (at most 3) bytes can start an unfinished sequence.
  const size_t from = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t pos = from; pos < bytes.size(); ++pos) {
    const auto b = static_cast<unsigned char>(bytes[pos]);
    if (b < 0xC2 || b > 0xF4) continue;  // not a lead byte
    const Seq seq = read_sequence(bytes, pos);
    if (seq.kind == SeqKind::kTruncated) return pos;
  }
  return bytes.size();
}

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(t::kLetterRanges, t::kLetterRanges_size, cp);
}

bool is_number(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(t::kNumberRanges, t::kNumberRanges_size, cp);
}

bool is_whitespace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return in_ranges(t::kWhiteSpaceRanges, t::kWhiteSpaceRanges_size, cp);
}

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const t::CombiningClassRange* begin = t::kCombiningClassRanges;
  const t::CombiningClassRange* end = begin + t::kCombiningClassRanges_size;
  const t::CombiningClassRange* it = std::upper_bound(
      begin, end, cp, [](char32_t c, const t::CombiningClassRange& r) { return c < r.lo; });
  if (it == begin || cp > (it - 1)->hi) return 0;
  return (it - 1)->ccc;
}

std::string nfc(std::string_view text) {
  // Only the stretches around code points that NFC can change are normalized; a "safe" code
  // point (no decomposition, class 0, never second in a composition) bounds every interaction,
  // except that it may start a composition with what follows, so a stretch begins at the last
  // safe code point before it.
  std::string out;
  size_t emitted = 0;
  size_t last_safe = std::string_view::npos;
  bool changed = false;
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      last_safe = start;
      ++pos;
      continue;
    }
    const char32_t cp = next_code_point(text, pos);
    if (!nfc_unsafe(cp)) {
      last_safe = start;
      continue;
    }
    const size_t seg_start = last_safe == std::string_view::npos ? emitted : last_safe;
    size_t seg_end = pos;
    while (seg_end < text.size()) {
      size_t next = seg_end;
      const char32_t c = next_code_point(text, next);
      if (!nfc_unsafe(c)) break;
      seg_end = next;
    }
    if (!changed) {
      out.reserve(text.size());
      changed = true;
    }
    out.append(text.substr(emitted, seg_start - emitted));
    out += nfc_segment(text.substr(seg_start, seg_end - seg_start));
    emitted = seg_end;
    pos = seg_end;
    last_safe = std::string_view::npos;
  }
  if (!changed) return std::string(text);
  out.append(text.substr(emitted));
  return out;
}

std::string nfd(std::string_view text) {
  std::vector<char32_t> cps = decompose_all(text);
  std::vector<uint8_t> ccc;
  canonical_order(cps, ccc);
  std::string out;
  out.reserve(text.size());
  for (char32_t c : cps) append_utf8(out, c);
  return out;
}

}  // namespace origami::unicode
