// Differential test of the Jinja interpreter against Python's jinja2 (configured as HF transformers
// configures chat templates). tests/data/jinja/expected.json was written by
// scripts/jinja_reference.py from tests/data/jinja/cases.json; when jinja2 is installed, the
// script is rerun here so the committed reference cannot go stale.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja_template.h"

namespace origami::jinja {
namespace {

const std::string kDataDir = std::string(ORIGAMI_TEST_DATA_DIR) + "/jinja";

nlohmann::ordered_json load(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::ordered_json::parse(in);
}

TEST(JinjaDifferential, MatchesJinja2Reference) {
  nlohmann::ordered_json cases = load(kDataDir + "/cases.json");
  nlohmann::ordered_json expected = load(kDataDir + "/expected.json");
  ASSERT_GE(cases.size(), 30u);
  int num_checked = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE("case " + name);
    ASSERT_TRUE(expected.contains(name)) << "expected.json lacks this case; rerun scripts/jinja_reference.py";
    const auto& want = expected[name];
    LexerOptions options;
    if (c.contains("options")) {
      options.trim_blocks = c["options"].value("trim_blocks", true);
      options.lstrip_blocks = c["options"].value("lstrip_blocks", true);
    }
    auto tmpl = Template::parse(c["template"].get<std::string>(), options);
    Expected<std::string> got = tmpl ? tmpl->render(from_json(c["context"])) : Expected<std::string>(tmpl.status());
    if (want.contains("error")) {
      EXPECT_FALSE(got.has_value()) << "jinja2 failed with " << want["error"] << " but we rendered " << (got ? *got : "");
      const std::string py_error = want["error"].get<std::string>();
      if (!got && py_error.rfind("TemplateError: ", 0) == 0) {  // raise_exception: the message must survive
        EXPECT_NE(got.status().message().find(py_error.substr(15)), std::string::npos) << got.status().message();
      }
    } else {
      ASSERT_TRUE(got.has_value()) << got.status().message();
      EXPECT_EQ(*got, want["output"].get<std::string>());
    }
    ++num_checked;
  }
  EXPECT_EQ(num_checked, static_cast<int>(cases.size()));
}

TEST(JinjaDifferential, CommittedReferenceIsCurrent) {
  if (std::system("/usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with jinja2 is not installed";
  }
  auto dir = std::filesystem::temp_directory_path() / ("origami_jinja_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string out = (dir / "expected.json").string();
  const std::string cmd = "/usr/bin/python3 '" + std::string(ORIGAMI_SOURCE_DIR) + "/scripts/jinja_reference.py' --cases '" +
                          kDataDir + "/cases.json' --out '" + out + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  nlohmann::ordered_json fresh = load(out);
  nlohmann::ordered_json committed = load(kDataDir + "/expected.json");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(fresh.size(), committed.size());
  for (auto it = committed.begin(); it != committed.end(); ++it) {
    ASSERT_TRUE(fresh.contains(it.key())) << it.key();
    if (it.value().contains("output")) {
      EXPECT_EQ(fresh[it.key()], it.value()) << "case " << it.key() << ": jinja2 now renders differently; rerun scripts/jinja_reference.py";
    } else {
      // Error texts may differ between jinja2 versions; that it fails is what matters.
      EXPECT_TRUE(fresh[it.key()].contains("error")) << "case " << it.key();
    }
  }
}

}  // namespace
}  // namespace origami::jinja
