// Chat-template rendering against the shared goldens (made with HF transformers), plus the error
// paths and resource limits of the Jinja interpreter.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace origami {
namespace {

const std::string kShared = ORIGAMI_SHARED_DIR;

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

ChatTemplate parse_ok(const std::string& source, const ChatTemplateOptions& options = {}) {
  auto t = ChatTemplate::parse(source, options);
  EXPECT_TRUE(t.has_value()) << t.status().message();
  return t ? std::move(t).value() : ChatTemplate();
}

std::string render_ok(const ChatTemplate& t, const nlohmann::json& messages = nlohmann::json::array(),
                      const nlohmann::json& extra = nlohmann::json::object()) {
  auto r = t.render(messages, true, extra);
  EXPECT_TRUE(r.has_value()) << r.status().message();
  return r ? *r : "";
}

Status render_error(const std::string& source, const nlohmann::json& extra = nlohmann::json::object()) {
  auto t = ChatTemplate::parse(source);
  if (!t) return t.status();
  auto r = t->render(nlohmann::json::array(), false, extra);
  EXPECT_FALSE(r.has_value()) << "rendered: " << (r ? *r : "");
  return r ? Status::ok() : r.status();
}

TEST(ChatTemplate, Qwen3MatchesGolden) {
  nlohmann::json golden = load_json(kShared + "/golden/chat_template_golden.json")["qwen3"];
  auto t = ChatTemplate::from_tokenizer_config(kShared + "/tokenizers/qwen3/tokenizer_config.json");
  ASSERT_TRUE(t.has_value()) << t.status().message();
  auto thinking = t->render(golden["messages"], true);
  ASSERT_TRUE(thinking.has_value()) << thinking.status().message();
  EXPECT_EQ(*thinking, golden["rendered"].get<std::string>());
  auto no_think = t->render(golden["messages"], true, {{"enable_thinking", false}});
  ASSERT_TRUE(no_think.has_value()) << no_think.status().message();
  EXPECT_EQ(*no_think, golden["rendered_no_think"].get<std::string>());
  // enable_thinking=true must not add the empty think block.
  EXPECT_EQ(*t->render(golden["messages"], true, {{"enable_thinking", true}}), golden["rendered"].get<std::string>());
}

TEST(ChatTemplate, TinyModelMatchesGolden) {
  nlohmann::json golden = load_json(kShared + "/golden/chat_template_golden.json")["origami-tiny-qwen3"];
  auto t = ChatTemplate::from_tokenizer_config(kShared + "/models/origami-tiny-qwen3/tokenizer_config.json");
  ASSERT_TRUE(t.has_value()) << t.status().message();
  auto r = t->render(golden["messages"], true);
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(*r, golden["rendered"].get<std::string>());
  // Without the generation prompt the assistant header is gone.
  auto no_prompt = t->render(golden["messages"], false);
  ASSERT_TRUE(no_prompt.has_value());
  EXPECT_EQ(*no_prompt + "<|im_start|>assistant\n", golden["rendered"].get<std::string>());
}

TEST(ChatTemplate, BosEosAndExtraVariables) {
  ChatTemplate t = parse_ok("{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{{ custom }}");
  auto r = t.render(nlohmann::json::array({{{"role", "user"}, {"content", "a"}}}), false, {{"custom", "!"}}, "<s>", "</s>");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, "<s>a</s>!");
}

TEST(ChatTemplate, OrderedJsonKeepsKeyOrderInToJson) {
  ChatTemplate t = parse_ok("{{ tools | tojson }}");
  nlohmann::ordered_json extra = nlohmann::ordered_json::parse(R"({"tools": {"z": 1, "a": {"y": [1, 2.5], "b": null}}})");
  auto r = t.render(nlohmann::ordered_json::array(), false, extra);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, R"({"z": 1, "a": {"y": [1, 2.5], "b": null}})");
  // nlohmann::json sorts keys before we see them.
  EXPECT_EQ(render_ok(t, nlohmann::json::array(), nlohmann::json::parse(R"({"tools": {"z": 1, "a": 2}})")), R"({"a": 2, "z": 1})");
}

TEST(ChatTemplate, WhitespaceOptions) {
  const std::string src = "  {% if true %}\n  x\n  {% endif %}\n";
  EXPECT_EQ(render_ok(parse_ok(src)), "  x\n");
  ChatTemplateOptions raw;
  raw.trim_blocks = false;
  raw.lstrip_blocks = false;
  EXPECT_EQ(render_ok(parse_ok(src, raw)), "  \n  x\n  ");
  raw.keep_trailing_newline = true;
  EXPECT_EQ(render_ok(parse_ok(src, raw)), "  \n  x\n  \n");
}

TEST(ChatTemplate, UnknownFilterIsAnError) {
  auto t = ChatTemplate::parse("line one\n{{ messages | no_such_filter }}");
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.status().message().find("no filter named 'no_such_filter'"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("line 2"), std::string::npos) << t.status().message();
  auto test = ChatTemplate::parse("{{ x is frobnicated }}");
  ASSERT_FALSE(test.has_value());
  EXPECT_NE(test.status().message().find("no test named 'frobnicated'"), std::string::npos);
}

TEST(ChatTemplate, SyntaxErrorsNameLineAndColumn) {
  struct Case {
    const char* source;
    const char* fragment;
  };
  const Case cases[] = {
      {"ok\n{% if x %}never closed", "or 'endif'"},
      {"{{ 1 + }}", "line 1, column 8"},
      {"a\nb {% for x in %}{% endfor %}", "line 2"},
      {"{% frobnicate %}", "unknown tag 'frobnicate'"},
      {"{{ 'unterminated }}", "unterminated string"},
      {"{{ (1, 2 }}", "unexpected '}'"},
      {"{# no end", "missing end of comment"},
      {"{% endif %}", "unknown tag 'endif'"},
      {"{% break %}", "outside of a loop"},
      {"{{ x ", "expected '}}'"},
  };
  for (const Case& c : cases) {
    auto t = ChatTemplate::parse(c.source);
    ASSERT_FALSE(t.has_value()) << c.source;
    EXPECT_EQ(t.status().code(), ErrorCode::kInvalidFile);
    EXPECT_NE(t.status().message().find(c.fragment), std::string::npos) << c.source << " -> " << t.status().message();
  }
}

// A namespace is the one value a template can change, so it is the only way a value can come to
// hold itself: that would leak the cycle and make printing, comparing or serialising it recurse
// until the stack overflows. An attribute may hold anything but a namespace or a value reaching
// one (a list, a dict as key or value, a dict's bound method); everything else still works.
TEST(ChatTemplate, NamespacesCannotComeToHoldThemselves) {
  const char* refused[] = {
      "{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}",
      "{% set ns = namespace(x=1) %}{% set ns.x = [1, [ns]] %}{{ ns.x|tojson }}",
      "{% set ns = namespace(x=1) %}{% set ns.x = (ns, 2) %}",
      "{% set ns = namespace(x=1) %}{% set ns.x = {'k': {'j': ns}} %}",
      "{% set ns = namespace(x=1) %}{% set ns.x = {ns: 1} %}",
      "{% set ns = namespace(x=1) %}{% set ns.x = {'k': ns}.items %}{{ ns.x() }}",
      "{% set a = namespace(x=1) %}{% set b = namespace(x=a) %}{% set a.x = b %}{{ a == b }}",
      "{% set a = namespace(x=1) %}{% set b = namespace(x=1) %}{% set a.x = b %}",  // no cycle yet, but b may change
  };
  for (const char* source : refused) {
    Status s = render_error(source);
    EXPECT_NE(s.message().find("could then hold itself"), std::string::npos) << source << " -> " << s.message();
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << source;
  }
  EXPECT_NE(render_error("{% set ns = namespace(x=1) %}{% set ns.y = [ns] %}").message().find("attribute 'y' to a list that holds a namespace"),
            std::string::npos);
  auto t = ChatTemplate::parse(
      "{% set inner = namespace(n=0) %}{% set outer = namespace(inner=inner, log=[]) %}"
      "{% for m in messages %}{% set inner.n = inner.n + 1 %}"
      "{% set outer.log = outer.log + [{'role': m.role, 'seen': [inner.n]}] %}{% endfor %}"
      "{{ outer.inner.n }} {{ outer.log|tojson }} {{ {'a': 1}.items()|list }}");
  ASSERT_TRUE(t.has_value()) << t.status().message();
  EXPECT_EQ(render_ok(*t, nlohmann::json::parse(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])")),
            R"(2 [{"role": "user", "seen": [1]}, {"role": "assistant", "seen": [2]}] [('a', 1)])");
}

TEST(ChatTemplate, RuntimeErrorsAreStatuses) {
  Status s = render_error("{{ raise_exception('Only user and assistant roles are supported!') }}");
  EXPECT_NE(s.message().find("Only user and assistant roles are supported!"), std::string::npos) << s.message();
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(render_error("{{ missing.attr }}").message().find("'missing' is undefined"), std::string::npos);
  EXPECT_NE(render_error("{{ 'a' + 1 }}").message().find("can only concatenate str"), std::string::npos);
  EXPECT_NE(render_error("\n\n  {{ 1 // 0 }}").message().find("line 3"), std::string::npos);
  EXPECT_NE(render_error("{% set x = 1 %}{% set x.y = 2 %}").message().find("non-namespace"), std::string::npos);
  EXPECT_NE(render_error("{{ range(1000000) }}").message().find("Range too big"), std::string::npos);
  EXPECT_NE(render_error("{{ (1).nope() }}").message().find("has no attribute 'nope'"), std::string::npos);
  EXPECT_NE(render_error("{{ x | tojson }}").message().find("not JSON serializable"), std::string::npos);
  EXPECT_NE(render_error("{% for a, b in [1] %}{% endfor %}").message().find("unpack"), std::string::npos);
  // 64-bit ints: overflow is reported, not wrapped.
  EXPECT_NE(render_error("{{ 9223372036854775807 + 1 }}").message().find("overflow"), std::string::npos);
  EXPECT_NE(render_error("{{ 2 ** 64 }}").message().find("overflow"), std::string::npos);
  EXPECT_NE(render_error("{{ 'x' | center(100000000) }}").message().find("too large"), std::string::npos);
}

TEST(ChatTemplate, RunawayTemplatesHitLimits) {
  ChatTemplateOptions small;
  small.limits.max_steps = 100000;
  small.limits.max_output_bytes = 1 << 20;
  auto loops = ChatTemplate::parse("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", small);
  ASSERT_TRUE(loops.has_value());
  auto r = loops->render(nlohmann::json::array(), false);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("limit"), std::string::npos) << r.status().message();

  ChatTemplateOptions big_steps;
  big_steps.limits.max_output_bytes = 1000;
  auto output = ChatTemplate::parse("{% for i in range(10000) %}0123456789{% endfor %}", big_steps);
  ASSERT_TRUE(output.has_value());
  r = output->render(nlohmann::json::array(), false);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("exceeds"), std::string::npos) << r.status().message();

  auto recursion = ChatTemplate::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_TRUE(recursion.has_value());
  r = recursion->render(nlohmann::json::array(), false);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("nested deeper"), std::string::npos) << r.status().message();

  // Deep nesting fails at parse time rather than overflowing the stack.
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  auto nested = ChatTemplate::parse(deep);
  ASSERT_FALSE(nested.has_value());
  EXPECT_NE(nested.status().message().find("nesting too deep"), std::string::npos);
  std::string deep_not;
  for (int i = 0; i < 5000; ++i) deep_not += "not ";
  EXPECT_FALSE(ChatTemplate::parse("{{ " + deep_not + "x }}").has_value());
}

// Every truncation and a byte-deletion sweep of a real template must parse-or-fail and
// render-or-fail with a Status, never crash or hang.
TEST(ChatTemplate, MangledTemplatesFailCleanly) {
  std::string qwen3 = load_json(kShared + "/tokenizers/qwen3/tokenizer_config.json")["chat_template"].get<std::string>();
  nlohmann::json messages = load_json(kShared + "/golden/chat_template_golden.json")["qwen3"]["messages"];
  int num_parsed = 0, num_failed = 0;
  auto attempt = [&](const std::string& src) {
    auto t = ChatTemplate::parse(src);
    if (!t) {
      ++num_failed;
      EXPECT_FALSE(t.status().message().empty());
      return;
    }
    ++num_parsed;
    auto r = t->render(messages, true, {{"tools", nlohmann::json::array({{{"name", "f"}}})}});
    if (!r) {
      EXPECT_FALSE(r.status().message().empty());
    }
  };
  for (size_t n = 0; n <= qwen3.size(); n += 3) attempt(qwen3.substr(0, n));
  for (size_t i = 0; i < qwen3.size(); i += 7) attempt(qwen3.substr(0, i) + qwen3.substr(i + 1));
  EXPECT_GT(num_parsed, 0);
  EXPECT_GT(num_failed, 0);
}

TEST(ChatTemplate, MissingConfigAndField) {
  auto missing = ChatTemplate::from_tokenizer_config(kShared + "/does/not/exist.json");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  auto no_field = ChatTemplate::from_tokenizer_config(kShared + "/golden/chat_template_golden.json");
  ASSERT_FALSE(no_field.has_value());
  EXPECT_NE(no_field.status().message().find("chat_template"), std::string::npos);
}

}  // namespace
}  // namespace origami
