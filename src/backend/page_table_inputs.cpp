#include "backend/page_table_inputs.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_thread_pool.h"
#include "core/check.h"

namespace origami {
namespace {

// Below this many (sequence, group) rows a step flattens on the calling thread: waking the pool
// costs more than it saves (one group: a row per sequence).
constexpr size_t kParallelRows = 8192;
constexpr int kSeqsPerItem = 16;  // sequences per work item of the parallel passes
// A kept request copy unused for this many steps is dropped (its request finished, or waits).
constexpr uint64_t kKeptSteps = 64;

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

void PageTableInputs::read_tables(const SequenceInput& s, int num_groups, int block_size, Kept* k) {
  k->rows.resize(static_cast<size_t>(num_groups));
  k->pages.clear();
  k->max_base = 0;
  k->min_base = num_groups == 0 ? 0 : INT64_MAX;
  k->min_room_base = num_groups == 0 ? 0 : INT64_MAX;
  for (int g = 0; g < num_groups; ++g) {
    const BlockTable& table = s.kv->groups[static_cast<size_t>(g)];
    const int base = table.base_entries;
    k->rows[static_cast<size_t>(g)] = KeptRow{static_cast<int32_t>(k->pages.size()), base};
    k->pages.insert(k->pages.end(), table.blocks.begin(), table.blocks.end());
    k->max_base = std::max<int64_t>(k->max_base, base);
    k->min_base = std::min<int64_t>(k->min_base, base);
    k->min_room_base = std::min(k->min_room_base, static_cast<int64_t>(table.blocks.size()) * block_size - base);
  }
  k->version = s.kv->pages_version;
  k->checked = false;
}

PageTableInputsSize PageTableInputs::size(const ForwardBatch& batch, int num_groups, int block_size) {
  ++step_;
  num_groups_ = num_groups;
  block_size_ = block_size;
  num_seqs_ = static_cast<int>(batch.sequences.size());
  const int G = num_groups;
  rows_.resize(static_cast<size_t>(num_seqs_) * G);
  // Each versioned sequence's kept copy (one serial pass: the map is not shared between threads).
  // A request twice in one batch (never made by the engine) is read like an unversioned one.
  seq_kept_.assign(static_cast<size_t>(num_seqs_), nullptr);
  bool twice = false;
  for (int i = 0; i < num_seqs_; ++i) {
    const SequenceInput& s = batch.sequences[static_cast<size_t>(i)];
    if (!keep_copies_ || s.kv == nullptr || s.kv->pages_version == 0 || s.kv->groups.size() != static_cast<size_t>(G))
      continue;
    Kept& k = kept_[s.request_id];
    k.twice = k.last_step == step_;
    twice |= k.twice;
    k.last_step = step_;
    seq_kept_[static_cast<size_t>(i)] = &k;
  }
  if (twice)
    for (int i = 0; i < num_seqs_; ++i) {
      Kept*& k = seq_kept_[static_cast<size_t>(i)];
      if (k != nullptr && k->twice) {
        k->version = 0;  // read again when it comes back alone
        k = nullptr;
      }
    }
  const int items = num_items(num_seqs_);
  item_sizes_.assign(static_cast<size_t>(items), PageTableInputsSize{});
  item_reads_.assign(static_cast<size_t>(items), 0);
  const BlockMath bm(block_size);
  run_items(items, [&](int item) {
    const int first = item * kSeqsPerItem, last = std::min(num_seqs_, first + kSeqsPerItem);
    PageTableInputsSize size;  // summed here, stored once: items' sums share cache lines
    int64_t reads = 0;
    for (int i = first; i < last; ++i) {
      const SequenceInput& s = batch.sequences[static_cast<size_t>(i)];
      const int n = s.num_query_tokens;
      if (Kept* k = seq_kept_[static_cast<size_t>(i)]) {
        const bool current = k->version == s.kv->pages_version;
        if (current && verify_) {
          for (int g = 0; g < G; ++g) {
            const BlockTable& table = s.kv->groups[static_cast<size_t>(g)];
            const KeptRow& row = k->rows[static_cast<size_t>(g)];
            const int32_t end = g + 1 < G ? k->rows[static_cast<size_t>(g) + 1].start : static_cast<int32_t>(k->pages.size());
            ORIGAMI_CHECK_MSG(static_cast<size_t>(end - row.start) == table.blocks.size() &&
                                  std::equal(table.blocks.begin(), table.blocks.end(), k->pages.data() + row.start),
                              ("request " + std::to_string(s.request_id) + " group " + std::to_string(g) +
                                  ": its pages changed but its pages_version did not")
                                  .c_str());
            ORIGAMI_CHECK_MSG(row.base == table.base_entries,
                              ("request " + std::to_string(s.request_id) + " group " + std::to_string(g) +
                                  ": its count was set without a new pages_version")
                                  .c_str());
          }
        }
        // The version stands: every table holds its base plus the entries appended to all of
        // them (this step's included), in pages it already had (a new page moves the version).
        // Read again if not.
        const int64_t appended = s.kv->appended_to_every_table();
        if (!current || k->min_room_base - appended < 0) {
          read_tables(s, G, block_size, k);
          ++reads;
        }
        size.tables_cover &= k->min_base + appended - n >= 0 && k->min_room_base - appended >= 0;
        size.max_kv_len = static_cast<int>(std::max<int64_t>(size.max_kv_len, k->max_base + appended));
        size.num_pages += static_cast<int64_t>(k->pages.size());
        continue;
      }
      // Unversioned: what fill() needs of each table goes to rows_.
      ++reads;
      Row* row = rows_.data() + static_cast<size_t>(i) * G;
      for (int g = 0; g < G; ++g) {
        const std::vector<BlockId>& table = s.group_blocks(g);
        const int cached = s.group_cached_entries(g);
        const int64_t kv_len = static_cast<int64_t>(cached) + n;
        const int64_t pages = bm.pages(kv_len);
        size.tables_cover &= cached >= 0 && static_cast<int64_t>(table.size()) >= pages;
        const int32_t clamped = static_cast<int32_t>(std::min<int64_t>(pages, INT32_MAX));
        row[g] = Row{table.data(), cached, clamped};
        size.num_pages += pages;
        size.max_kv_len = static_cast<int>(std::max<int64_t>(size.max_kv_len, kv_len));
      }
    }
    item_sizes_[static_cast<size_t>(item)] = size;
    item_reads_[static_cast<size_t>(item)] = reads;
  });
  PageTableInputsSize size;
  for (size_t item = 0; item < item_sizes_.size(); ++item) {
    const PageTableInputsSize& part = item_sizes_[item];
    size.num_pages += part.num_pages;
    size.max_kv_len = std::max(size.max_kv_len, part.max_kv_len);
    size.tables_cover &= part.tables_cover;
    num_table_reads_ += item_reads_[item];
  }
  return size;
}

PageTableInputsFill PageTableInputs::fill(const ForwardBatch& batch, int num_blocks, int run_seqs, int run_tokens,
                                          const PageTableInputsOut& out) {
  PageTableInputsFill fill;
  const int num_seqs = num_seqs_;
  const int G = num_groups_, bs = block_size_;
  const BlockMath bm(bs);
  // Where each work item's pages start: sequence after sequence, then the padding rows.
  const int items = num_items(num_seqs);
  item_start_.resize(static_cast<size_t>(items) + 1);
  item_start_[0] = 0;
  for (int item = 0; item < items; ++item)
    item_start_[static_cast<size_t>(item) + 1] =
        item_start_[static_cast<size_t>(item)] + item_sizes_[static_cast<size_t>(item)].num_pages;
  // The range check (unsigned compare: block - 1 < num_blocks - 1 <=> 1 <= block < num_blocks) is
  // branch-free over the pages as they are copied.
  const uint32_t limit = num_blocks > 1 ? static_cast<uint32_t>(num_blocks - 1) : 0u;
  auto outside = [limit](const int32_t* pages, size_t n) {
    uint32_t any = 0;
    for (size_t p = 0; p < n; ++p) any |= static_cast<uint32_t>(static_cast<uint32_t>(pages[p] - 1) >= limit);
    return any != 0;
  };
  // Sequence by sequence, each work item a range of sequences: pages are written in order, and
  // each row's start, length and slots go to its (group, sequence) place, in arrays small enough
  // to stay in cache (a few hundred KB at 73,728 rows).
  item_inside_.assign(static_cast<size_t>(items), 1);
  run_items(items, [&](int item) {
    bool inside = true;
    int64_t count = item_start_[static_cast<size_t>(item)];
    const int first = item * kSeqsPerItem, last = std::min(num_seqs, first + kSeqsPerItem);
    // The item's pages, sequence after sequence, and where each sequence's rows start.
    int64_t base[kSeqsPerItem];
    int32_t appended[kSeqsPerItem];  // a kept sequence's RequestKV::appended_to_every_table
    for (int i = first; i < last; ++i) {
      base[i - first] = count;
      if (Kept* k = seq_kept_[static_cast<size_t>(i)]) {
        appended[i - first] = batch.sequences[static_cast<size_t>(i)].kv->appended_to_every_table();
        // The whole request at once: every page its tables hold (a row reads the ones it reaches).
        std::memcpy(out.page_indices + count, k->pages.data(), k->pages.size() * sizeof(int32_t));
        if (!k->checked) {
          k->checked = !outside(k->pages.data(), k->pages.size());
          inside &= k->checked;
        }
        count += static_cast<int64_t>(k->pages.size());
        continue;
      }
      const Row* row = rows_.data() + static_cast<size_t>(i) * G;
      for (int g = 0; g < G; ++g) {
        const Row& r = row[g];
        std::memcpy(out.page_indices + count, r.pages, static_cast<size_t>(r.num_pages) * sizeof(int32_t));
        inside &= !outside(r.pages, static_cast<size_t>(r.num_pages));
        count += r.num_pages;
      }
    }
    // The rows group by group over the item's sequences: the item's entries of each group's
    // starts, lengths and slots lie together (its 16 sequences fill a cache line of each), so the
    // writes go out in whole lines instead of one scattered word per row.
    int64_t row_offset[kSeqsPerItem] = {};
    for (int g = 0; g < G; ++g) {
      const size_t row0 = static_cast<size_t>(g) * run_seqs;
      int32_t* slots_g = out.slots + static_cast<size_t>(g) * run_tokens;
      for (int i = first; i < last; ++i) {
        const SequenceInput& s = batch.sequences[static_cast<size_t>(i)];
        const int n = s.num_query_tokens;
        const int32_t* pages;
        int32_t cached;
        if (Kept* k = seq_kept_[static_cast<size_t>(i)]) {
          const KeptRow row = k->rows[static_cast<size_t>(g)];
          cached = row.base + appended[i - first] - n;
          out.page_indptr[row0 + i] = static_cast<int32_t>(base[i - first] + row.start);
          pages = k->pages.data() + row.start;
        } else {
          const Row& r = rows_[static_cast<size_t>(i) * G + g];
          cached = r.cached;
          out.page_indptr[row0 + i] = static_cast<int32_t>(base[i - first] + row_offset[i - first]);
          row_offset[i - first] += r.num_pages;
          pages = r.pages;
        }
        out.kv_len[row0 + i] = cached + n;
        int32_t* slots = slots_g + s.query_start;
        for (int j = 0; j < n; ++j) {
          const int e = cached + j;
          slots[j] = pages[bm.page(e)] * bs + bm.offset(e);
        }
      }
    }
    item_inside_[static_cast<size_t>(item)] = inside ? 1 : 0;
  });
  // Padding rows (a graph's spare rows: token i of row i): one null page each, length 1, no write.
  int64_t count = item_start_[static_cast<size_t>(items)];
  for (int g = 0; g < G; ++g)
    for (int i = num_seqs; i < run_seqs; ++i) {
      const size_t at = static_cast<size_t>(g) * run_seqs + i;
      out.page_indices[count] = kNullBlock;
      out.page_indptr[at] = static_cast<int32_t>(count);
      ++count;
      out.kv_len[at] = 1;
      out.slots[static_cast<size_t>(g) * run_tokens + i] = -1;
    }
  out.page_indptr[static_cast<size_t>(G) * run_seqs] = static_cast<int32_t>(count);
  fill.num_pages = static_cast<int>(count);
  for (const char inside : item_inside_) fill.pages_inside &= inside != 0;
  // Requests not seen for a while have finished (or wait long): their copies go.
  if (step_ % kKeptSteps == 0)
    for (auto it = kept_.begin(); it != kept_.end();) it = it->second.last_step + kKeptSteps < step_ ? kept_.erase(it) : std::next(it);
  return fill;
}

}  // namespace origami
