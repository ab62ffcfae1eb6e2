// The n/a rule (eval/point_applicability.h): a point whose policy compressed nothing although
// its documents exceed the budget is not a score. Checked on the rule itself and on what the
// table, the JSON and the plot make of such a point.
#include <gtest/gtest.h>

#include "eval/eval_report.h"
#include "eval/point_applicability.h"

namespace origami::eval {
namespace {

PointResult point(const std::string& policy, int budget, int64_t compressions, int max_tokens, int correct = 3) {
  PointResult r;
  r.point = SweepPoint{policy, budget, policy == "full"};
  r.task = EvalTask::kRetrieval;
  r.mode = "stream";
  r.num_documents = 4;
  r.num_correct = correct;
  r.num_compressions = compressions;
  r.max_document_tokens = max_tokens;
  decide_applicability(&r);
  return r;
}

TEST(Applicability, APolicyThatNeverCompressedOverBudgetDocumentsDoesNotApply) {
  const PointResult snapkv = point("snapkv", 512, /*compressions=*/0, /*max_tokens=*/2000);
  EXPECT_FALSE(snapkv.applies);
  EXPECT_NE(snapkv.not_applied_reason.find("stream"), std::string::npos) << snapkv.not_applied_reason;
  EXPECT_NE(snapkv.not_applied_reason.find("2000"), std::string::npos);
  EXPECT_NE(snapkv.not_applied_reason.find("512"), std::string::npos);
}

TEST(Applicability, CompressingOrFittingOrTheReferenceOrFailingEverywhereApplies) {
  EXPECT_TRUE(point("full", 0, 0, 2000).applies);                       // the reference
  EXPECT_TRUE(point("zipage", 512, 7, 2000).applies);                   // it acted
  EXPECT_TRUE(point("snapkv", 4096, 0, 2000).applies);                  // nothing to compress
  EXPECT_TRUE(point("snapkv", 2000, 0, 2000).applies);                  // exactly fits
  EXPECT_FALSE(point("snapkv", 1999, 0, 2000).applies);                 // one token over
  PointResult failed = point("snapkv", 512, 0, 2000, 0);
  failed.num_failed = failed.num_documents;
  decide_applicability(&failed);
  EXPECT_TRUE(failed.applies) << "a point whose every document failed is a failure, not n/a";
}

TEST(Applicability, TableJsonAndPlotNeverShowTheFullKvCopy) {
  std::vector<PointResult> results = {point("full", 0, 0, 2000), point("snapkv", 256, 0, 2000),
                                      point("snapkv", 512, 0, 2000), point("zipage", 256, 9, 2000, 1),
                                      point("zipage", 512, 5, 2000, 2)};
  ASSERT_FALSE(results[1].applies);
  ASSERT_EQ(results[1].accuracy(), results[0].accuracy()) << "the raw number is full KV's";

  const std::string table = format_table(results);
  size_t snapkv_lines = 0;
  for (size_t at = table.find("\nsnapkv"); at != std::string::npos; at = table.find("\nsnapkv", at + 1)) {
    const std::string line = table.substr(at + 1, table.find('\n', at + 1) - at - 1);
    EXPECT_NE(line.find("n/a"), std::string::npos) << line;
    EXPECT_EQ(line.find("0.750"), std::string::npos) << line;
    ++snapkv_lines;
  }
  EXPECT_EQ(snapkv_lines, 2u) << table;
  EXPECT_NE(table.find("n/a: "), std::string::npos) << "the table says what n/a means";

  const nlohmann::json j = point_json(results[1], &results[0], nlohmann::json::object());
  EXPECT_EQ(j["applies"], false);
  EXPECT_TRUE(j["accuracy"].is_null()) << j;
  EXPECT_TRUE(j["accuracy_ratio"].is_null()) << j;
  EXPECT_TRUE(j["not_applied"].is_string());
  EXPECT_EQ(j["num_compressions"], 0);
  EXPECT_EQ(j["max_document_tokens"], 2000);
  const nlohmann::json z = point_json(results[3], &results[0], nlohmann::json::object());
  EXPECT_EQ(z["applies"], true);
  EXPECT_DOUBLE_EQ(z["accuracy"].get<double>(), 0.25);
  EXPECT_FALSE(z.contains("not_applied"));

  const PlotSpec spec = make_plot_spec(results, "t");
  ASSERT_EQ(spec.series.size(), 2u);
  EXPECT_EQ(spec.series[0].name, "snapkv (n/a)");
  EXPECT_TRUE(spec.series[0].points.empty());
  EXPECT_EQ(spec.series[1].name, "zipage");
  EXPECT_EQ(spec.series[1].points.size(), 2u);

  // A policy that acted at one budget and not at another keeps only the point where it acted.
  results[2].num_compressions = 3;
  decide_applicability(&results[2]);
  const PlotSpec partial = make_plot_spec(results, "t");
  EXPECT_EQ(partial.series[0].name, "snapkv");
  ASSERT_EQ(partial.series[0].points.size(), 1u);
  EXPECT_EQ(partial.series[0].points[0].first, 512.0);
}

TEST(Applicability, PerplexityPointsFollowTheSameRule) {
  PointResult full, snapkv;
  full.point = SweepPoint{"full", 0, true};
  snapkv.point = SweepPoint{"snapkv", 256, false};
  for (PointResult* r : {&full, &snapkv}) {
    r->task = EvalTask::kPerplexity;
    r->mode = "stream";
    r->num_documents = 2;
    r->nll.add_logprobs({-1.0f, -2.0f});
    r->max_document_tokens = 2048;
    decide_applicability(r);
  }
  EXPECT_TRUE(full.applies);
  EXPECT_FALSE(snapkv.applies);
  const nlohmann::json j = point_json(snapkv, &full, nlohmann::json::object());
  EXPECT_TRUE(j["ppl"].is_null());
  EXPECT_TRUE(j["ppl_ratio"].is_null());
  EXPECT_TRUE(j["mean_nll"].is_null());
  EXPECT_EQ(j["applies"], false);
  EXPECT_NE(format_table({full, snapkv}).find("n/a"), std::string::npos);
}

}  // namespace
}  // namespace origami::eval
