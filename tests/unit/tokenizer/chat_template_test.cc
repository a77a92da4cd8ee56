// Chat templates: the real templates of tests/data/chat_templates rendered by PolyKV's Jinja
// engine must be byte-equal to Python jinja2's renders (render_golden.py, transformers'
// environment); plus engine semantics and the errors for unsupported or broken templates.
#include "polykv/model/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"

namespace polykv::model {
namespace {

using json = nlohmann::ordered_json;

const std::string kDir = std::string(POLYKV_TEST_DATA_DIR) + "/chat_templates/";

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

json ReadJson(const std::string& name) {
  std::string text;
  EXPECT_TRUE(ReadFile(kDir + name, &text)) << kDir + name;
  return json::parse(text);
}

// Same variables as render_golden.py: date_string pinned unless the case sets it.
ChatRenderOptions CaseOptions(const json& tmpl, const json& c) {
  ChatRenderOptions o;
  o.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  o.bos_token = tmpl["bos_token"].get<std::string>();
  o.eos_token = tmpl["eos_token"].get<std::string>();
  json extra = {{"date_string", "26 Jul 2024"}};
  if (c.contains("extra")) {
    for (auto it = c["extra"].begin(); it != c["extra"].end(); ++it) extra[it.key()] = *it;
  }
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    o.extra_json.emplace_back(it.key(), it->dump());
  }
  return o;
}

TEST(ChatTemplateGolden, RendersLikePythonJinja2) {
  const json templates = ReadJson("templates.json");
  const json cases = ReadJson("cases.json");
  ASSERT_GE(templates.size(), 6u);
  int compared = 0, refused = 0;
  for (const json& t : templates) {
    const std::string file = t["file"].get<std::string>();
    std::string source;
    ASSERT_TRUE(ReadFile(kDir + file, &source)) << file;
    auto tmpl = ChatTemplate::Parse(source);
    ASSERT_TRUE(tmpl.ok()) << file << ": " << tmpl.status();
    const std::string stem = file.substr(0, file.rfind(".jinja"));
    for (const json& c : cases) {
      const std::string name = stem + "." + c["name"].get<std::string>();
      SCOPED_TRACE(name);
      auto got = tmpl->RenderJson(c["messages"].dump(), CaseOptions(t, c));
      std::string expected;
      if (ReadFile(kDir + "expected/" + name + ".txt", &expected)) {
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, expected);
        ++compared;
      } else {
        ASSERT_TRUE(ReadFile(kDir + "expected/" + name + ".error", &expected))
            << "no expected file for " << name << " (run render_golden.py)";
        json err = json::parse(expected);
        ASSERT_FALSE(got.ok()) << "jinja2 raised " << err.dump() << ", we rendered:\n" << *got;
        if (err["type"] == "TemplateError") {
          EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
          EXPECT_NE(got.status().message().find("template raised an exception: " +
                                                err["message"].get<std::string>()),
                    std::string::npos)
              << got.status();
        }
        ++refused;
      }
    }
  }
  EXPECT_GE(compared, 60);
  std::cout << "golden renders compared: " << compared << ", refused as in jinja2: " << refused
            << "\n";
}

// The ChatMessage path builds the same {"role", "content"} dicts as the JSON path.
TEST(ChatTemplateGolden, ChatMessageSpanMatchesJson) {
  std::string source;
  ASSERT_TRUE(ReadFile(kDir + "llama-3.1-8b-instruct.jinja", &source));
  auto t = ChatTemplate::Parse(source);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<ChatMessage> msgs = {{"system", "You are a helpful assistant."}, {"user", "Hello!"}};
  ChatRenderOptions o;
  o.bos_token = "<|begin_of_text|>";
  o.eos_token = "<|eot_id|>";
  std::string expected;
  ASSERT_TRUE(ReadFile(kDir + "expected/llama-3.1-8b-instruct.system_user.txt", &expected));
  auto got = t->Render(msgs, o);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, expected);
}

std::string Render(const std::string& src, const std::string& messages_json = "[]",
                   std::vector<std::pair<std::string, std::string>> extra = {}) {
  auto t = ChatTemplate::Parse(src);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  ChatRenderOptions o;
  o.extra_json = std::move(extra);
  auto r = t->RenderJson(messages_json, o);
  if (!r.ok()) return "RENDER ERROR: " + std::string(r.status().message());
  return *r;
}

TEST(ChatTemplateEngine, Whitespace) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before it.
  EXPECT_EQ(Render("{% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  EXPECT_EQ(Render("x  {%- if true -%}  y  {%- endif -%}  z"), "xyz");
  EXPECT_EQ(Render("{{ 'a' }}\n{{- 'b' -}}\n c"), "abc");
  EXPECT_EQ(Render("{# note #}\nkept\n"), "kept");  // and one trailing newline is dropped
  EXPECT_EQ(Render("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(Render("a\r\nb"), "a\nb");
}

TEST(ChatTemplateEngine, ExpressionsAndValues) {
  EXPECT_EQ(Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}"),
            "3 -4 1 2 3.5 1024");
  EXPECT_EQ(Render("{{ 1 + 2.5 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 3.0 }} {{ 1e-5 }}"),
            "3.5 0.30000000000000004 1e+20 3.0 1e-05");
  EXPECT_EQ(Render("{{ 'a' ~ 1 ~ none ~ true }} {{ none }} {{ undefined_name }}|"),
            "a1NoneTrue None |");
  EXPECT_EQ(Render("{{ [1, 'a', none, (2,), {'k': \"it's\"}] }}"),
            "[1, 'a', None, (2,), {'k': \"it's\"}]");
  EXPECT_EQ(Render("{{ 'abcdef'[::-1] }} {{ 'abcdef'[1:-1:2] }} {{ [1,2,3][-1] }} "
                   "{{ 'héllo'[1] }} {{ [1,2,3,4][:2] }}"),
            "fedcba bd 3 é [1, 2]");
  EXPECT_EQ(Render("{{ 'x' if 1 > 2 else 'y' }}{{ 'z' if false }}|{{ 1 < 2 and 'ok' or 'no' }}"),
            "y|ok");
  EXPECT_EQ(Render("{{ 'b' in 'abc' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }}"),
            "True True True");
  EXPECT_EQ(Render("{{ '\\u00e9\\x41\\n' }}"),
            "\xc3\xa9"
            "A\n");
}

TEST(ChatTemplateEngine, LoopsScopesAndNamespaces) {
  EXPECT_EQ(Render("{% for x in [3, 4, 5] if x != 4 %}{{ loop.index }}{{ loop.index0 }}"
                   "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }};"
                   "{% else %}none{% endfor %}"),
            "10TrueFalse22;21FalseTrue21;");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  // A set inside a loop does not leak out; a namespace attribute does.
  EXPECT_EQ(Render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for i in range(3) %}"
                   "{% set n = n + 1 %}{% set ns.n = ns.n + i %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 3");
  EXPECT_EQ(Render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"),
            "a=1,b=2,");
  EXPECT_EQ(Render("{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}"
                   "{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(Render("{% macro tag(name, cls='x') %}<{{ name }} {{ cls }}>{% endmacro %}"
                   "{{ tag('a') }}{{ tag('b', cls='y') }}"),
            "<a x><b y>");
  EXPECT_EQ(Render("{% set block %}  inner {{ 1 }} {% endset %}[{{ block }}]"), "[  inner 1 ]");
  EXPECT_EQ(Render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(ChatTemplateEngine, FiltersTestsAndMethods) {
  EXPECT_EQ(
      Render("{{ '  a b  ' | trim }}|{{ 'a,b,,c'.split(',') }}|{{ ' x y '.split() }}|"
             "{{ 'Hello'.startswith(('x', 'He')) }}|{{ 'ab'.upper() }}|{{ 'hello world'|title }}"),
      "a b|['a', 'b', '', 'c']|['x', 'y']|True|AB|Hello World");
  EXPECT_EQ(Render("{{ x | default('d') }} {{ '' | default('d', true) }} {{ [1,2] | join('-') }} "
                   "{{ [3,4] | first }}{{ [3,4] | last }} {{ '42' | int + 1 }} {{ 'ab' | list }} "
                   "{{ 5 | string | length }}"),
            "d d 1-2 34 43 ['a', 'b'] 1");
  EXPECT_EQ(Render("{{ m | selectattr('role', 'equalto', 'user') | map(attribute='content') "
                   "| join(',') }} {{ m | rejectattr('role', 'eq', 'user') | list | length }}",
                   "[]",
                   {{"m", R"([{"role":"user","content":"a"},{"role":"bot","content":"b"},)"
                          R"({"role":"user","content":"c"}])"}}),
            "a,c 1");
  EXPECT_EQ(Render("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d.get('z', 0) }}", "[]",
                   {{"d", R"({"b":[1,"é\"",null],"a":true})"}}),
            "{\"b\": [1, \"é\\\"\", null], \"a\": true}|{\n  \"b\": [\n    1,\n    \"é\\\"\",\n"
            "    null\n  ],\n  \"a\": true\n}|0");
  EXPECT_EQ(
      Render("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} "
             "{{ 'a' is iterable }} {{ 3 is odd }} {{ 4 is divisibleby 2 }} {{ 1 is not string }}"),
      "False True True True True True True True");
}

TEST(ChatTemplateErrors, RaiseExceptionNamesTheMessage) {
  auto t = ChatTemplate::Parse("line one\n{{ raise_exception('Roles must alternate') }}");
  ASSERT_TRUE(t.ok());
  auto r = t->Render({}, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "chat template line 2: template raised an exception: Roles must alternate");
}

// A template source and a piece of the error message it must give.
struct ErrorCase {
  const char* src;
  const char* what;
};

// Each source's parse fails with `code` and a message holding its `what`.
void ExpectParseErrors(std::initializer_list<ErrorCase> cases, absl::StatusCode code) {
  for (const ErrorCase& c : cases) {
    auto t = ChatTemplate::Parse(c.src);
    EXPECT_EQ(t.status().code(), code) << c.src;
    EXPECT_NE(t.status().message().find(c.what), std::string::npos) << t.status();
  }
}

// `src` parses, and rendering `messages` fails with `code` and a message holding `what`.
void ExpectRenderError(const std::string& src, const std::vector<ChatMessage>& messages,
                       absl::StatusCode code, const std::string& what) {
  auto t = ChatTemplate::Parse(src);
  ASSERT_TRUE(t.ok());
  auto r = t->Render(messages, {});
  EXPECT_EQ(r.status().code(), code);
  EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status();
}

TEST(ChatTemplateErrors, UnsupportedConstructsAreUnimplementedWithTheirLine) {
  ExpectParseErrors(
      {ErrorCase{"a\n{% include 'x.j2' %}", "line 2: unsupported tag 'include'"},
       ErrorCase{"{{ x }}\n\n{{ x | wordcount }}", "line 3: unsupported filter 'wordcount'"},
       ErrorCase{"{% if x is escaped %}{% endif %}", "line 1: unsupported test 'escaped'"},
       ErrorCase{"{% if 1 < x < 3 %}{% endif %}", "line 1: unsupported chained comparison"},
       ErrorCase{"{% raw %}x{% endraw %}", "line 1: unsupported tag 'raw'"},
       ErrorCase{"{% for x in y recursive %}{% endfor %}",
                 "line 1: unsupported recursive for loop"}},
      absl::StatusCode::kUnimplemented);
  // Found at run time: a Python str method outside the subset.
  ExpectRenderError("\n{{ 'a'.zfill(3) }}", {}, absl::StatusCode::kUnimplemented,
                    "line 2: unsupported str method 'zfill'");
}

TEST(ChatTemplateErrors, MalformedTemplatesNameTheLine) {
  ExpectParseErrors({ErrorCase{"{% if x %}\nno end",
                               "line 2: unexpected end of template, expected elif or else or "
                               "endif for the block opened at line 1"},
                     ErrorCase{"ok\n{{ x + }}", "line 2: unexpected '}}'"},
                     ErrorCase{"\n\n{{ 'unterminated }}", "line 3: unterminated string literal"},
                     ErrorCase{"{% endfor %}", "line 1: unknown tag 'endfor'"},
                     ErrorCase{"a\n{# open comment", "line 2: unterminated comment"},
                     ErrorCase{"{% for %}{% endfor %}", "line 1: expected a name"},
                     ErrorCase{"{% break %}", "line 1: 'break' outside of a for loop"}},
                    absl::StatusCode::kInvalidArgument);
  // Runtime errors also name the line.
  ASSERT_NO_FATAL_FAILURE(ExpectRenderError(
      "x\n{{ messages[0].content + 1 }}", {{"user", "hi"}}, absl::StatusCode::kInvalidArgument,
      "line 2: unsupported operand type(s) for +: 'str' and 'int'"));
  auto u = ChatTemplate::Parse("{{ nothing.attr }}");
  ASSERT_TRUE(u.ok());
  EXPECT_NE(u->Render({}, {}).status().message().find("'nothing' is undefined"), std::string::npos);
}

TEST(ChatTemplateEngine, StrftimeNow) {
  auto r = Render("{{ strftime_now('%Y') | length }} {{ strftime_now('%d %b %Y') | length }}");
  EXPECT_EQ(r, "4 11");
}

}  // namespace
}  // namespace polykv::model
