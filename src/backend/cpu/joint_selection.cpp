#include "backend/cpu/joint_selection.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "backend/cpu/compression_ops.h"
#include "core/check.h"

namespace origami::cpu {
namespace {

// A candidate of the scope's top-k: one head's entry.
struct Candidate {
  float score;
  int entry;
  int head;  // position in scope
};

// select_keep's order, then the head listed first.
bool better(const Candidate& x, const Candidate& y) {
  if (x.score == y.score && x.entry == y.entry) return x.head < y.head;
  if (std::isnan(x.score) && std::isnan(y.score) && x.entry == y.entry) return x.head < y.head;
  return beats(x.score, x.entry, y.score, y.entry);
}

// Moves the best k of `c` to its front (any order among them).
void best_k_first(std::vector<Candidate>* c, size_t k) {
  if (k < c->size()) std::nth_element(c->begin(), c->begin() + static_cast<std::ptrdiff_t>(k), c->end(), better);
}

// One scope's counts (heads given by their indices in `heads`); page_size > 0: page-aligned.
void scope_counts(const std::vector<HeadSelectionScores>& heads, const std::vector<int>& scope, int mean_keep,
                  float alpha_safe, int page_size, std::vector<int>* counts) {
  const int floor_keep = static_cast<int>(std::floor(static_cast<double>(alpha_safe) * mean_keep));
  const long long scope_total = static_cast<long long>(mean_keep) * static_cast<long long>(scope.size());
  long long total = scope_total;  // what the guarantees leave to the scope's top-k
  // Each head's entries, best first.
  std::vector<std::vector<int>> order(scope.size());
  for (size_t i = 0; i < scope.size(); ++i) {
    const HeadSelectionScores& h = heads[static_cast<size_t>(scope[i])];
    std::vector<int>& o = order[i];
    o.resize(static_cast<size_t>(h.n));
    std::iota(o.begin(), o.end(), 0);
    std::sort(o.begin(), o.end(), [&](int a, int b) { return beats(h.scores[a], a, h.scores[b], b); });
    int protect = 0;
    for (int e = 0; e < h.n; ++e) protect += h.scores[e] == INFINITY ? 1 : 0;
    const int guaranteed = std::min(h.n, std::max(protect, floor_keep));
    (*counts)[static_cast<size_t>(scope[i])] = guaranteed;
    total -= guaranteed;
  }
  if (page_size > 0) {
    // Pages: the guarantees' pages, then the best page-opening entries (a head's entry of rank
    // k x b, 0-based, past its guarantees' pages) up to P pages, each head filling its pages.
    const long long b = page_size;
    long long guarantee_pages = 0;
    std::vector<Candidate> openers;
    for (size_t i = 0; i < scope.size(); ++i) {
      const HeadSelectionScores& h = heads[static_cast<size_t>(scope[i])];
      const long long g_pages = ((*counts)[static_cast<size_t>(scope[i])] + b - 1) / b;
      guarantee_pages += g_pages;
      for (long long r = g_pages * b; r < h.n; r += b)
        openers.push_back({h.scores[order[i][static_cast<size_t>(r)]], order[i][static_cast<size_t>(r)], static_cast<int>(i)});
      (*counts)[static_cast<size_t>(scope[i])] = static_cast<int>(g_pages);  // pages from here on
    }
    const long long scope_pages = std::max(scope_total / b, guarantee_pages);
    const size_t k = static_cast<size_t>(std::min<long long>(scope_pages - guarantee_pages, static_cast<long long>(openers.size())));
    best_k_first(&openers, k);
    for (size_t c = 0; c < k; ++c) ++(*counts)[static_cast<size_t>(scope[static_cast<size_t>(openers[c].head)])];
    for (size_t i = 0; i < scope.size(); ++i) {
      int& c = (*counts)[static_cast<size_t>(scope[i])];
      c = static_cast<int>(std::min<long long>(heads[static_cast<size_t>(scope[i])].n, c * b));
    }
    return;
  }
  if (total <= 0) return;
  // The remaining entries of every head: one top-k by (score, index, head listed first).
  std::vector<Candidate> rest;
  for (size_t i = 0; i < scope.size(); ++i) {
    const HeadSelectionScores& h = heads[static_cast<size_t>(scope[i])];
    for (size_t r = static_cast<size_t>((*counts)[static_cast<size_t>(scope[i])]); r < order[i].size(); ++r)
      rest.push_back({h.scores[order[i][r]], order[i][r], static_cast<int>(i)});
  }
  const size_t k = static_cast<size_t>(std::min<long long>(total, static_cast<long long>(rest.size())));
  best_k_first(&rest, k);
  // The chosen ones are each head's next-best (a head's order refines the scope's), so counting
  // them per head is enough.
  for (size_t c = 0; c < k; ++c) ++(*counts)[static_cast<size_t>(scope[static_cast<size_t>(rest[c].head)])];
}

}  // namespace

std::vector<int> joint_head_counts(KeepAllocation allocation, const std::vector<HeadSelectionScores>& heads,
                                   int mean_keep, float alpha_safe, int page_size) {
  ORIGAMI_CHECK(allocation != KeepAllocation::kUniform && mean_keep >= 0 && page_size >= 0);
  std::vector<int> counts(heads.size(), 0);
  std::map<int, std::vector<int>> scopes;  // layer (or 0 for every head) -> heads
  for (size_t i = 0; i < heads.size(); ++i)
    scopes[allocation == KeepAllocation::kLayer ? heads[i].layer : 0].push_back(static_cast<int>(i));
  for (const auto& entry : scopes) scope_counts(heads, entry.second, mean_keep, alpha_safe, page_size, &counts);
  return counts;
}

}  // namespace origami::cpu
