#pragma once
// One check of a ForwardBatch for every backend, before anything is computed: token ids inside
// the vocabulary, sequences covering the batch's tokens in order, page tables covering every entry
// read and written with blocks inside the pool, sampling parameters where a token is sampled, and
// query slots that exist and belong to one sequence. Errors name the sequence, request and field.
#include "backend/forward_batch.h"
#include "core/status.h"

namespace origami {

struct ForwardBatchLimits {
  int vocab_size = 0;
  int block_size = 1;
  int num_blocks = 0;       // pages are blocks in [1, num_blocks)
  int num_query_slots = 0;  // query slots of the compressor; < 0 when compression is not configured
  int num_groups = 1;       // head groups of the KV layout: > 1 needs every sequence's kv with one table each
  // false: the backend checks that every table covers its entries with blocks inside the pool
  // itself, as it flattens them (page_table_inputs.h), and calls this again with true for the
  // message when that check fails. Everything else is checked either way.
  bool check_page_tables = true;
};

Status validate_forward_batch(const ForwardBatch& batch, const ForwardBatchLimits& limits);

}  // namespace origami
