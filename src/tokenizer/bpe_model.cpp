#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <shared_mutex>

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/unicode.h"

namespace origami {

// (left id, right id) -> (rank, merged id), open addressing with linear probing: the merge
// lookup is the innermost operation of encoding.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  std::vector<Slot> slots;
  uint64_t mask = 0;

  static uint64_t key_of(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots.assign(cap, Slot{});
    mask = cap - 1;
  }
  // Keeps the first (best-ranked) entry when a pair repeats.
  void insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    const uint64_t k = key_of(a, b);
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return;
      if (slots[i].key == kEmpty) {
        slots[i] = {k, rank, merged};
        return;
      }
    }
  }
  const Slot* find(int32_t a, int32_t b) const {
    const uint64_t k = key_of(a, b);
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

// Pre-token -> ids. Words repeat a lot in natural text, so most merges are skipped.
struct BpeModel::Cache {
  static constexpr size_t kCapacity = 1 << 17;
  static constexpr size_t kMaxWordBytes = 256;
  std::shared_mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
};

BpeModel::~BpeModel() = default;

namespace {

Expected<std::pair<std::string, std::string>> parse_merge(const nlohmann::json& m, size_t index,
                                                          const std::string& where) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ', 1);
    if (space == std::string::npos) {
      return invalid_file(where + ": model.merges[" + std::to_string(index) + "] '" + s +
                          "' is not two tokens separated by a space");
    }
    return std::pair{s.substr(0, space), s.substr(space + 1)};
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::pair{m[0].get<std::string>(), m[1].get<std::string>()};
  }
  return invalid_file(where + ": model.merges[" + std::to_string(index) +
                      "] must be a \"a b\" string or an [a, b] pair of strings");
}

}  // namespace

Expected<std::unique_ptr<BpeModel>> BpeModel::from_json(const nlohmann::json& model, bool byte_level,
                                                        const std::string& where) {
  if (!model.is_object()) return invalid_file(where + ": 'model' must be an object");
  ORIGAMI_ASSIGN_OR_RETURN(const std::string type, optional_string(model, "type", "BPE", where + ": model"));
  if (type != "BPE") return invalid_file(where + ": unsupported model type '" + type + "' (only BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return invalid_file(where + ": model." + key + " is not supported");
    }
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return invalid_file(where + ": model.vocab must be an object of token -> id");
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return invalid_file(where + ": model.merges must be an array");
  }

  std::unique_ptr<BpeModel> m(new BpeModel());
  m->byte_level_ = byte_level;
  ORIGAMI_ASSIGN_OR_RETURN(m->byte_fallback_, optional_bool(model, "byte_fallback", false, where + ": model"));
  ORIGAMI_ASSIGN_OR_RETURN(m->fuse_unk_, optional_bool(model, "fuse_unk", false, where + ": model"));
  ORIGAMI_ASSIGN_OR_RETURN(m->ignore_merges_, optional_bool(model, "ignore_merges", false, where + ": model"));
  m->cache_ = std::make_unique<Cache>();

  const auto& vocab = model["vocab"];
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 30)) {
      return invalid_file(where + ": model.vocab['" + token + "'] must be a non-negative integer id");
    }
    max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  }
  // Ids index tables of max_id + 1 entries: keep them in proportion to the vocabulary's size.
  if (max_id >= 2 * static_cast<int64_t>(vocab.size()) + 1024) {
    return invalid_file(where + ": model.vocab id " + std::to_string(max_id) + " leaves most ids unused (" +
                        std::to_string(vocab.size()) + " entries)");
  }
  m->tokens_.resize(static_cast<size_t>(max_id + 1));
  m->vocab_.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    const auto id = id_json.get<int32_t>();
    m->tokens_[id] = token;
    m->vocab_.emplace(token, id);
  }

  m->byte_ids_.fill(-1);
  m->fallback_byte_.assign(m->tokens_.size(), -1);
  if (byte_level) {
    m->byte_vocab_.reserve(vocab.size());
    for (size_t id = 0; id < m->tokens_.size(); ++id) {
      if (auto bytes = byte_level::decode(m->tokens_[id]); bytes && !bytes->empty()) {
        m->byte_vocab_.emplace(std::move(*bytes), static_cast<int32_t>(id));
      }
    }
    for (int b = 0; b < 256; ++b) {
      if (auto it = m->byte_vocab_.find(std::string(1, static_cast<char>(b))); it != m->byte_vocab_.end()) {
        m->byte_ids_[b] = it->second;
      }
    }
  } else {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (auto id = m->find(name)) {
        m->byte_ids_[b] = *id;
        if (m->byte_fallback_) m->fallback_byte_[*id] = static_cast<int16_t>(b);
      }
    }
  }

  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string unk = model["unk_token"];
    auto id = m->find(unk);
    if (!id) return invalid_file(where + ": model.unk_token '" + unk + "' is not in model.vocab");
    m->unk_id_ = *id;
  }

  const auto& merges = model["merges"];
  m->merges_ = std::make_unique<MergeTable>();
  m->merges_->reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    ORIGAMI_ASSIGN_OR_RETURN(auto pair, parse_merge(merges[i], i, where));
    const auto a = m->find(pair.first), b = m->find(pair.second), ab = m->find(pair.first + pair.second);
    if (!a || !b || !ab) {
      return invalid_file(where + ": model.merges[" + std::to_string(i) + "] ('" + pair.first + "', '" +
                          pair.second + "') uses or makes a token missing from model.vocab");
    }
    m->merges_->insert(*a, *b, static_cast<int32_t>(i), *ab);
  }
  return m;
}

std::optional<int32_t> BpeModel::find(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::optional<uint8_t> BpeModel::fallback_byte(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= fallback_byte_.size() || fallback_byte_[id] < 0) return std::nullopt;
  return static_cast<uint8_t>(fallback_byte_[id]);
}

void BpeModel::initial_symbols_chars(std::string_view word, std::vector<int32_t>& symbols) const {
  // A character missing from the vocab becomes its <0xXX> byte tokens (byte fallback) or unk;
  // consecutive unks fuse into one when fuse_unk is set.
  bool pending_unk = false;
  for (size_t pos = 0; pos < word.size();) {
    const size_t start = pos;
    unicode::next_code_point(word, pos);
    const std::string_view ch = word.substr(start, pos - start);
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      if (pending_unk) symbols.push_back(*unk_id_), pending_unk = false;
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all &= byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : ch) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) symbols.push_back(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) symbols.push_back(*unk_id_);
}

void BpeModel::merge_symbols(std::vector<int32_t>& ids) const {
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  // Doubly linked list over the symbols; a merge keeps the left index and removes the right.
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<int32_t> prev, next;
  thread_local std::vector<Candidate> heap;  // min-heap on (rank, pos)
  heap.clear();
  prev.resize(n);
  next.resize(n);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  const std::greater<> later;
  auto push = [&](int32_t pos) {
    const int32_t nx = next[pos];
    if (nx < 0) return;
    if (const auto* s = merges_->find(ids[pos], ids[nx])) {
      heap.push_back({s->rank, pos, s->merged});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    const int32_t pos = top.pos;
    if (ids[pos] < 0 || next[pos] < 0) continue;
    const int32_t right = next[pos];
    const auto* s = merges_->find(ids[pos], ids[right]);
    if (s == nullptr || s->merged != top.merged) continue;  // stale: a neighbour changed
    ids[pos] = top.merged;
    ids[right] = -1;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[next[pos]] = pos;
    if (prev[pos] >= 0) push(prev[pos]);
    push(pos);
  }
  int out = 0;
  for (int i = 0; i < n; ++i) {
    if (ids[i] >= 0) ids[out++] = ids[i];
  }
  ids.resize(out);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= Cache::kMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_->mutex);
    if (auto it = cache_->map.find(word); it != cache_->map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  bool whole = false;
  if (ignore_merges_) {
    const StringIdMap& map = byte_level_ ? byte_vocab_ : vocab_;
    if (auto it = map.find(word); it != map.end()) symbols.push_back(it->second), whole = true;
  }
  if (!whole) {
    if (byte_level_) {
      for (char c : word) {
        const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
        if (id >= 0) {
          symbols.push_back(id);
        } else if (unk_id_) {
          symbols.push_back(*unk_id_);
        }
      }
    } else {
      initial_symbols_chars(word, symbols);
    }
    merge_symbols(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cacheable) {
    std::unique_lock lock(cache_->mutex);
    if (cache_->map.size() < Cache::kCapacity) cache_->map.emplace(std::string(word), symbols);
  }
}

}  // namespace origami
