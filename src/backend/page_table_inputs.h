#pragma once
// A step's page tables as the paged kernels read them, flattened on the host for one upload:
// per (head group, sequence) row, indexed group-major (row g * run_seqs + i), where the row's
// pages start in page_indices (page_indptr), its KV length after the step (kv_len), and per
// (group, token) the slot its new entry is written to. The kernels read a row's start and its
// length, never the next row's start, so the pages lie request-major: a sequence's rows one after
// another (a request's tables are copied together), padding rows' null pages last.
//
// Why a pass of its own, with the page checks folded in: with per-head pages a request has one
// table per (layer, KV head) (288 for the Qwen3-8B shape), so a step of 256 requests walks 73,728
// tables. validate_forward_batch's per-table check read every page of every table, the backend's
// sizing pass walked the tables again and its copy a third time. Here the sizing pass reads each
// table's header once, the copy each page once, and the range check runs on the pages as they
// are copied (ForwardBatchLimits::check_page_tables = false tells validate_forward_batch that the
// backend does this; a failure is re-checked there for the message).
//
// Why a copy kept between steps: even one read of every table is ~10 ns a table on the hosts
// measured (docs/benchmarks.md), while a decode step changes almost none of them: every table
// gains the step's token in a page it already has. A request whose tables carry a version
// (RequestKV::pages_version, moved by whoever changes a page) keeps its pages here, request-major,
// with each table's base count (BlockTable::base_entries); while the version stands, a step copies
// that block of pages and writes each row's length as its base plus the entries appended to every
// table since (RequestKV::appended_to_every_table, one number a request), and reads no table.
// Requests whose version is 0 (tables built by hand) and sequences without a RequestKV are read
// every step.
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/forward_batch.h"

namespace origami {
namespace cpu {
class ThreadPool;
}

struct PageTableInputsSize {
  int64_t num_pages = 0;  // pages of every sequence written by fill(), padding rows excluded
  int max_kv_len = 0;     // the longest row after the step
  bool tables_cover = true;  // every table holds its entries (and none has a negative count)
};

// Where the flattened tables go (host memory; sizes from size() and the run shape).
struct PageTableInputsOut {
  int32_t* slots = nullptr;         // [num_groups][run_tokens]
  int32_t* page_indptr = nullptr;   // [num_groups * run_seqs + 1]: each row's start, then the total
  int32_t* kv_len = nullptr;        // [num_groups * run_seqs]
  int32_t* page_indices = nullptr;  // [num_pages + num_groups * (run_seqs - num_seqs)]
};

struct PageTableInputsFill {
  int num_pages = 0;          // pages written, padding rows' null pages included
  bool pages_inside = true;   // every real row's page is a block in [1, num_blocks)
};

// One step's flattening: size() then fill() on the same batch. Keeps each row's page count
// between the two, its scratch between steps, and the versioned requests' pages (above). With
// num_threads > 1, a step with many tables (per-head pages: 73,728 at 256 requests of the
// Qwen3-8B shape) is flattened by a pool of that many threads (the calling one included), each
// work item a range of sequences.
class PageTableInputs {
 public:
  explicit PageTableInputs(int num_threads = 1);
  ~PageTableInputs();
  PageTableInputs(const PageTableInputs&) = delete;
  PageTableInputs& operator=(const PageTableInputs&) = delete;

  // Sizes the flattened tables of `batch` under `num_groups` head groups: reads each table's size,
  // not its pages (the pages of a versioned request whose version moved are copied here).
  PageTableInputsSize size(const ForwardBatch& batch, int num_groups, int block_size);

  // Writes the rows of the batch just sized (whose tables covered), then, when run_seqs > its
  // sequences, padding rows: one null-block page, length 1, and slot -1 for token i of padding
  // row i (a captured decode graph: one token a row; its spare rows read one entry and write
  // nothing). Call it after size() on the same batch.
  PageTableInputsFill fill(const ForwardBatch& batch, int num_blocks, int run_seqs, int run_tokens,
                           const PageTableInputsOut& out);

  // Checks every kept request against its tables at each size() (pages and lengths), failing an
  // internal check on a difference: the tests, and GPU runs under
  // ORIGAMI_VERIFY_PAGE_TABLE_COPIES=1, use it to find a change that did not move the version.
  void set_verify(bool verify) { verify_ = verify; }
  // Off: every table is read every step (the benchmarks' baseline).
  void set_keep_copies(bool keep) { keep_copies_ = keep; }
  // Kept requests, and the steps that read a request's tables (tests and benchmarks).
  size_t num_kept() const { return kept_.size(); }
  int64_t num_table_reads() const { return num_table_reads_; }

 private:
  // fn(item) for every item in [0, items), on the pool when the step sized last is large.
  void run_items(int items, const std::function<void(int)>& fn);

  // A table of a kept request: where its pages start in Kept::pages, and its base count
  // (BlockTable::base_entries; its entries are that plus the request's appended ones). Side by
  // side, so that a row's fill reads one array of the request's, not two.
  struct KeptRow {
    int32_t start;
    int32_t base;
  };
  // A versioned request's pages as the last step that read its tables found them.
  struct Kept {
    uint64_t version = 0;       // RequestKV::pages_version they were read under (0: none yet)
    uint64_t last_step = 0;     // the last step it ran in (kept ones unused for long are dropped)
    bool checked = false;       // its pages were range-checked since they were read
    bool twice = false;         // its request came twice in the step sized last
    std::vector<int32_t> pages;  // every page of every table, table after table
    std::vector<KeptRow> rows;   // [groups]
    // Over its tables, in base counts: the most and the fewest entries, and the least room left in
    // the pages they hold. Every table gains the same appended entries while the version stands,
    // so with RequestKV::appended_to_every_table each answers for all of them at any step.
    int64_t max_base = 0;
    int64_t min_base = 0;
    int64_t min_room_base = 0;
  };
  // Reads a request's tables into `k`.
  static void read_tables(const SequenceInput& s, int num_groups, int block_size, Kept* k);

  std::unique_ptr<cpu::ThreadPool> pool_;
  bool verify_ = false;
  bool keep_copies_ = true;
  int num_groups_ = 1;
  int block_size_ = 1;
  int num_seqs_ = 0;
  uint64_t step_ = 0;
  int64_t num_table_reads_ = 0;
  std::unordered_map<uint64_t, Kept> kept_;  // by request id
  std::vector<Kept*> seq_kept_;              // per sequence of the step: its kept copy, or null
  // What fill() reads of each table of an unversioned sequence, sequence-major: its pages, its
  // entries before the step, the pages the step reaches.
  struct Row {
    const BlockId* pages;
    int32_t cached;
    int32_t num_pages;
  };
  std::vector<Row> rows_;
  std::vector<PageTableInputsSize> item_sizes_;  // per work item of size()
  std::vector<int64_t> item_reads_;              // per work item of size(): sequences whose tables it read
  std::vector<int64_t> item_start_;              // [work item + 1]: where each item's pages start
  std::vector<char> item_inside_;                // per work item of fill()
};

}  // namespace origami
