// validate_forward_batch on a grouped layout: every head group's table is checked, and an error
// names the sequence, its request and the group (the name is only formatted for an error, so
// these messages are what keeps that formatting honest).
#include "backend/forward_batch_validation.h"

#include <gtest/gtest.h>

#include <string>

namespace origami {
namespace {

constexpr int kBlock = 4;

ForwardBatchLimits grouped_limits() {
  ForwardBatchLimits limits;
  limits.vocab_size = 100;
  limits.block_size = kBlock;
  limits.num_blocks = 16;
  limits.num_query_slots = -1;
  limits.num_groups = 3;
  return limits;
}

// Two sequences decoding one token each; every group holds its own number of entries (group 1
// compacted under a smaller budget).
struct GroupedBatch {
  GroupedBatch() {
    for (RequestKV* kv : {&kv_a, &kv_b}) {
      kv->groups.resize(3);
      kv->groups[0] = {{1, 2, 3}, 10};
      kv->groups[1] = {{4}, 3};
      kv->groups[2] = {{5, 6}, 7};
    }
    batch.token_ids = {1, 2};
    batch.positions = {9, 9};
    for (int s = 0; s < 2; ++s) {
      const RequestKV& kv = s == 0 ? kv_a : kv_b;
      SequenceInput in;
      in.request_id = 7 + static_cast<uint64_t>(s);
      in.query_start = s;
      in.num_query_tokens = 1;
      in.start_position = 9;
      in.num_cached_entries = kv.num_entries(0) - 1;
      in.block_table = &kv.groups[0].blocks;
      in.kv = &kv;
      in.sampling = &sampling;
      batch.sequences.push_back(in);
    }
  }
  RequestKV kv_a, kv_b;
  SamplingParams sampling;
  ForwardBatch batch;
};

bool contains(const Status& st, const std::string& text) { return st.message().find(text) != std::string::npos; }

TEST(ForwardBatchValidation, AcceptsEveryGroupWithinItsPages) {
  GroupedBatch b;
  EXPECT_TRUE(validate_forward_batch(b.batch, grouped_limits()).is_ok());
}

TEST(ForwardBatchValidation, NamesTheGroupWithABlockOutsideThePool) {
  GroupedBatch b;
  b.kv_b.groups[2].blocks[1] = 16;
  const Status st = validate_forward_batch(b.batch, grouped_limits());
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st, "batch: sequence 1 (request 8) group 2: page 1 is block 16, outside [1, 16)"))
      << st.to_string();
}

TEST(ForwardBatchValidation, NamesTheGroupWithTooFewPages) {
  GroupedBatch b;
  b.kv_a.set_num_entries(1, 5);  // 4 cached + 1 new need 2 pages; the table has 1
  const Status st = validate_forward_batch(b.batch, grouped_limits());
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st, "batch: sequence 0 (request 7) group 1: block table has 1 pages, 5 entries need 2"))
      << st.to_string();
}

// Exactly the pages the entries reach are checked: a table whose entries fill its pages is
// accepted, one more entry is a page short, and a page past the entries is not read.
TEST(ForwardBatchValidation, ChecksThePagesTheEntriesReachAndNoMore) {
  GroupedBatch b;
  b.kv_a.set_num_entries(2, 8);  // 7 cached + 1 new: both pages full
  EXPECT_TRUE(validate_forward_batch(b.batch, grouped_limits()).is_ok());
  b.kv_a.set_num_entries(2, 9);
  Status st = validate_forward_batch(b.batch, grouped_limits());
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st, "batch: sequence 0 (request 7) group 2: block table has 2 pages, 9 entries need 3"))
      << st.to_string();
  b.kv_a.set_num_entries(2, 4);  // 3 cached + 1 new: only page 0 is read
  b.kv_a.groups[2].blocks[1] = kNullBlock;
  EXPECT_TRUE(validate_forward_batch(b.batch, grouped_limits()).is_ok());
  b.kv_a.set_num_entries(2, 0);  // a negative cached count
  st = validate_forward_batch(b.batch, grouped_limits());
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st, "batch: sequence 0 (request 7) group 2: negative num_cached_entries")) << st.to_string();
}

TEST(ForwardBatchValidation, GroupZeroErrorsNameOnlyTheSequence) {
  GroupedBatch b;
  b.kv_a.groups[0].blocks[0] = kNullBlock;
  const Status st = validate_forward_batch(b.batch, grouped_limits());
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st, "batch: sequence 0 (request 7): page 0 is block 0")) << st.to_string();
  EXPECT_FALSE(contains(st, "group")) << st.to_string();
}

}  // namespace
}  // namespace origami
