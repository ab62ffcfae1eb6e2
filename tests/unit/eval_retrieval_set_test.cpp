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
