#include "kv/table_summary.h"

#include <algorithm>

#include "kv/block_table.h"

namespace origami {

void summarize_entries(const std::vector<BlockTable>& tables, TableSummary* summary) {
  int64_t sum = 0;
  int longest = 0, lead = 0;
  for (size_t g = 0; g < tables.size(); ++g) {
    const int n = tables[g].num_entries;
    sum += n;
    if (g == 0 || n > longest) {
      longest = n;
      lead = static_cast<int>(g);
    }
  }
  summary->entries_sum = sum;
  summary->max_entries = longest;
  summary->lead_table = lead;
}

TableSummary summarize_tables(const std::vector<BlockTable>& tables, int block_size) {
  TableSummary s;
  summarize_entries(tables, &s);
  int64_t room = tables.empty() ? 0 : INT64_MAX;
  for (const BlockTable& t : tables)
    room = std::min(room, static_cast<int64_t>(t.blocks.size()) * block_size - t.num_entries);
  s.min_room = room;
  return s;
}

bool summary_matches(const TableSummary& kept, const std::vector<BlockTable>& tables, int block_size) {
  const TableSummary walked = summarize_tables(tables, block_size);
  if (kept.entries_known() && (kept.entries_sum != walked.entries_sum || kept.max_entries != walked.max_entries ||
                               kept.lead_table != walked.lead_table))
    return false;
  return !kept.room_known() || kept.min_room == walked.min_room;
}

}  // namespace origami
