#include "kv/table_summary.h"

#include <algorithm>

#include "kv/block_table.h"

namespace origami {

void summarize_entries(const RequestKV& kv, TableSummary* summary) {
  int64_t sum = 0, pages = 0;
  int longest = 0, lead = 0;
  for (size_t g = 0; g < kv.groups.size(); ++g) {
    const int n = kv.num_entries(g);
    sum += n;
    pages += static_cast<int64_t>(kv.groups[g].blocks.size());
    if (g == 0 || n > longest) {
      longest = n;
      lead = static_cast<int>(g);
    }
  }
  summary->entries_sum = sum;
  summary->max_entries = longest;
  summary->lead_table = lead;
  summary->pages = pages;
}

TableSummary summarize_tables(const RequestKV& kv, int block_size) {
  TableSummary s;
  summarize_entries(kv, &s);
  int64_t room = kv.groups.empty() ? 0 : INT64_MAX;
  for (size_t g = 0; g < kv.groups.size(); ++g)
    room = std::min(room, static_cast<int64_t>(kv.groups[g].blocks.size()) * block_size - kv.num_entries(g));
  s.min_room = room;
  return s;
}

bool summary_matches(const TableSummary& kept, const RequestKV& kv, int block_size) {
  const TableSummary walked = summarize_tables(kv, block_size);
  if (kept.entries_known() && (kept.entries_sum != walked.entries_sum || kept.max_entries != walked.max_entries ||
                               kept.lead_table != walked.lead_table || kept.pages != walked.pages))
    return false;
  return !kept.room_known() || kept.min_room == walked.min_room;
}

}  // namespace origami
