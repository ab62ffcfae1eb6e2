#pragma once
// A step's page tables as the paged kernels read them, flattened on the host for one upload:
// per (head group, sequence) row, group-major, the row's pages (CSR: page_indptr / page_indices),
// its KV length after the step, and per (group, token) the slot its new entry is written to.
//
// Why a pass of its own, with the page checks folded in: with per-head pages a request has one
// table per (layer, KV head) (288 for the Qwen3-8B shape), so a step of 256 requests walks 73,728
// tables. validate_forward_batch's per-table check read every page of every table, the backend's
// sizing pass walked the tables again and its copy a third time. Here the sizing pass reads each
// table's header once, request by request (a request's tables lie together), keeping what the
// copy needs in a compact array; the copy then reads each page once and writes every output in
// order, and the range check runs on the pages as they are copied
// (ForwardBatchLimits::check_page_tables = false tells validate_forward_batch that the backend
// does this; a failure is re-checked there for the message). What is left is memory traffic,
// about 10 ns a table on the hosts measured (docs/benchmarks.md).
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/forward_batch.h"

namespace origami {
namespace cpu {
class ThreadPool;
}

struct PageTableInputsSize {
  int64_t num_pages = 0;  // pages of every (group, sequence) row, padding rows excluded
  int max_kv_len = 0;     // the longest row after the step
  bool tables_cover = true;  // every table holds its entries (and none has a negative count)
};

// Where the flattened tables go (host memory; sizes from size() and the run shape).
struct PageTableInputsOut {
  int32_t* slots = nullptr;         // [num_groups][run_tokens]
  int32_t* page_indptr = nullptr;   // [num_groups * run_seqs + 1]
  int32_t* kv_len = nullptr;        // [num_groups * run_seqs]
  int32_t* page_indices = nullptr;  // [num_pages + num_groups * (run_seqs - num_seqs)]
};

struct PageTableInputsFill {
  int num_pages = 0;          // pages written, padding rows' null pages included
  bool pages_inside = true;   // every real row's page is a block in [1, num_blocks)
};

// One step's flattening: size() then fill() on the same batch. Keeps each row's page count
// between the two (and its scratch between steps). With num_threads > 1, a step with many tables
// (per-head pages: 73,728 at 256 requests of the Qwen3-8B shape) is flattened by a pool of that
// many threads (the calling one included), size() taking requests in turn and fill() groups.
class PageTableInputs {
 public:
  explicit PageTableInputs(int num_threads = 1);
  ~PageTableInputs();
  PageTableInputs(const PageTableInputs&) = delete;
  PageTableInputs& operator=(const PageTableInputs&) = delete;

  // Sizes the flattened tables of `batch` under `num_groups` head groups: reads each table's size,
  // not its pages.
  PageTableInputsSize size(const ForwardBatch& batch, int num_groups, int block_size);

  // Writes the rows of the batch just sized (whose tables covered), then, when run_seqs > its
  // sequences, padding rows: one null-block page, length 1, and slot -1 for token i of padding
  // row i (a captured decode graph: one token a row; its spare rows read one entry and write
  // nothing).
  PageTableInputsFill fill(const ForwardBatch& batch, int num_blocks, int run_seqs, int run_tokens,
                           const PageTableInputsOut& out);

 private:
  // fn(item) for every item in [0, items), on the pool when the step sized last is large.
  void run_items(int items, const std::function<void(int)>& fn);

  std::unique_ptr<cpu::ThreadPool> pool_;
  int num_groups_ = 1;
  int block_size_ = 1;
  int num_seqs_ = 0;
  // What fill() reads of each (sequence, group) table, request-major: its pages, its entries
  // before the step, the pages the step reaches.
  struct Row {
    const BlockId* pages;
    int32_t cached;
    int32_t num_pages;
  };
  std::vector<Row> rows_;
  std::vector<PageTableInputsSize> item_sizes_;  // per work item of size()
  std::vector<int64_t> item_group_pages_;        // [work item of size()][group]: its rows' pages
  std::vector<int64_t> group_start_;             // [group + 1]: where each group's rows start
  std::vector<char> item_inside_;                // per work item of fill()
};

}  // namespace origami
