// Structural tags as a grammar (recipe/grammar/structural_tag.hpp): the original form vLLM takes
// (structures and triggers) and XGrammar's format objects — free text with triggered tags, tags
// whose free-text content ends at their end string, compositions, dispatch — the errors that name
// the member at fault, and masks against trying every token of the V4 vocabulary.
#include <doctest/doctest.h>

#include "grammar_fixture.hpp"
#include "recipe/grammar/structural_tag.hpp"

using namespace troupe::recipe::testing;

namespace {

std::shared_ptr<const gr::grammar> tag_grammar(const std::string& text) {
  auto r = gr::compile_structural_tag(std::string_view(text));
  if (auto* e = std::get_if<gr::structural_tag_error>(&r)) FAIL_CHECK(e->to_string());
  REQUIRE(std::holds_alternative<gr::grammar>(r));
  return std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
}

gr::structural_tag_error tag_error(const std::string& text) {
  auto r = gr::compile_structural_tag(std::string_view(text));
  REQUIRE(std::holds_alternative<gr::structural_tag_error>(r));
  return std::get<gr::structural_tag_error>(r);
}

const std::string weather_schema =
    R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": false})";

// Two tools in XGrammar's format: <function=NAME>{json}</function>.
std::string tools_format(const std::string& flags) {
  return R"({"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<function="], "tags": [
      {"type": "tag", "begin": "<function=get_weather>", "content": {"type": "json_schema", "json_schema": )" +
         weather_schema + R"(}, "end": "</function>"},
      {"type": "tag", "begin": "<function=get_time>", "content": {"type": "json_schema", "json_schema":
        {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"],
         "additionalProperties": false}}, "end": "</function>"}])" +
         flags + "}}";
}

}  // namespace

TEST_CASE("structural tag: the original form is free text in which a trigger starts a tag of JSON") {
  const auto g = tag_grammar(R"({"type": "structural_tag", "triggers": ["<function="], "structures": [
      {"begin": "<function=get_weather>", "schema": )" + weather_schema + R"(, "end": "</function>"}]})");
  CHECK(accepts(g, ""));
  CHECK(accepts(g, "Let me look. <fun <function"));  // a trigger's prefix is text
  CHECK(accepts(g, R"(Sure. <function=get_weather>{"city": "Paris"}</function> and again)"
                   R"(<function=get_weather>{"city": "Oslo"}</function>)"));
  CHECK_FALSE(accepts(g, R"(<function=get_time>{"city": "Paris"}</function>)"));  // the trigger starts a tag
  CHECK_FALSE(accepts(g, R"(<function=get_weather>{"town": "Paris"}</function>)"));
  CHECK_FALSE(accepts(g, R"(<function=get_weather>{"city": "Paris"})"));          // unfinished
  CHECK_FALSE(accepts(g, R"(x <function=get_weather>{"city": "Paris"}</tool>)"));
  CHECK_FALSE(accepts(g, "text " + std::string(1, static_cast<char>(gr::dsml_byte))));  // no control token
}

TEST_CASE("structural tag: triggered tags dispatch on their begin; at_least_one and stop_after_first") {
  const auto free = tag_grammar(tools_format(""));
  CHECK(accepts(free, R"(Hi <function=get_time>{"tz": "CET"}</function> then <function=get_weather>)"
                      R"({"city": "Lima"}</function>.)"));
  CHECK_FALSE(accepts(free, R"(<function=get_time>{"city": "Lima"}</function>)"));
  const auto one = tag_grammar(tools_format(R"(, "at_least_one": true, "stop_after_first": true)"));
  CHECK(accepts(one, R"(<function=get_time>{"tz": "UTC"}</function>)"));
  CHECK_FALSE(accepts(one, R"(Hi <function=get_time>{"tz": "UTC"}</function>)"));  // no text first
  CHECK_FALSE(accepts(one, R"(<function=get_time>{"tz": "UTC"}</function> bye)"));  // nothing after
  CHECK_FALSE(accepts(one, ""));
  const auto first = tag_grammar(tools_format(R"(, "stop_after_first": true)"));
  CHECK(accepts(first, R"(Hi <function=get_time>{"tz": "UTC"}</function>)"));
  CHECK(accepts(first, "no call at all"));
  CHECK_FALSE(accepts(first, R"(<function=get_time>{"tz": "UTC"}</function><function=get_time>{"tz": "UTC"}</function>)"));
}

TEST_CASE("structural tag: free text as a tag's content ends at the tag's first end") {
  // XGrammar's "mix reasoning, free text and tool calls": a think block, then triggered calls.
  const auto g = tag_grammar(R"({"type": "structural_tag", "format": {"type": "sequence", "elements": [
      {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
      {"type": "triggered_tags", "triggers": ["<f="], "tags": [{"type": "tag", "begin": "<f=a>",
        "content": {"type": "const_string", "value": "1"}, "end": ["</f>", "</g>"]}]}]}})");
  CHECK(accepts(g, "<think>a <b> </thin</think>"));
  CHECK(accepts(g, "<think></think>text <f=a>1</g> more <f=a>1</f>"));
  // The first end ends the think block: what follows is the calls' text, where "<f=" must start a
  // call (read as thinking, "a</think><f=b" would pass).
  CHECK_FALSE(accepts(g, "<think>a</think><f=b</think>"));
  CHECK_FALSE(accepts(g, "think</think>"));
  CHECK_FALSE(accepts(g, "<think>a</think><f=b>1</f>"));
  // Triggered tags inside a tag stop at its end too, and exclude strings never appear in text.
  const auto inner = tag_grammar(R"({"type": "structural_tag", "format": {"type": "tag", "begin": "<r>",
      "content": {"type": "triggered_tags", "triggers": ["@"], "tags": [{"type": "tag", "begin": "@x",
        "content": {"type": "regex", "pattern": "[0-9]+"}, "end": ";"}], "excludes": ["bad"]}, "end": "</r>"}})");
  CHECK(accepts(inner, "<r>a @x12; b @x3;</r>"));
  CHECK(accepts(inner, "<r></r>"));
  CHECK_FALSE(accepts(inner, "<r>a @x12; b </r> c"));
  CHECK_FALSE(accepts(inner, "<r>a bad</r>"));
  CHECK_FALSE(accepts(inner, "<r>a @y</r>"));
}

TEST_CASE("structural tag: compositions, separators and dispatch") {
  const auto g = tag_grammar(R"({"type": "structural_tag", "format": {"type": "sequence", "elements": [
      {"type": "optional", "content": {"type": "const_string", "value": "A:"}},
      {"type": "or", "elements": [{"type": "regex", "pattern": "[a-c]{2}"},
                                  {"type": "grammar", "grammar": "root ::= \"x\" root | \"y\""}]},
      {"type": "repeat", "min": 1, "max": 2, "content": {"type": "const_string", "value": "!"}},
      {"type": "star", "content": {"type": "const_string", "value": "."}},
      {"type": "plus", "content": {"type": "const_string", "value": "#"}}]}})");
  for (const char* yes : {"ab!#", "A:xxy!!..##", "y!#"}) CHECK_MESSAGE(accepts(g, yes), yes);
  for (const char* no : {"ab#", "ab!!!#", "ad!#", "A:A:ab!#", "ab!.", "x!#"}) CHECK_MESSAGE(!accepts(g, no), no);
  const auto sep = tag_grammar(R"({"type": "structural_tag", "format": {"type": "tags_with_separator",
      "separator": ",", "tags": [{"type": "tag", "begin": "<i>", "content": {"type": "json_schema",
      "json_schema": {"type": "integer"}}, "end": "</i>"}]}})");
  CHECK(accepts(sep, ""));
  CHECK(accepts(sep, "<i>1</i>,<i>-2</i>"));
  CHECK_FALSE(accepts(sep, "<i>1</i> <i>2</i>"));
  CHECK_FALSE(accepts(sep, "x<i>1</i>"));
  const auto sep1 = tag_grammar(R"({"type": "structural_tag", "format": {"type": "tags_with_separator",
      "separator": ",", "at_least_one": true, "stop_after_first": true, "tags": [{"type": "tag", "begin": "<i>",
      "content": {"type": "json_schema", "json_schema": {"type": "integer"}}, "end": "</i>"}]}})");
  CHECK(accepts(sep1, "<i>1</i>"));
  CHECK_FALSE(accepts(sep1, ""));
  CHECK_FALSE(accepts(sep1, "<i>1</i>,<i>2</i>"));
  const auto dispatch = tag_grammar(R"({"type": "structural_tag", "format": {"type": "dispatch",
      "rules": [["<a>", {"type": "const_string", "value": "x"}], ["<b>", {"type": "regex", "pattern": "[0-9]"}]],
      "excludes": ["STOP"]}})");
  CHECK(accepts(dispatch, "hi <a>x and <b>7 done"));
  CHECK_FALSE(accepts(dispatch, "hi <a>y"));
  CHECK_FALSE(accepts(dispatch, "hi STOP"));
  const auto once = tag_grammar(R"({"type": "structural_tag", "format": {"type": "dispatch", "loop": false,
      "rules": [["<a>", {"type": "const_string", "value": "x"}]]}})");
  CHECK(accepts(once, "hi <a>x"));
  CHECK_FALSE(accepts(once, "hi <a>x and more"));
}

TEST_CASE("structural tag: what cannot be compiled is refused naming the member and its pointer") {
  const struct {
    std::string text, pointer, message;
  } cases[] = {
      {"{", "", "not valid JSON"},
      {R"({"type": "structural_tag"})", "", "needs a 'format'"},
      {R"({"type": "json_schema", "format": {"type": "any_text"}})", "/type", "must be 'structural_tag'"},
      {R"({"format": {"type": "sequence", "elements": [{"type": "token", "token": 7}]}})", "/format/elements/0/type",
       "token-level"},
      {R"({"format": {"type": "nope"}})", "/format/type", "unknown format type 'nope'"},
      {R"({"format": {"type": "any_text", "max_tokens": 5}})", "/format/max_tokens", "not supported"},
      {R"({"format": {"type": "tag", "begin": "<a>", "content": {"type": "json_schema", "json_schema":
          {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 3}}}}, "end": "</a>"}})",
       "/format/content/json_schema/properties/n/multipleOf", "unsupported JSON schema"},
      {R"({"format": {"type": "triggered_tags", "triggers": ["<f="], "tags": [{"type": "tag", "begin": "<g=x>",
          "content": {"type": "const_string", "value": ""}, "end": "</g>"}]}})",
       "/format/tags/0/begin", "starts with no trigger"},
      {R"({"format": {"type": "triggered_tags", "triggers": [], "tags": []}})", "/format/tags", "non-empty"},
      {R"({"format": {"type": "regex", "pattern": "a("}})", "/format/pattern", "invalid regex"},
      {R"({"format": {"type": "grammar", "grammar": "root ::= x"}})", "/format/grammar", "invalid grammar"},
      {R"({"format": {"type": "repeat", "min": 3, "max": 2, "content": {"type": "const_string", "value": "a"}}})",
       "/format/max", "'max' must be"},
      {R"({"format": {"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}})", "/format/style", "'json'"},
      {R"({"triggers": ["<f="], "structures": [{"begin": "<f=a>", "end": "</f>"}]})", "/structures/0",
       "missing member 'schema'"},
      {R"({"format": {"type": "const_string", "value": "a", "x": 1}, "y": [)" + std::string(200, '[') + "]}", "",
       "nested more than 128"},
  };
  for (const auto& c : cases) {
    const auto e = tag_error(c.text);
    CHECK_MESSAGE(e.pointer == c.pointer, c.text, " -> ", e.pointer, ": ", e.message);
    CHECK_MESSAGE(e.message.find(c.message) != std::string::npos, c.text, " -> ", e.message);
  }
}

TEST_CASE("structural tag: masks equal trying every token of the DeepSeek-V4 vocabulary") {
  const auto g = tag_grammar(tools_format(""));
  check_masks_along(g, R"(Checking the weather now: <function=get_weather>{"city": "Kraków"}</function> and )"
                       R"(the time <function=get_time>{"tz": "UTC"}</function>. Done.)");
}
