#include "backend/page_table_inputs.h"

#include <algorithm>

#include "backend/cpu/cpu_thread_pool.h"

namespace origami {
namespace {

// Below this many (sequence, group) rows a step flattens on the calling thread: waking the pool
// costs more than it saves (one group: a row per sequence).
constexpr size_t kParallelRows = 8192;
constexpr int kSeqsPerItem = 16;  // sequences per work item of the parallel passes
constexpr int kGroupsPerItem = 8;  // groups per work item of fill()

int num_items(int num_seqs) { return (num_seqs + kSeqsPerItem - 1) / kSeqsPerItem; }

// Page arithmetic by a block size known only at run time: a power of two (every block size the
// engine is run with) shifts and masks instead of dividing, twice per table of a step (73,728 with
// per-head pages). The walk stays memory-bound either way (docs/benchmarks.md).
struct BlockMath {
  explicit BlockMath(int block_size) : size(block_size) {
    if (block_size > 0 && (block_size & (block_size - 1)) == 0)
      while ((1 << shift) < block_size) ++shift;
    else
      shift = -1;
  }
  int64_t pages(int64_t entries) const { return shift >= 0 ? (entries + size - 1) >> shift : (entries + size - 1) / size; }
  int page(int entry) const { return shift >= 0 ? entry >> shift : entry / size; }
  int offset(int entry) const { return shift >= 0 ? entry & (size - 1) : entry % size; }
  int size;
  int shift = 0;
};

}  // namespace

PageTableInputs::PageTableInputs(int num_threads) {
  if (num_threads > 1) pool_ = std::make_unique<cpu::ThreadPool>(num_threads);
}

PageTableInputs::~PageTableInputs() = default;

void PageTableInputs::run_items(int items, const std::function<void(int)>& fn) {
  if (pool_ != nullptr && static_cast<size_t>(num_seqs_) * num_groups_ >= kParallelRows) {
    cpu::parallel_for(pool_.get(), items, fn);
    return;
  }
  for (int item = 0; item < items; ++item) fn(item);
}

PageTableInputsSize PageTableInputs::size(const ForwardBatch& batch, int num_groups, int block_size) {
  num_groups_ = num_groups;
  block_size_ = block_size;
  num_seqs_ = static_cast<int>(batch.sequences.size());
  const size_t num_rows = static_cast<size_t>(num_seqs_) * num_groups;
  rows_.resize(num_rows);
  const int items = num_items(num_seqs_);
  item_sizes_.assign(static_cast<size_t>(items), PageTableInputsSize{});
  item_group_pages_.assign(static_cast<size_t>(items) * num_groups, 0);
  const BlockMath bm(block_size);
  // Each item's sequences, request by request (a request's tables lie together in its RequestKV).
  // What fill() needs of each table is kept in rows_, and each group's pages over the item's
  // requests in the item's own row of item_group_pages_ (where each group's rows start).
  run_items(items, [&](int item) {
    const int first = item * kSeqsPerItem, last = std::min(num_seqs_, first + kSeqsPerItem);
    PageTableInputsSize size;  // summed here, stored once: items' sums share cache lines
    int64_t* group_pages = item_group_pages_.data() + static_cast<size_t>(item) * num_groups;
    for (int i = first; i < last; ++i) {
      const SequenceInput& s = batch.sequences[static_cast<size_t>(i)];
      Row* row = rows_.data() + static_cast<size_t>(i) * num_groups;
      for (int g = 0; g < num_groups; ++g) {
        const std::vector<BlockId>& table = s.group_blocks(g);
        const int cached = s.group_cached_entries(g);
        const int64_t kv_len = static_cast<int64_t>(cached) + s.num_query_tokens;
        const int64_t pages = bm.pages(kv_len);
        size.tables_cover &= cached >= 0 && static_cast<int64_t>(table.size()) >= pages;
        const int32_t clamped = static_cast<int32_t>(std::min<int64_t>(pages, INT32_MAX));
        row[g] = Row{table.data(), cached, clamped};
        group_pages[g] += pages;
        size.num_pages += pages;
        size.max_kv_len = static_cast<int>(std::max<int64_t>(size.max_kv_len, kv_len));
      }
    }
    item_sizes_[static_cast<size_t>(item)] = size;
  });
  PageTableInputsSize size;
  for (const PageTableInputsSize& part : item_sizes_) {
    size.num_pages += part.num_pages;
    size.max_kv_len = std::max(size.max_kv_len, part.max_kv_len);
    size.tables_cover &= part.tables_cover;
  }
  return size;
}

PageTableInputsFill PageTableInputs::fill(const ForwardBatch& batch, int num_blocks, int run_seqs, int run_tokens,
                                          const PageTableInputsOut& out) {
  PageTableInputsFill fill;
  const int num_seqs = num_seqs_;
  const int G = num_groups_, bs = block_size_;
  const BlockMath bm(bs);
  // Where each group's rows start, group-major: a group's real rows, then its padding rows (one
  // null page each).
  group_start_.resize(static_cast<size_t>(G) + 1);
  group_start_[0] = 0;
  const int items = num_items(num_seqs);
  for (int g = 0; g < G; ++g) {
    int64_t pages = run_seqs - num_seqs;
    for (int item = 0; item < items; ++item) pages += item_group_pages_[static_cast<size_t>(item) * G + g];
    group_start_[static_cast<size_t>(g) + 1] = group_start_[static_cast<size_t>(g)] + pages;
  }
  fill.num_pages = static_cast<int>(group_start_[static_cast<size_t>(G)]);
  out.page_indptr[0] = 0;
  // The range check (unsigned compare: block - 1 < num_blocks - 1 <=> 1 <= block < num_blocks) is
  // branch-free over the pages as they are copied.
  const uint32_t limit = num_blocks > 1 ? static_cast<uint32_t>(num_blocks - 1) : 0u;
  // Group by group (every write in order), each work item a range of groups; what each table
  // needs was gathered by size() into rows_, which is small enough to stay in cache.
  const int group_items = (G + kGroupsPerItem - 1) / kGroupsPerItem;
  item_inside_.assign(static_cast<size_t>(group_items), 1);
  auto fill_groups = [&](int item) {
    bool inside = true;
    const int g_end = std::min(G, (item + 1) * kGroupsPerItem);
    for (int g = item * kGroupsPerItem; g < g_end; ++g) {
      const size_t row0 = static_cast<size_t>(g) * run_seqs;
      int count = static_cast<int>(group_start_[static_cast<size_t>(g)]);
      int32_t* indptr = out.page_indptr + row0 + 1;
      int32_t* kv_len = out.kv_len + row0;
      int32_t* slots = out.slots + static_cast<size_t>(g) * run_tokens;
      for (int i = 0; i < num_seqs; ++i) {
        const Row& r = rows_[static_cast<size_t>(i) * G + g];
        const SequenceInput& s = batch.sequences[static_cast<size_t>(i)];
        const BlockId* table = r.pages;
        int32_t* dst = out.page_indices + count;
        for (int p = 0; p < r.num_pages; ++p) {  // a few pages: no memmove call
          dst[p] = table[p];
          inside &= static_cast<uint32_t>(table[p] - 1) < limit;
        }
        count += r.num_pages;
        indptr[i] = count;
        for (int j = 0; j < s.num_query_tokens; ++j) {
          const int e = r.cached + j;
          slots[s.query_start + j] = table[bm.page(e)] * bs + bm.offset(e);
        }
        kv_len[i] = r.cached + s.num_query_tokens;
      }
      for (int i = num_seqs; i < run_seqs; ++i) {
        out.page_indices[count++] = kNullBlock;
        indptr[i] = count;
        kv_len[i] = 1;
        slots[i] = -1;
      }
    }
    item_inside_[static_cast<size_t>(item)] = inside ? 1 : 0;
  };
  run_items(group_items, fill_groups);
  for (const char inside : item_inside_) fill.pages_inside &= inside != 0;
  return fill;
}

}  // namespace origami
