// The step's page tables flattened for the paged kernels (page_table_inputs.h): the rows, pages,
// lengths and slots equal a brute-force flattening of the same tables, padding rows read the null
// block and write nothing, and the folded checks (tables cover their entries, pages inside the
// pool) accept exactly the batches validate_forward_batch's own page-table check accepts.
#include "backend/page_table_inputs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include "backend/forward_batch_validation.h"

namespace origami {
namespace {

constexpr int kBlock = 4;
constexpr int kNumBlocks = 64;

// `seqs` sequences over `groups` head groups; sequence s has s % 3 + 1 new tokens (a prefill chunk
// or a decode; decode: one each, as a graph's batch) and each group its own cached count, tables
// with exactly the pages they need plus `spare` more.
struct Batch {
  Batch(int seqs, int groups, std::mt19937& rng, int spare = 0, bool decode = false) : kvs(static_cast<size_t>(seqs)) {
    std::uniform_int_distribution<int> cached(0, 13), block(1, kNumBlocks - 1);
    int token = 0;
    for (int s = 0; s < seqs; ++s) {
      RequestKV& kv = kvs[static_cast<size_t>(s)];
      const int num_new = decode ? 1 : s % 3 + 1;
      kv.groups.resize(static_cast<size_t>(groups));
      for (int g = 0; g < groups; ++g) {
        BlockTable& t = kv.groups[static_cast<size_t>(g)];
        kv.set_num_entries(static_cast<size_t>(g), cached(rng) + num_new);
        const int pages = (kv.num_entries(static_cast<size_t>(g)) + kBlock - 1) / kBlock + spare;
        for (int p = 0; p < pages; ++p) t.blocks.push_back(block(rng));
      }
      SequenceInput in;
      in.request_id = 100 + static_cast<uint64_t>(s);
      in.query_start = token;
      in.num_query_tokens = num_new;
      in.num_cached_entries = kv.num_entries(0) - num_new;
      in.start_position = in.num_cached_entries;
      in.block_table = &kv.groups[0].blocks;
      in.kv = &kv;
      in.sampling = &sampling;
      for (int j = 0; j < num_new; ++j) {
        batch.token_ids.push_back(7);
        batch.positions.push_back(in.start_position + j);
      }
      token += num_new;
      batch.sequences.push_back(in);
    }
  }
  std::vector<RequestKV> kvs;
  SamplingParams sampling;
  ForwardBatch batch;
};

struct Flat {
  std::vector<int32_t> slots, page_indptr, kv_len, page_indices;
};

// One step through `tables` (kept between calls by the tests of kept copies), into buffers
// poisoned with -7 and sized as the backend sizes them (the pages + a row each).
Flat flatten_with(PageTableInputs& tables, const ForwardBatch& batch, int groups, int run_seqs, int run_tokens,
                  PageTableInputsFill* fill, PageTableInputsSize* sized = nullptr) {
  const PageTableInputsSize size = tables.size(batch, groups, kBlock);
  if (sized != nullptr) *sized = size;
  Flat f;
  f.slots.assign(static_cast<size_t>(groups) * run_tokens, -7);
  f.page_indptr.assign(static_cast<size_t>(groups) * run_seqs + 1, -7);
  f.kv_len.assign(static_cast<size_t>(groups) * run_seqs, -7);
  f.page_indices.assign(static_cast<size_t>(size.num_pages) + static_cast<size_t>(groups) * run_seqs, -7);
  *fill = tables.fill(batch, kNumBlocks, run_seqs, run_tokens,
                      {f.slots.data(), f.page_indptr.data(), f.kv_len.data(), f.page_indices.data()});
  return f;
}

Flat flatten(const ForwardBatch& batch, int groups, int run_seqs, int run_tokens, PageTableInputsFill* fill) {
  PageTableInputs tables;
  return flatten_with(tables, batch, groups, run_seqs, run_tokens, fill);
}

ForwardBatchLimits limits(int groups) {
  ForwardBatchLimits l;
  l.vocab_size = 100;
  l.block_size = kBlock;
  l.num_blocks = kNumBlocks;
  l.num_query_slots = -1;
  l.num_groups = groups;
  return l;
}

TEST(PageTableInputs, EqualABruteForceFlatteningWithPaddingRows) {
  std::mt19937 rng(3);
  for (int groups : {1, 3, 8})
    for (const bool decode : {false, true}) {
    Batch b(5, groups, rng, /*spare=*/1, decode);
    const int num_tokens = static_cast<int>(b.batch.token_ids.size());
    // Padding rows come with decode graphs only (token i of row i); a mixed batch runs as it is.
    const int run_seqs = decode ? 8 : 5, run_tokens = decode ? 8 : num_tokens;
    PageTableInputsFill fill;
    const Flat f = flatten(b.batch, groups, run_seqs, run_tokens, &fill);
    EXPECT_TRUE(fill.pages_inside);
    // Brute force: sequence after sequence (request-major), row (g, i) lists the pages its
    // entries after the step reach, nothing more, from the start page_indptr gives it; then the
    // padding rows' null pages.
    size_t page = 0;
    for (int i = 0; i < run_seqs; ++i) {
      if (i >= 5) continue;
      const SequenceInput& s = b.batch.sequences[static_cast<size_t>(i)];
      for (int g = 0; g < groups; ++g) {
        const size_t row = static_cast<size_t>(g) * run_seqs + i;
        const BlockTable& t = b.kvs[static_cast<size_t>(i)].groups[static_cast<size_t>(g)];
        const int entries = b.kvs[static_cast<size_t>(i)].num_entries(static_cast<size_t>(g));
        ASSERT_EQ(f.kv_len[row], entries);
        ASSERT_EQ(f.page_indptr[row], static_cast<int32_t>(page));
        for (int e = 0; e < entries; e += kBlock) ASSERT_EQ(f.page_indices[page++], t.blocks[e / kBlock]);
        for (int j = 0; j < s.num_query_tokens; ++j) {
          const int e = entries - s.num_query_tokens + j;
          ASSERT_EQ(f.slots[static_cast<size_t>(g) * run_tokens + s.query_start + j],
                    t.blocks[e / kBlock] * kBlock + e % kBlock);
        }
      }
    }
    for (int g = 0; g < groups; ++g)
      for (int i = 5; i < run_seqs; ++i) {
        const size_t row = static_cast<size_t>(g) * run_seqs + i;
        ASSERT_EQ(f.kv_len[row], 1);
        ASSERT_EQ(f.page_indptr[row], static_cast<int32_t>(page));
        ASSERT_EQ(f.page_indices[page++], kNullBlock);
        ASSERT_EQ(f.slots[static_cast<size_t>(g) * run_tokens + i], -1);
      }
    ASSERT_EQ(f.page_indptr[static_cast<size_t>(groups) * run_seqs], static_cast<int32_t>(page));
    EXPECT_EQ(fill.num_pages, static_cast<int>(page));
    // Nothing written past them (the buffer has the backend's capacity: the pages + a row each).
    for (size_t p = page; p < f.page_indices.size(); ++p) ASSERT_EQ(f.page_indices[p], -7);
    }
}

TEST(PageTableInputs, SizeCountsThePagesAndTheLongestRow) {
  std::mt19937 rng(5);
  Batch b(6, 4, rng, /*spare=*/2);
  const PageTableInputsSize size = PageTableInputs().size(b.batch, 4, kBlock);
  int64_t pages = 0;
  int longest = 0;
  for (const RequestKV& kv : b.kvs)
    for (size_t g = 0; g < kv.groups.size(); ++g) {
      pages += (kv.num_entries(g) + kBlock - 1) / kBlock;
      longest = std::max(longest, kv.num_entries(g));
    }
  EXPECT_TRUE(size.tables_cover);
  EXPECT_EQ(size.num_pages, pages);
  EXPECT_EQ(size.max_kv_len, longest);
}

// The folded checks accept a batch exactly when validate_forward_batch's page-table check does,
// over random corruptions: a table one page short, a block outside the pool, the null block, a
// negative count; the rest of the batch stays valid.
TEST(PageTableInputs, FoldedChecksAgreeWithTheValidator) {
  std::mt19937 rng(11);
  int rejected = 0, accepted = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int groups = 1 + trial % 5;
    Batch b(1 + trial % 7, groups, rng);
    std::uniform_int_distribution<int> pick_seq(0, static_cast<int>(b.kvs.size()) - 1), pick_group(0, groups - 1),
        kind(0, 4);
    RequestKV& kv = b.kvs[static_cast<size_t>(pick_seq(rng))];
    BlockTable& t = kv.groups[static_cast<size_t>(pick_group(rng))];
    switch (kind(rng)) {
      case 0: break;  // untouched
      case 1: t.blocks.pop_back(); break;
      case 2: t.blocks[rng() % t.blocks.size()] = kNumBlocks + static_cast<int>(rng() % 3); break;
      case 3: t.blocks[rng() % t.blocks.size()] = kNullBlock; break;
      case 4: t.blocks[rng() % t.blocks.size()] = -1 - static_cast<int>(rng() % 5); break;
    }
    // Group 0's count lives in the sequence (num_cached_entries), the others' in their tables.
    for (size_t s = 0; s < b.kvs.size(); ++s)
      b.batch.sequences[s].num_cached_entries = b.kvs[s].num_entries(0) - b.batch.sequences[s].num_query_tokens;
    const bool valid = validate_forward_batch(b.batch, limits(groups)).is_ok();
    ForwardBatchLimits skip = limits(groups);
    skip.check_page_tables = false;
    ASSERT_TRUE(validate_forward_batch(b.batch, skip).is_ok()) << "only the page tables were corrupted";
    const PageTableInputsSize size = PageTableInputs().size(b.batch, groups, kBlock);
    bool folded = size.tables_cover;
    if (folded) {
      PageTableInputsFill fill;
      (void)flatten(b.batch, groups, static_cast<int>(b.kvs.size()), static_cast<int>(b.batch.token_ids.size()), &fill);
      folded = fill.pages_inside;
    }
    ASSERT_EQ(folded, valid) << "trial " << trial;
    (valid ? accepted : rejected) += 1;
  }
  // Both outcomes were exercised.
  EXPECT_GT(accepted, 50);
  EXPECT_GT(rejected, 50);
}

// A step with many tables is flattened by the pool, sequences split among its threads: the same
// inputs as one thread, and a bad page in any work item is found.
TEST(PageTableInputs, ThreadsFlattenAsOneThreadDoes) {
  std::mt19937 rng(17);
  Batch b(70, 144, rng, /*spare=*/0, /*decode=*/true);  // 10,080 rows: above the parallel threshold
  const int run_seqs = 72, run_tokens = 72;
  auto flat = [&](PageTableInputs& tables, PageTableInputsFill* fill) {
    const PageTableInputsSize size = tables.size(b.batch, 144, kBlock);
    EXPECT_TRUE(size.tables_cover);
    Flat f;
    f.slots.assign(static_cast<size_t>(144) * run_tokens, -7);
    f.page_indptr.assign(static_cast<size_t>(144) * run_seqs + 1, -7);
    f.kv_len.assign(static_cast<size_t>(144) * run_seqs, -7);
    f.page_indices.assign(static_cast<size_t>(size.num_pages) + 144 * run_seqs, -7);
    *fill = tables.fill(b.batch, kNumBlocks, run_seqs, run_tokens,
                        {f.slots.data(), f.page_indptr.data(), f.kv_len.data(), f.page_indices.data()});
    return f;
  };
  PageTableInputs one(1), three(3);
  PageTableInputsFill fill_one, fill_three;
  const Flat a = flat(one, &fill_one), c = flat(three, &fill_three);
  EXPECT_TRUE(fill_one.pages_inside);
  EXPECT_TRUE(fill_three.pages_inside);
  EXPECT_EQ(fill_one.num_pages, fill_three.num_pages);
  EXPECT_EQ(a.slots, c.slots);
  EXPECT_EQ(a.page_indptr, c.page_indptr);
  EXPECT_EQ(a.kv_len, c.kv_len);
  EXPECT_EQ(a.page_indices, c.page_indices);
  // A block outside the pool in the last request's last table.
  b.kvs.back().groups.back().blocks.back() = kNumBlocks;
  (void)flat(three, &fill_three);
  EXPECT_FALSE(fill_three.pages_inside);
}

TEST(PageTableInputs, NoPageIsInsideAPoolOfOnlyTheNullBlock) {
  std::mt19937 rng(2);
  Batch b(2, 2, rng);
  PageTableInputs tables;
  const PageTableInputsSize size = tables.size(b.batch, 2, kBlock);
  ASSERT_TRUE(size.tables_cover);
  Flat f;
  f.slots.assign(64, 0);
  f.page_indptr.assign(8, 0);
  f.kv_len.assign(8, 0);
  f.page_indices.assign(static_cast<size_t>(size.num_pages), 0);
  const PageTableInputsFill fill =
      tables.fill(b.batch, /*num_blocks=*/1, 2, static_cast<int>(b.batch.token_ids.size()),
                  {f.slots.data(), f.page_indptr.data(), f.kv_len.data(), f.page_indices.data()});
  EXPECT_FALSE(fill.pages_inside);
}

TEST(PageTableInputs, ANegativeCountDoesNotCover) {
  std::mt19937 rng(9);
  Batch b(3, 2, rng);
  b.kvs[1].set_num_entries(1, 0);  // 0 entries with a new token: cached = -1
  EXPECT_FALSE(PageTableInputs().size(b.batch, 2, kBlock).tables_cover);
  EXPECT_FALSE(validate_forward_batch(b.batch, limits(2)).is_ok());
}

// ---- Kept copies of versioned requests' tables (RequestKV::pages_version) ----

// Requests whose tables change as the engine changes them: every step each table gains the step's
// tokens, a table that runs out of room gets a page (and the request a new version), now and then
// a request is compacted (new pages and counts, new version), requests finish and others are
// admitted, and the batch order moves. `pool` hands out blocks 1.. in turn (kNumBlocks is the
// bound the fill checks against).
struct LiveRequests {
  explicit LiveRequests(int groups) : groups(groups) {}
  struct Live {
    uint64_t id;
    RequestKV kv;
  };
  int groups;
  std::vector<std::unique_ptr<Live>> live;
  uint64_t next_id = 1;
  BlockId next_block = 1;
  BlockId block() {
    const BlockId b = next_block;
    next_block = next_block + 1 < kNumBlocks ? next_block + 1 : 1;
    return b;
  }
  void admit(std::mt19937& rng) {
    auto r = std::make_unique<Live>();
    r->id = next_id++;
    r->kv.groups.resize(static_cast<size_t>(groups));
    std::uniform_int_distribution<int> entries(0, 9);
    for (size_t g = 0; g < r->kv.groups.size(); ++g) {
      r->kv.set_num_entries(g, entries(rng));
      for (int p = 0; p * kBlock < r->kv.num_entries(g); ++p) r->kv.groups[g].blocks.push_back(block());
    }
    r->kv.tables_changed();
    live.push_back(std::move(r));
  }
  // Adds n entries to every table, as KVCacheManager::grow_tables does: in place when every table
  // has room (one number for all of them, no new version), else pages are added and the version
  // moves.
  void grow(Live& r, int n) {
    bool room = true;
    for (size_t g = 0; g < r.kv.groups.size(); ++g)
      room &= r.kv.num_entries(g) + n <= static_cast<int>(r.kv.groups[g].blocks.size()) * kBlock;
    if (room) {
      r.kv.append_to_every_table(n);
      return;
    }
    for (size_t g = 0; g < r.kv.groups.size(); ++g) {
      r.kv.set_num_entries(g, r.kv.num_entries(g) + n);
      BlockTable& t = r.kv.groups[g];
      while (static_cast<int>(t.blocks.size()) * kBlock < r.kv.num_entries(g)) t.blocks.push_back(block());
    }
    r.kv.tables_changed();
  }
  // A compaction: each table keeps a few entries in fresh pages.
  void compact(Live& r, std::mt19937& rng) {
    std::uniform_int_distribution<int> keep(1, 6);
    for (size_t g = 0; g < r.kv.groups.size(); ++g) {
      r.kv.set_num_entries(g, std::min(r.kv.num_entries(g), keep(rng)));
      BlockTable& t = r.kv.groups[g];
      t.blocks.clear();
      for (int p = 0; p * kBlock < r.kv.num_entries(g); ++p) t.blocks.push_back(block());
    }
    r.kv.tables_changed();
  }
};

// The step's batch over `order` (indices into live), each with n new tokens; grows the tables first.
ForwardBatch step_batch(LiveRequests& lr, const std::vector<size_t>& order, const std::vector<int>& n,
                        const SamplingParams* sampling) {
  ForwardBatch batch;
  int token = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    LiveRequests::Live& r = *lr.live[order[k]];
    lr.grow(r, n[k]);
    SequenceInput in;
    in.request_id = r.id;
    in.query_start = token;
    in.num_query_tokens = n[k];
    in.num_cached_entries = r.kv.num_entries(0) - n[k];
    in.start_position = in.num_cached_entries;
    in.block_table = &r.kv.groups[0].blocks;
    in.kv = &r.kv;
    in.sampling = sampling;
    for (int j = 0; j < n[k]; ++j) {
      batch.token_ids.push_back(7);
      batch.positions.push_back(in.start_position + j);
    }
    token += n[k];
    batch.sequences.push_back(in);
  }
  return batch;
}

// What the kernels read of the flattened step equals the tables: every row's length, the pages
// its entries reach from the start page_indptr gives it (inside the pages written), the slots of
// its new entries; padding rows read one null page and write nothing.
void expect_reads_the_tables(const ForwardBatch& batch, int groups, int run_seqs, int run_tokens, const Flat& f,
                             const PageTableInputsFill& fill) {
  const int num_seqs = static_cast<int>(batch.sequences.size());
  ASSERT_EQ(f.page_indptr[static_cast<size_t>(groups) * run_seqs], fill.num_pages);
  for (int g = 0; g < groups; ++g)
    for (int i = 0; i < run_seqs; ++i) {
      const size_t row = static_cast<size_t>(g) * run_seqs + i;
      const int32_t start = f.page_indptr[row];
      if (i >= num_seqs) {
        ASSERT_EQ(f.kv_len[row], 1);
        ASSERT_GE(start, 0);
        ASSERT_LT(start, fill.num_pages);
        ASSERT_EQ(f.page_indices[static_cast<size_t>(start)], kNullBlock);
        ASSERT_EQ(f.slots[static_cast<size_t>(g) * run_tokens + i], -1);
        continue;
      }
      const SequenceInput& s = batch.sequences[static_cast<size_t>(i)];
      const BlockTable& t = s.kv->groups[static_cast<size_t>(g)];
      const int entries = s.kv->num_entries(static_cast<size_t>(g));
      ASSERT_EQ(f.kv_len[row], entries) << "seq " << i << " group " << g;
      const int pages = (entries + kBlock - 1) / kBlock;
      ASSERT_GE(start, 0);
      ASSERT_LE(start + pages, fill.num_pages);
      for (int p = 0; p < pages; ++p)
        ASSERT_EQ(f.page_indices[static_cast<size_t>(start + p)], t.blocks[static_cast<size_t>(p)])
            << "seq " << i << " group " << g << " page " << p;
      for (int j = 0; j < s.num_query_tokens; ++j) {
        const int e = entries - s.num_query_tokens + j;
        ASSERT_EQ(f.slots[static_cast<size_t>(g) * run_tokens + s.query_start + j],
                  t.blocks[static_cast<size_t>(e / kBlock)] * kBlock + e % kBlock);
      }
    }
}

// 300 steps of admissions, finishes, reorders, prefill chunks and decodes, pages added and
// compactions, flattened by one PageTableInputs kept across the steps (one thread, and a pool
// over enough rows for the parallel passes): every step reads as the tables say, and a request's
// tables are read only in the steps where its version moved (or it is new to the copies).
TEST(PageTableInputs, KeptCopiesFollowVersionedTablesStepAfterStep) {
  for (const int threads : {1, 3}) {
    const int groups = threads == 1 ? 6 : 144;  // 144 x 64+: above the parallel threshold
    std::mt19937 rng(23);
    LiveRequests lr(groups);
    for (int r = 0; r < 60; ++r) lr.admit(rng);
    PageTableInputs tables(threads);
    SamplingParams sampling;
    int64_t expected_reads = 0;
    std::unordered_map<uint64_t, uint64_t> seen_version;  // request id -> version last flattened
    std::uniform_real_distribution<double> u(0, 1);
    for (int step = 0; step < 300; ++step) {
      // Finishes and admissions now and then; the order shuffled now and then.
      if (u(rng) < 0.1 && lr.live.size() > 40) lr.live.erase(lr.live.begin() + static_cast<long>(rng() % lr.live.size()));
      if (u(rng) < 0.1) lr.admit(rng);
      std::vector<size_t> order(lr.live.size());
      for (size_t k = 0; k < order.size(); ++k) order[k] = k;
      if (u(rng) < 0.2) std::shuffle(order.begin(), order.end(), rng);
      // Now and then a request sits a step out (waiting for a compression or a slot).
      std::vector<size_t> ran;
      for (size_t k : order)
        if (u(rng) > 0.05) ran.push_back(k);
      for (size_t k : ran)
        if (u(rng) < 0.03) lr.compact(*lr.live[k], rng);
      const bool decode = u(rng) < 0.7;
      std::vector<int> n(ran.size());
      for (int& x : n) x = decode ? 1 : 1 + static_cast<int>(rng() % 5);
      const ForwardBatch batch = step_batch(lr, ran, n, &sampling);
      // Graph-like padding on decode steps.
      const int num_seqs = static_cast<int>(ran.size());
      const int run_seqs = decode ? num_seqs + 3 : num_seqs;
      const int run_tokens = decode ? run_seqs : static_cast<int>(batch.token_ids.size());
      const int64_t reads_before = tables.num_table_reads();
      PageTableInputsFill fill;
      PageTableInputsSize size;
      const Flat f = flatten_with(tables, batch, groups, run_seqs, run_tokens, &fill, &size);
      ASSERT_TRUE(size.tables_cover);
      ASSERT_TRUE(fill.pages_inside);
      expect_reads_the_tables(batch, groups, run_seqs, run_tokens, f, fill);
      if (HasFatalFailure()) return;
      // Reads: the requests whose version moved since the copy was last taken (in this step's
      // growth, a compaction, or before: new requests).
      int64_t moved = 0;
      for (size_t k = 0; k < ran.size(); ++k) {
        const uint64_t v = lr.live[ran[k]]->kv.pages_version;
        moved += seen_version[lr.live[ran[k]]->id] != v ? 1 : 0;
        seen_version[lr.live[ran[k]]->id] = v;
      }
      expected_reads += moved;
      EXPECT_EQ(tables.num_table_reads() - reads_before, moved) << "step " << step;
    }
    EXPECT_EQ(tables.num_table_reads(), expected_reads);
    EXPECT_LE(tables.num_kept(), lr.live.size() + 200u);  // finished requests' copies are dropped
  }
}

// Two sequences of one request id (the engine never makes such a batch): both are read from their
// tables, and the request is read again when it comes back alone.
TEST(PageTableInputs, ARequestTwiceInABatchIsReadFromItsTables) {
  std::mt19937 rng(37);
  LiveRequests lr(3);
  for (int r = 0; r < 2; ++r) lr.admit(rng);
  lr.live[1]->id = lr.live[0]->id;
  SamplingParams sampling;
  PageTableInputs tables;
  for (int step = 0; step < 3; ++step) {
    const std::vector<size_t> order = step == 1 ? std::vector<size_t>{0} : std::vector<size_t>{0, 1};
    const std::vector<int> n(order.size(), 1);
    const ForwardBatch batch = step_batch(lr, order, n, &sampling);
    PageTableInputsFill fill;
    const int seqs = static_cast<int>(order.size());
    const Flat f = flatten_with(tables, batch, 3, seqs, seqs, &fill);
    expect_reads_the_tables(batch, 3, seqs, seqs, f, fill);
  }
}

// A change the version does not report is what the verification finds: a page swapped in a
// kept request's table without tables_changed().
TEST(PageTableInputsDeathTest, VerificationFindsAPageChangedWithoutANewVersion) {
  std::mt19937 rng(31);
  LiveRequests lr(4);
  for (int r = 0; r < 3; ++r) lr.admit(rng);
  SamplingParams sampling;
  PageTableInputs tables;
  tables.set_verify(true);
  PageTableInputsFill fill;
  const std::vector<size_t> order = {0, 1, 2};
  (void)flatten_with(tables, step_batch(lr, order, {1, 1, 1}, &sampling), 4, 3, 3, &fill);
  // Room for the next token everywhere, so the growth itself moves no version.
  for (auto& r : lr.live)
    for (BlockTable& t : r->kv.groups) t.blocks.push_back(lr.block());
  for (auto& r : lr.live) r->kv.tables_changed();
  (void)flatten_with(tables, step_batch(lr, order, {1, 1, 1}, &sampling), 4, 3, 3, &fill);
  lr.live[1]->kv.groups[2].blocks[0] = lr.block();  // unreported
  EXPECT_DEATH((void)flatten_with(tables, step_batch(lr, order, {1, 1, 1}, &sampling), 4, 3, 3, &fill),
               "its pages changed but its pages_version did not");
}

// A count set (a compaction's) without tables_changed(): the row's length would be the kept base
// plus the appended entries, which the verification finds out of date.
TEST(PageTableInputsDeathTest, VerificationFindsACountSetWithoutANewVersion) {
  std::mt19937 rng(41);
  LiveRequests lr(4);
  for (int r = 0; r < 2; ++r) lr.admit(rng);
  for (auto& r : lr.live)
    for (BlockTable& t : r->kv.groups) t.blocks.push_back(lr.block());  // room for the next tokens
  for (auto& r : lr.live) r->kv.tables_changed();
  SamplingParams sampling;
  PageTableInputs tables;
  tables.set_verify(true);
  PageTableInputsFill fill;
  const std::vector<size_t> order = {0, 1};
  (void)flatten_with(tables, step_batch(lr, order, {1, 1}, &sampling), 4, 2, 2, &fill);
  lr.live[0]->kv.set_num_entries(3, 1);  // unreported
  EXPECT_DEATH((void)flatten_with(tables, step_batch(lr, order, {1, 1}, &sampling), 4, 2, 2, &fill),
               "its count was set without a new pages_version");
}

}  // namespace
}  // namespace origami
