// scripts/make_retrieval_set.py builds the tuning set that policy defaults are chosen on. Its
// documents must be what the retrieval task expects (load_retrieval_examples reads them) and
// what ../shared/models/README.md describes: 1-4 distinct facts inside the filler, the asked one
// among them with its answer, and the question at the end.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "eval/retrieval_task.h"

namespace origami::eval {
namespace {

namespace fs = std::filesystem;

std::string filler_text() {
  // Sentences of 20-600 characters that start upper case; enough of them for several documents.
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += "Sentence number " + std::to_string(i) + " talks about the weather in town and nothing else. ";
  return text;
}

TEST(RetrievalSetScript, BuildsDocumentsTheTaskReads) {
  if (std::system("/usr/bin/python3 --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 is not installed";
  const fs::path dir = fs::temp_directory_path() / ("origami_retrieval_set_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "filler.txt") << filler_text();
  }
  const fs::path out = dir / "set.jsonl";
  const std::string cmd = "/usr/bin/python3 '" + std::string(ORIGAMI_SOURCE_DIR) +
                          "/scripts/make_retrieval_set.py' --out '" + out.string() + "' --count 40 --seed 3 --chars 3000 '" +
                          (dir / "filler.txt").string() + "' >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  auto examples = load_retrieval_examples(out.string());
  ASSERT_TRUE(examples.has_value()) << examples.status().message();
  ASSERT_EQ(examples->size(), 40u);
  const std::regex fact(R"(The secret number of the (\w+) (\w+) is (\d{4})\.)");
  const std::regex question(R"(\nQuestion: What is the secret number of the (\w+) (\w+)\?\nAnswer: The secret number of the (\w+) (\w+) is$)");
  std::map<int, int> facts_per_doc;
  std::ifstream lines(out);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const RetrievalExample& ex = (*examples)[i++];
    SCOPED_TRACE("document " + std::to_string(i - 1));
    EXPECT_EQ(ex.prompt, j["prompt"].get<std::string>());
    std::smatch q;
    ASSERT_TRUE(std::regex_search(ex.prompt, q, question));
    EXPECT_EQ(q[1].str(), q[3].str());
    EXPECT_EQ(q[2].str(), q[4].str());
    const std::string body = ex.prompt.substr(0, q.position(0));
    int count = 0, asked = 0;
    std::map<std::string, int> keys;
    for (auto it = std::sregex_iterator(body.begin(), body.end(), fact); it != std::sregex_iterator(); ++it) {
      ++count;
      ++keys[(*it)[1].str() + " " + (*it)[2].str()];
      if ((*it)[1] == q[1].str() && (*it)[2] == q[2].str()) {
        ++asked;
        EXPECT_EQ((*it)[3].str(), ex.answer);
        const double depth = static_cast<double>(it->position(0)) / static_cast<double>(body.size());
        EXPECT_NEAR(j["depth"].get<double>(), depth, 0.01);
      }
    }
    EXPECT_EQ(asked, 1);
    EXPECT_EQ(count, j["num_facts"].get<int>());
    EXPECT_GE(count, 1);
    EXPECT_LE(count, 4);
    for (const auto& [key, n] : keys) EXPECT_EQ(n, 1) << key << " stated twice";
    EXPECT_GE(body.size(), 3000u);
    ++facts_per_doc[count];
  }
  EXPECT_EQ(i, 40u);
  EXPECT_EQ(facts_per_doc.size(), 4u) << "every fact count from 1 to 4 should occur in 40 documents";
  fs::remove_all(dir);
}

// --turns: each document holds at least as many facts as questions, the questions ask distinct
// facts each answered by its fact in the document, and the single-question fields are the first
// turn's, so that the task's reader takes the same items.
TEST(RetrievalSetScript, MultiTurnItemsAskDistinctFactsOfTheDocument) {
  if (std::system("/usr/bin/python3 --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 is not installed";
  const fs::path dir = fs::temp_directory_path() / ("origami_retrieval_set_mt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "filler.txt") << filler_text();
  }
  const fs::path out = dir / "set.jsonl";
  const int turns = 6;
  const std::string cmd = "/usr/bin/python3 '" + std::string(ORIGAMI_SOURCE_DIR) + "/scripts/make_retrieval_set.py' --out '" +
                          out.string() + "' --count 12 --seed 5 --chars 3000 --turns " + std::to_string(turns) + " '" +
                          (dir / "filler.txt").string() + "' >/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto examples = load_retrieval_examples(out.string());
  ASSERT_TRUE(examples.has_value()) << examples.status().message();
  ASSERT_EQ(examples->size(), 12u);
  const std::regex fact(R"(The secret number of the (\w+) (\w+) is (\d{4})\.)");
  const std::regex question(R"(^\nQuestion: What is the secret number of the (\w+) (\w+)\?\nAnswer: The secret number of the (\w+) (\w+) is$)");
  std::ifstream lines(out);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    SCOPED_TRACE("document " + std::to_string(i));
    const std::string document = j["document"].get<std::string>();
    std::map<std::string, std::pair<std::string, size_t>> facts;  // "adj noun" -> digits, offset
    for (auto it = std::sregex_iterator(document.begin(), document.end(), fact); it != std::sregex_iterator(); ++it)
      facts[(*it)[1].str() + " " + (*it)[2].str()] = {(*it)[3].str(), static_cast<size_t>(it->position(0))};
    EXPECT_EQ(static_cast<int>(facts.size()), j["num_facts"].get<int>());
    EXPECT_GE(static_cast<int>(facts.size()), turns);
    ASSERT_EQ(j["turns"].size(), static_cast<size_t>(turns));
    std::map<std::string, int> asked;
    for (const nlohmann::json& t : j["turns"]) {
      const std::string q = t["question"].get<std::string>();
      std::smatch m;
      ASSERT_TRUE(std::regex_search(q, m, question)) << q;
      EXPECT_EQ(m[1].str(), m[3].str());
      EXPECT_EQ(m[2].str(), m[4].str());
      const std::string key = m[1].str() + " " + m[2].str();
      ++asked[key];
      ASSERT_TRUE(facts.count(key)) << key << " is asked but not in the document";
      EXPECT_EQ(t["answer"].get<std::string>(), facts[key].first);
      EXPECT_NEAR(t["depth"].get<double>(), static_cast<double>(facts[key].second) / static_cast<double>(document.size()), 0.01);
    }
    EXPECT_EQ(asked.size(), static_cast<size_t>(turns)) << "a fact asked twice";
    const RetrievalExample& ex = (*examples)[i++];
    EXPECT_EQ(ex.prompt, document + j["turns"][0]["question"].get<std::string>());
    EXPECT_EQ(ex.answer, j["turns"][0]["answer"].get<std::string>());
  }
  EXPECT_EQ(i, 12u);
  fs::remove_all(dir);
}

TEST(RetrievalSetScript, RefusesTooLittleFiller) {
  if (std::system("/usr/bin/python3 --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 is not installed";
  const fs::path dir = fs::temp_directory_path() / ("origami_retrieval_set_small_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream(dir / "filler.txt") << "Too short. Far too short to fill a document with.";
  }
  const std::string cmd = "/usr/bin/python3 '" + std::string(ORIGAMI_SOURCE_DIR) + "/scripts/make_retrieval_set.py' --out '" +
                          (dir / "x.jsonl").string() + "' '" + (dir / "filler.txt").string() + "' 2>/dev/null";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace origami::eval
