// Sweep lists from the command line and the points they expand to.
#include <gtest/gtest.h>

#include "eval/sweep.h"

namespace origami::eval {
namespace {

std::string error_of(const Expected<std::vector<int>>& e) { return e.has_value() ? "" : e.status().message(); }
std::string error_of(const Expected<std::vector<std::string>>& e) { return e.has_value() ? "" : e.status().message(); }

TEST(SweepLists, BudgetsAreSortedPositiveIntegers) {
  auto b = parse_budget_list("1024, 256,512");
  ASSERT_TRUE(b.has_value()) << b.status().to_string();
  EXPECT_EQ(*b, (std::vector<int>{256, 512, 1024}));
  EXPECT_EQ(*parse_budget_list("64"), std::vector<int>{64});
}

TEST(SweepLists, BadBudgetListsNameTheEntry) {
  EXPECT_NE(error_of(parse_budget_list("512,abc")).find("'abc'"), std::string::npos);
  EXPECT_NE(error_of(parse_budget_list("512,abc")).find("--kv-budget"), std::string::npos);
  EXPECT_NE(error_of(parse_budget_list("512,,1024")).find("entry 2"), std::string::npos);
  EXPECT_NE(error_of(parse_budget_list("0")).find("0 is out of range"), std::string::npos);
  EXPECT_NE(error_of(parse_budget_list("-5")).find("-5"), std::string::npos);
  EXPECT_NE(error_of(parse_budget_list("12.5")).find("'12.5'"), std::string::npos);
  EXPECT_NE(error_of(parse_budget_list("99999999999")).find("99999999999"), std::string::npos);
  EXPECT_NE(error_of(parse_budget_list("256,256")).find("twice"), std::string::npos);
  EXPECT_NE(error_of(parse_budget_list("")).find("empty"), std::string::npos);
}

TEST(SweepLists, PoliciesKeepTheirOrderAndRejectEmptyOrRepeatedNames) {
  auto p = parse_policy_list("snapkv, zipage,full");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, (std::vector<std::string>{"snapkv", "zipage", "full"}));
  EXPECT_NE(error_of(parse_policy_list("snapkv,")).find("entry 2"), std::string::npos);
  EXPECT_NE(error_of(parse_policy_list("zipage,zipage")).find("'zipage' is listed twice"), std::string::npos);
  EXPECT_NE(error_of(parse_policy_list(" ")).find("--kv-policy"), std::string::npos);
}

TEST(SweepPoints, FullKvRunsOnceFirstThenEveryPolicyAtEveryBudget) {
  const auto points = make_sweep({"snapkv", "full", "zipage"}, {256, 512});
  ASSERT_EQ(points.size(), 5u);
  EXPECT_EQ(points[0].policy, "full");
  EXPECT_TRUE(points[0].reference);
  EXPECT_EQ(points[0].budget, 0);
  EXPECT_EQ(point_label(points[0]), "full");
  EXPECT_EQ(points[1].policy, "snapkv");
  EXPECT_EQ(points[1].budget, 256);
  EXPECT_EQ(point_label(points[2]), "snapkv@512");
  EXPECT_EQ(points[3].policy, "zipage");
  EXPECT_FALSE(points[4].reference);
  EXPECT_EQ(points[4].budget, 512);
}

TEST(SweepPoints, WithoutBudgetsEachPolicyRunsAtItsDefault) {
  const auto points = make_sweep({"streaming"}, {});
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[1].budget, 0);
  EXPECT_EQ(point_label(points[1]), "streaming@default");
  EXPECT_EQ(make_sweep({"full"}, {128}).size(), 1u);
}

}  // namespace
}  // namespace origami::eval
