#pragma once
// Head budget files that the operator of `origami serve` loads at start under a name
// (--kv-head-budgets-file NAME=PATH, repeatable), for requests to pick by name:
// "kv_head_budgets": "NAME". A request never names a path: the server must not open what a
// client chooses (a FIFO blocks, /dev/zero streams forever, a secret file would be quoted back).
// Names rather than a directory scanned at start: each file is chosen explicitly, is read and
// checked against the model before the server accepts anything, and the set never changes under
// a running server.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/request_options_json.h"
#include "kv/head_budgets.h"
#include "model/config.h"

namespace origami::server {

using NamedHeadBudgets = std::map<std::string, std::shared_ptr<const HeadBudgets>>;

// Reads "NAME=PATH" specs: NAME of letters, digits, '.', '_', '-' (at most 64), each NAME once;
// each PATH a regular file of at most kMaxHeadBudgetsFileBytes in `origami calibrate`'s format.
// Errors name the spec and what is wrong.
Expected<NamedHeadBudgets> load_named_head_budgets(const std::vector<std::string>& specs);

// Every loaded file belongs to `model` (checked at start, so a request cannot find out later).
Status check_named_head_budgets(const NamedHeadBudgets& budgets, const ModelConfig& model);

// Looks a request's name up in `budgets` (which must outlive the resolver).
HeadBudgetsResolver named_head_budgets_resolver(const NamedHeadBudgets& budgets);

}  // namespace origami::server
