#include "eval/perplexity_task.h"

#include "eval/eval_result.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace origami::eval {

Expected<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open '" + path + "'");
  std::ostringstream buf;
  buf << in.rdbuf();
  std::string text = buf.str();
  // Editors and some dataset dumps start with U+FEFF; it is not part of the text.
  if (text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
  if (text.empty()) return invalid_file("'" + path + "' is empty");
  return text;
}

std::vector<std::vector<int32_t>> make_windows(const std::vector<int32_t>& tokens, int context, int limit) {
  std::vector<std::vector<int32_t>> windows;
  if (context < 2) return windows;
  for (size_t start = 0; start < tokens.size(); start += static_cast<size_t>(context)) {
    if (limit > 0 && static_cast<int>(windows.size()) >= limit) break;
    const size_t end = std::min(tokens.size(), start + static_cast<size_t>(context));
    if (end - start < 2) break;
    windows.emplace_back(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return windows;
}

EvalItem make_perplexity_item(const std::vector<int32_t>& window) {
  EvalItem item;
  if (window.empty()) return item;
  item.prompt_token_ids.assign(window.begin(), window.begin() + 1);
  item.forced_token_ids.assign(window.begin() + 1, window.end());
  item.max_new_tokens = 0;
  item.return_forced_logprobs = true;
  return item;
}

double NllTotal::perplexity() const {
  if (num_tokens == 0) return std::numeric_limits<double>::quiet_NaN();
  return std::exp(mean_nll());
}

void score_perplexity(const std::vector<EvalItemResult>& results, PointResult* point) {
  point->task = EvalTask::kPerplexity;
  point->mode = "stream";
  point->num_documents = static_cast<int>(results.size());
  for (const EvalItemResult& r : results) {
    if (r.ok) {
      point->nll.add_logprobs(r.forced_logprobs);
    } else {
      ++point->num_failed;
      if (point->first_error.empty()) point->first_error = r.error;
    }
  }
}

}  // namespace origami::eval
