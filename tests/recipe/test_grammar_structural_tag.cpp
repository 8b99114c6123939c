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
       "need the model's tokenizer"},
      {R"({"format": {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": {"type": "token",
          "token": 7}}})", "/format/end/type", "need the model's tokenizer"},
      {R"({"format": {"type": "nope"}})", "/format/type", "unknown format type 'nope'"},
      {R"({"format": {"type": "any_text", "max_tokens": -1}})", "/format/max_tokens", "must be null or 0 to 2147483647"},
      {R"({"format": {"type": "any_text", "max_token": 5}})", "/format/max_token",
       "unknown member 'max_token': format 'any_text' takes type, excludes, max_tokens, max_chars"},
      {R"({"format": {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": "</a>", "ends": ["x"]}})",
       "/format/ends", "unknown member 'ends': format 'tag' takes type, begin, content, end"},
      {R"({"triggers": ["<f="], "structures": [{"begin": "<f=a>", "schemas": {}, "end": "</f>"}]})",
       "/structures/0/schemas", "unknown member 'schemas': a structure takes begin, schema, end"},
      {R"({"format": {"type": "json_schema", "json_schema": {}, "style": "deepseek_xml", "max_whitespace_cnt": 0}})",
       "/format/max_whitespace_cnt", "a newline between parameters"},
      {R"({"format": {"type": "any_text", "max_chars": "5"}})", "/format/max_chars", "must be null or 0 to 2147483647"},
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
      {R"({"format": {"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}})", "/format/style", "style 'qwen_xml' is not supported: a DeepSeek model's parameters are 'deepseek_xml'"},
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

TEST_CASE("structural tag: a json_schema format's any_order") {
  const auto g = tag_grammar(R"({"type": "structural_tag", "format": {"type": "json_schema", "any_order": true,
      "json_schema": )" + weather_schema + "}}");
  CHECK(accepts(g, R"({"city": "Paris"})"));
  const auto two = tag_grammar(R"({"type": "structural_tag", "format": {"type": "json_schema", "any_order": true,
      "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "required": ["a", "b"], "additionalProperties": false}}})");
  CHECK(accepts(two, R"({"b": 1, "a": 2})"));
  CHECK_FALSE(accepts(two, R"({"b": 1})"));
  const auto ordered = tag_grammar(R"({"type": "structural_tag", "format": {"type": "json_schema",
      "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "required": ["a", "b"], "additionalProperties": false}}})");
  CHECK_FALSE(accepts(ordered, R"({"b": 1, "a": 2})"));
}

TEST_CASE("structural tag: max_whitespace_cnt 0 asks for the compact JSON form") {
  const std::string schema = R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array"}},
      "required": ["a", "b"], "additionalProperties": false})";
  const auto with = [&](const std::string& cap) {
    return tag_grammar(R"({"type": "structural_tag", "format": {"type": "json_schema", "json_schema": )" + schema + cap +
                       "}}");
  };
  const auto compact = with(R"(, "max_whitespace_cnt": 0)");
  CHECK(accepts(compact, R"({"a":1,"b":[2,3]})"));
  CHECK_FALSE(accepts(compact, R"({"a": 1, "b": [2, 3]})"));
  for (const auto& cap : {std::string(R"(, "max_whitespace_cnt": 1)"), std::string(R"(, "max_whitespace_cnt": null)"),
                          std::string()}) {
    const auto canonical = with(cap);  // one space after ':' and ',' at most: within any cap of 1 or more
    CHECK(accepts(canonical, R"({"a": 1, "b": [2, 3]})"));
    CHECK_FALSE(accepts(canonical, R"({"a":1,"b":[2,3]})"));
  }
}

TEST_CASE("structural tag: the deepseek_xml style writes a call's parameters in DSML") {
  const std::string d(1, static_cast<char>(gr::dsml_byte));  // the ｜DSML｜ control token
  const auto g = tag_grammar(R"({"type": "structural_tag", "format": {"type": "tag", "begin": "<call>\n",
      "content": {"type": "json_schema", "style": "deepseek_xml", "json_schema": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
      "required": ["city"], "additionalProperties": false}}, "end": "</call>"}})");
  const auto param = [&](const std::string& name, bool text, const std::string& value) {
    return "<" + d + "parameter name=\"" + name + "\" string=\"" + (text ? "true" : "false") + "\">" + value + "</" + d +
           "parameter>\n";
  };
  CHECK(accepts(g, "<call>\n" + param("city", true, "Paris") + "</call>"));
  CHECK(accepts(g, "<call>\n" + param("city", false, "\"Paris\"") + param("days", false, "3") + "</call>"));
  CHECK_FALSE(accepts(g, "<call>\n" + param("days", false, "3") + "</call>"));  // city is required
  CHECK_FALSE(accepts(g, "<call>\n" + param("city", true, "Paris") + param("days", false, "0") + "</call>"));
  CHECK_FALSE(accepts(g, "<call>\n{\"city\": \"Paris\"}</call>"));
  CHECK_FALSE(accepts(g, "<call>\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</call>"));
  // Along the V4 tokens, ｜DSML｜ as its control token: every third mask against trying each.
  const gr::mask_computer masks(g, v4_vocab());
  const auto dsml = *v4().token_to_id("｜DSML｜");
  std::vector<std::uint32_t> ids;
  for (const auto& piece : {std::string("<call>\n<"), std::string("\x01"), std::string("parameter name=\"city\" string=\"true\">Oslo</"),
                            std::string("\x01"), std::string("parameter>\n</call>")}) {
    if (piece == "\x01") {
      ids.push_back(dsml);
      continue;
    }
    for (const auto id : v4().encode(piece, troupe::recipe::encode_mode::raw)) ids.push_back(id);
  }
  gr::matcher m(g);
  for (std::size_t i = 0; i <= ids.size(); ++i) {
    if (i % 3 == 0 || i == ids.size()) CHECK(masks.allowed(m) == brute_force_allowed(m, *v4_vocab()));
    if (i < ids.size()) REQUIRE(masks.accept(m, ids[i]));
  }
  CHECK(m.is_complete());
  // What a strict tool refuses, named with its pointer; other styles refused.
  const auto e = tag_error(R"({"type": "structural_tag", "format": {"type": "json_schema", "style": "deepseek_xml",
      "json_schema": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true}}})");
  CHECK(e.pointer == "/format/json_schema/additionalProperties");
  CHECK(e.message.find("a deepseek_xml value takes only the parameters") != std::string::npos);
  const auto q = tag_error(R"({"type": "structural_tag", "format": {"type": "json_schema", "style": "qwen_xml",
      "json_schema": {}}})");
  CHECK(q.pointer == "/format/style");
}

TEST_CASE("structural tag: masks equal trying every token of the DeepSeek-V4 vocabulary") {
  const auto g = tag_grammar(tools_format(""));
  check_masks_along(g, R"(Checking the weather now: <function=get_weather>{"city": "Kraków"}</function> and )"
                       R"(the time <function=get_time>{"tz": "UTC"}</function>. Done.)");
}

// Token-level formats, over the V4 vocabulary: whole tokens, named by id or by string.
namespace {

const gr::token_names& v4_names() {
  static const gr::token_names names = gr::names_of(v4_vocab(), v4());
  return names;
}

std::shared_ptr<const gr::grammar> token_grammar(const std::string& format) {
  auto r = gr::compile_structural_tag(std::string_view(R"({"type": "structural_tag", "format": )" + format + "}"), {},
                                      &v4_names());
  if (auto* e = std::get_if<gr::structural_tag_error>(&r)) FAIL_CHECK(e->to_string());
  REQUIRE(std::holds_alternative<gr::grammar>(r));
  return std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
}

gr::structural_tag_error token_error(const std::string& format) {
  auto r = gr::compile_structural_tag(std::string_view(R"({"type": "structural_tag", "format": )" + format + "}"), {},
                                      &v4_names());
  REQUIRE(std::holds_alternative<gr::structural_tag_error>(r));
  return std::get<gr::structural_tag_error>(r);
}

std::uint32_t id_of(const std::string& token) {
  const auto id = v4_names().id_of(token);
  REQUIRE_MESSAGE(id.has_value(), token);
  return *id;
}

// Text as the ids of its raw tokenization.
std::vector<std::uint32_t> text_ids(const std::string& text) {
  const auto ids = v4().encode(text, troupe::recipe::encode_mode::raw);
  return {ids.begin(), ids.end()};
}

// The allowed ids by offering each id of the vocabulary to a copy of the matcher (the mask's
// independent answer): end-of-sequence when the output is complete.
std::vector<std::uint32_t> offered_allowed(const gr::mask_computer& masks, const gr::matcher& m) {
  std::vector<std::uint32_t> ids;
  const auto& eos = v4_vocab()->eos();
  for (std::uint32_t id = 0; id < v4_vocab()->size(); ++id) {
    if (std::find(eos.begin(), eos.end(), id) != eos.end()) {
      if (m.is_complete()) ids.push_back(id);
      continue;
    }
    gr::matcher copy = m;
    if (masks.accept(copy, id)) ids.push_back(id);
  }
  return ids;
}

// Feeds `ids`, checking every `every`-th mask and the last against offered_allowed; returns the
// matcher.
gr::matcher feed(const std::shared_ptr<const gr::grammar>& g, const std::vector<std::uint32_t>& ids,
                 std::size_t every = 1) {
  const gr::mask_computer masks(g, v4_vocab());
  gr::matcher m(g);
  for (std::size_t i = 0; i <= ids.size(); ++i) {
    if (i % every == 0 || i == ids.size()) {
      INFO("after ", i, " tokens");
      CHECK(masks.allowed(m) == offered_allowed(masks, m));
    }
    if (i < ids.size()) REQUIRE_MESSAGE(masks.accept(m, ids[i]), "token ", i, " (id ", ids[i], ")");
  }
  return m;
}

std::vector<std::uint32_t> cat(std::initializer_list<std::vector<std::uint32_t>> parts) {
  std::vector<std::uint32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

const std::string call_tags = R"({"type": "token_triggered_tags", "trigger_tokens": ["<｜tool▁call▁begin｜>"],
    "tags": [{"type": "tag", "begin": {"type": "token", "token": "<｜tool▁call▁begin｜>"},
              "content": {"type": "json_schema", "json_schema": )" + weather_schema + R"(},
              "end": {"type": "token", "token": "<｜tool▁call▁end｜>"}}])";

}  // namespace

TEST_CASE("structural tag: token_triggered_tags start a tag at a control token, never at its text") {
  const auto g = token_grammar(call_tags + "}");
  const gr::mask_computer masks(g, v4_vocab());
  const auto begin = id_of("<｜tool▁call▁begin｜>"), end = id_of("<｜tool▁call▁end｜>"), user = id_of("<｜User｜>");
  const auto m = feed(g, cat({text_ids("Let me check. "), {begin}, text_ids(R"({"city": "Kraków"})"), {end},
                              text_ids(" Done, and again: "), {begin}, text_ids(R"({"city": "Oslo"})"), {end}}),
                      3);
  CHECK(m.is_complete());
  gr::matcher start(g);
  const auto first = masks.allowed(start);
  const auto has = [](const std::vector<std::uint32_t>& ids, std::uint32_t id) {
    return std::binary_search(ids.begin(), ids.end(), id);
  };
  CHECK(has(first, begin));
  CHECK_FALSE(has(first, end));   // only a tag ends with it
  CHECK_FALSE(has(first, user));  // a control token the tag does not name
  CHECK(first.size() > 100000);   // any text token
  // Inside the call: JSON only, and the end token once the object is whole.
  gr::matcher in(g);
  REQUIRE(masks.accept(in, begin));
  CHECK_FALSE(has(masks.allowed(in), end));
  for (const auto id : text_ids(R"({"city": "Rome"})")) REQUIRE(masks.accept(in, id));
  CHECK(masks.allowed(in) == std::vector<std::uint32_t>{end});
  // The text of the control token is text, and starts no tag.
  gr::matcher text(g);
  for (const auto id : text_ids("<｜tool▁call▁begin｜>{")) REQUIRE(masks.accept(text, id));
  CHECK(text.is_complete());
  CHECK_FALSE(has(masks.allowed(text), end));
  // Rollback and serialisation keep the token-level state.
  gr::matcher r(g);
  REQUIRE(masks.accept(r, begin));
  const auto saved = r.serialize();
  REQUIRE(masks.accept(r, text_ids("{")[0]));
  REQUIRE(r.rollback(1));
  CHECK(r.serialize() == saved);
  auto restored = gr::matcher::restore(g, saved);
  REQUIRE(restored);
  CHECK(masks.allowed(*restored) == masks.allowed(r));
}

TEST_CASE("structural tag: at_least_one and stop_after_first over tokens") {
  const auto once = token_grammar(call_tags + R"(, "at_least_one": true, "stop_after_first": true})");
  const gr::mask_computer masks(once, v4_vocab());
  const auto begin = id_of("<｜tool▁call▁begin｜>"), end = id_of("<｜tool▁call▁end｜>");
  gr::matcher m(once);
  CHECK(masks.allowed(m) == std::vector<std::uint32_t>{begin});  // no text first
  const auto done = feed(once, cat({{begin}, text_ids(R"({"city": "Paris"})"), {end}}));
  CHECK(done.is_complete());
  CHECK(masks.allowed(done) == v4_vocab()->eos());  // nothing after the first call
}

TEST_CASE("structural tag: any_tokens and exclude_token read whole tokens") {
  const auto think = id_of("<think>"), close = id_of("</think>"), hello = id_of("Hello");
  // A token-level tag whose content is any tokens but "Hello" (as a token: its text by other
  // tokens is fine), at most 3 of them.
  const auto g = token_grammar(R"({"type": "tag", "begin": {"type": "token", "token": "<think>"},
      "content": {"type": "any_tokens", "exclude_tokens": ["Hello"], "max_tokens": 3},
      "end": {"type": "token", "token": "</think>"}})");
  const gr::mask_computer masks(g, v4_vocab());
  gr::matcher m(g);
  REQUIRE(masks.accept(m, think));
  auto inside = masks.allowed(m);
  CHECK_FALSE(std::binary_search(inside.begin(), inside.end(), hello));
  CHECK(std::binary_search(inside.begin(), inside.end(), close));   // the content may be empty
  CHECK_FALSE(std::binary_search(inside.begin(), inside.end(), think));  // a control token, not text
  const auto he = text_ids("He"), llo = text_ids("llo");
  REQUIRE(he.size() == 1);
  REQUIRE(llo.size() == 1);
  REQUIRE(masks.accept(m, he[0]));
  REQUIRE(masks.accept(m, llo[0]));
  REQUIRE(masks.accept(m, text_ids("!")[0]));
  CHECK(masks.allowed(m) == std::vector<std::uint32_t>{close});  // the budget is spent
  feed(g, cat({{think}, he, llo, {close}}));
  CHECK_FALSE(masks.can_accept(gr::matcher(g), hello));

  // exclude_token: exactly one token; the enclosing tag's end token is excluded by itself.
  const auto one = token_grammar(R"({"type": "tag", "begin": "[", "content": {"type": "exclude_token",
      "exclude_tokens": [)" + std::to_string(hello) + R"(]}, "end": {"type": "token", "token": 128822}})");
  const gr::mask_computer ones(one, v4_vocab());
  gr::matcher o(one);
  REQUIRE(ones.accept(o, text_ids("[")[0]));
  const auto any_one = ones.allowed(o);
  CHECK_FALSE(std::binary_search(any_one.begin(), any_one.end(), hello));
  CHECK_FALSE(std::binary_search(any_one.begin(), any_one.end(), close));
  REQUIRE(ones.accept(o, he[0]));
  CHECK(ones.allowed(o) == std::vector<std::uint32_t>{close});
}

TEST_CASE("structural tag: any_text's token budget before a token end") {
  // DeepSeek's </think> is a control token: a reasoning budget as XGrammar's docs write it, with
  // the tag's ends as tokens.
  const auto think = id_of("<think>"), close = id_of("</think>");
  const auto g = token_grammar(R"({"type": "tag", "begin": {"type": "token", "token": "<think>"},
      "content": {"type": "any_text", "max_tokens": 2}, "end": {"type": "token", "token": "</think>"}})");
  const gr::mask_computer masks(g, v4_vocab());
  gr::matcher m(g);
  REQUIRE(masks.accept(m, think));
  const auto inside = masks.allowed(m);
  CHECK(inside.size() > 100000);
  CHECK(std::binary_search(inside.begin(), inside.end(), close));
  CHECK_FALSE(std::binary_search(inside.begin(), inside.end(), think));
  REQUIRE(masks.accept(m, text_ids("Hmm")[0]));
  REQUIRE(masks.accept(m, text_ids(",")[0]));
  CHECK(masks.allowed(m) == std::vector<std::uint32_t>{close});  // the budget is spent
  CHECK(feed(token_grammar(R"({"type": "sequence", "elements": [{"type": "any_text", "max_tokens": 3},
      {"type": "const_string", "value": "!"}]})"), cat({text_ids("ok"), text_ids("!")})).is_complete());
}

TEST_CASE("structural tag: any_text's budgets count the text's tokens and characters, not its end") {
  // A token counts once, whether it lies in the text or enters or leaves it midway.
  const auto one = token_grammar(R"({"type": "sequence", "elements": [{"type": "const_string", "value": "x"},
      {"type": "any_text", "max_tokens": 1}, {"type": "const_string", "value": "!"}]})");
  const auto tokens_accept = [&](std::initializer_list<std::string_view> tokens) {
    gr::matcher m(one);
    for (const auto t : tokens)
      if (!m.accept_token(t)) return false;
    return m.is_complete();
  };
  CHECK(tokens_accept({"xab", "!"}));
  CHECK(tokens_accept({"x", "ab!"}));
  CHECK(tokens_accept({"xab!"}));
  CHECK(tokens_accept({"x", "!"}));
  CHECK(tokens_accept({"x", "a", "!"}));
  CHECK_FALSE(tokens_accept({"xa", "b!"}));
  CHECK_FALSE(tokens_accept({"x", "a", "b", "!"}));

  // Characters are code points: a character split between tokens counts once.
  const auto chars = token_grammar(R"({"type": "sequence", "elements": [{"type": "any_text", "max_chars": 3},
      {"type": "const_string", "value": "!"}]})");
  CHECK(accepts(chars, "h\xC3\xA9\xC3\xA9!"));
  CHECK(accepts(chars, "!"));
  CHECK_FALSE(accepts(chars, "abcd!"));
  gr::matcher split(chars);
  CHECK(split.accept_token("h\xC3"));
  CHECK(split.accept_token("\xA9\xC3\xA9"));
  CHECK_FALSE(split.can_accept("x"));
  CHECK(split.accept_token("!"));
  CHECK(split.is_complete());

  // Budgets of 0 leave no text; one as large as the schema allows is no budget at all.
  CHECK(accepts(token_grammar(R"({"type": "tag", "begin": "<", "content": {"type": "any_text", "max_chars": 0},
      "end": ">"})"), "<>"));
  CHECK_FALSE(accepts(token_grammar(R"({"type": "tag", "begin": "<", "content": {"type": "any_text",
      "max_tokens": 0}, "end": ">"})"), "<a>"));
  CHECK(accepts(token_grammar(R"({"type": "any_text", "max_tokens": 2147483647, "max_chars": 2147483647})"),
                std::string(5000, 'y')));
}

TEST_CASE("structural tag: a budget keeps where free text stops at the first exclude or end") {
  // With a budget the text is a rule of its own and the end follows it: it accepts the strings
  // the unbudgeted tag accepts whose text (before the end they finish with) fits the budget, also
  // for ends that overlap themselves and excludes inside or across an end.
  const struct {
    std::string ends, excludes;
  } cases[] = {
      {R"("aa")", ""}, {R"("aba")", ""}, {R"(["ab", "b]"])", ""}, {R"("ba")", R"(, "excludes": ["ab"])"},
      {R"("b")", R"(, "excludes": ["aab"])"},
  };
  for (const auto& c : cases) {
    const auto with = [&](const std::string& budget) {
      return token_grammar(R"({"type": "tag", "begin": "[", "content": {"type": "any_text")" + budget + c.excludes +
                           R"(}, "end": )" + c.ends + "}");
    };
    const auto ends = ojson::parse(c.ends);
    const auto free = with("");
    for (const int budget : {2, 100}) {
      const auto budgeted = with(R"(, "max_chars": )" + std::to_string(budget));
      const auto tokens = with(R"(, "max_tokens": )" + std::to_string(budget));
      for (const auto& text : all_strings("ab]", 7)) {
        const std::string s = "[" + text;
        std::size_t end_size = 0;
        for (const auto& e : ends.is_array() ? ends : ojson::array({ends}))
          if (s.ends_with(e.get<std::string>())) end_size = e.get<std::string>().size();
        INFO(c.ends, c.excludes, " budget ", budget, " on '", s, "'");
        const bool expected = accepts(free, s) && text.size() - end_size <= static_cast<std::size_t>(budget);
        CHECK(accepts(budgeted, s) == expected);
        // The whole string as one token: a token budget of at least 1 takes it.
        CHECK(accepts(tokens, s) == accepts(free, s));
      }
    }
  }
}

TEST_CASE("structural tag: budgeted masks equal offering every token, as budgets run out") {
  // A token budget before a string end, beside an exclude: once spent, only the end may follow.
  const auto g = token_grammar(R"({"type": "tag", "begin": "<a>", "content": {"type": "any_text",
      "max_tokens": 4, "excludes": ["bad"]}, "end": "</a>"})");
  const auto m = feed(g, text_ids("<a>Hi you all</a>"));
  CHECK(m.is_complete());
  const gr::mask_computer masks(g, v4_vocab());
  gr::matcher spent(g);
  const auto words = text_ids("Hi you all here");
  REQUIRE(words.size() == 4);
  for (const auto id : cat({text_ids("<a>"), words})) REQUIRE(masks.accept(spent, id));
  const auto after = masks.allowed(spent);
  REQUIRE_FALSE(after.empty());
  for (const auto id : after) CHECK(std::string_view("</a>").starts_with(v4_vocab()->bytes(id)));
  gr::matcher ex(g);
  REQUIRE(ex.accept_token("<a>ba"));
  CHECK_FALSE(ex.can_accept("d"));  // the exclude
  CHECK(ex.can_accept("g"));

  // A character budget bites from the first character: every mask is built with it counted,
  // including tokens that enter the text midway (" Zür" after the constant " ").
  const auto chars = token_grammar(R"({"type": "sequence", "elements": [{"type": "const_string", "value": " "},
      {"type": "any_text", "max_chars": 6}, {"type": "const_string", "value": "!"}]})");
  CHECK(feed(chars, text_ids(" Zürich!")).is_complete());
  CHECK(feed(chars, text_ids(" Zü")).can_continue());
  const gr::mask_computer cm(chars, v4_vocab());
  gr::matcher full(chars);
  for (const auto id : text_ids(" Zürich")) REQUIRE(cm.accept(full, id));
  CHECK(cm.allowed(full) == text_ids("!"));

  // Both budgets at once, and a budget of any_tokens past the old unrolled limit.
  feed(token_grammar(R"({"type": "sequence", "elements": [{"type": "any_text", "max_tokens": 3, "max_chars": 10},
      {"type": "const_string", "value": "."}]})"), text_ids("Some words."));
  const auto think = id_of("<think>"), close = id_of("</think>");
  const auto many = token_grammar(R"({"type": "tag", "begin": {"type": "token", "token": "<think>"},
      "content": {"type": "any_tokens", "max_tokens": 100000}, "end": {"type": "token", "token": "</think>"}})");
  CHECK(feed(many, cat({{think}, text_ids("A long thought."), {close}}), 4).is_complete());
}

TEST_CASE("structural tag: budgets roll back and travel with a serialised state") {
  const auto g = token_grammar(R"({"type": "sequence", "elements": [{"type": "any_text", "max_tokens": 3},
      {"type": "const_string", "value": "!"}]})");
  const gr::mask_computer masks(g, v4_vocab());
  gr::matcher m(g);
  const auto ids = text_ids("one two three");
  REQUIRE(ids.size() == 3);
  const auto fresh = masks.allowed(m);
  REQUIRE(masks.accept(m, ids[0]));
  REQUIRE(masks.accept(m, ids[1]));
  const auto one_left = masks.allowed(m);
  REQUIRE(masks.accept(m, ids[2]));
  CHECK(masks.allowed(m) == text_ids("!"));
  // Restored elsewhere: the same budget left, so the same mask.
  auto moved = gr::matcher::restore(g, m.serialize());
  REQUIRE(moved.has_value());
  CHECK(moved->state() == m.state());
  CHECK(masks.allowed(*moved) == text_ids("!"));
  REQUIRE(m.rollback(1));
  CHECK(masks.allowed(m) == one_left);
  auto again = gr::matcher::restore(g, m.serialize());
  REQUIRE(again.has_value());
  CHECK(masks.allowed(*again) == one_left);
  REQUIRE(m.rollback(2));
  CHECK(masks.allowed(m) == fresh);
  // A budget left above the rule's is refused.
  // Magic, fingerprint, complete, stack count, then per stack its depth, frames and budget left.
  std::string forged = moved->serialize();
  const auto depth = static_cast<unsigned char>(forged[4 + 8 + 1 + 4]);
  REQUIRE(forged.size() >= 4 + 8 + 1 + 4 + 4 + 8u * depth + 8);
  forged[4 + 8 + 1 + 4 + 4 + 8 * depth] = 9;  // the first stack's tokens left
  CHECK_FALSE(gr::matcher::restore(g, forged).has_value());
}

TEST_CASE("structural tag: a token names that one token, and token_dispatch switches on tokens") {
  const auto hello = id_of("Hello");
  const auto g = token_grammar(R"({"type": "sequence", "elements": [{"type": "token", "token": "Hello"},
      {"type": "const_string", "value": "!"}]})");
  const gr::mask_computer masks(g, v4_vocab());
  CHECK(masks.allowed(gr::matcher(g)) == std::vector<std::uint32_t>{hello});  // not "He" + "llo"
  CHECK(feed(g, {hello, text_ids("!")[0]}).is_complete());

  const auto sep = id_of("<｜tool▁sep｜>"), calls = id_of("<｜tool▁calls▁begin｜>");
  const auto d = token_grammar(R"({"type": "token_dispatch", "rules": [["<｜tool▁sep｜>", {"type": "const_string",
      "value": "x"}], [)" + std::to_string(calls) + R"(, {"type": "regex", "pattern": "[0-9]+"}]], "loop": true})");
  const auto m = feed(d, cat({text_ids("free "), {sep}, text_ids("x"), text_ids(" more "), {calls}, text_ids("42")}), 2);
  CHECK(m.is_complete());
  const gr::mask_computer dm(d, v4_vocab());
  gr::matcher after(d);
  REQUIRE(dm.accept(after, sep));
  CHECK(dm.allowed(after) == std::vector<std::uint32_t>{text_ids("x")[0]});
  const auto no_loop = token_grammar(R"({"type": "token_dispatch", "rules": [["<｜tool▁sep｜>", {"type":
      "const_string", "value": "x"}]], "loop": false})");
  const gr::mask_computer nm(no_loop, v4_vocab());
  auto n = feed(no_loop, cat({text_ids("a "), {sep}, text_ids("x")}));
  CHECK(nm.allowed(n) == v4_vocab()->eos());
}

TEST_CASE("structural tag: token-level refusals name the member and its pointer") {
  const struct {
    std::string format, pointer, message;
  } cases[] = {
      {R"({"type": "token", "token": "<｜no▁such｜>"})", "/format/token", "unknown token '<｜no▁such｜>'"},
      {R"({"type": "token", "token": 129280})", "/format/token", "not in the vocabulary"},
      {R"({"type": "token", "token": 1.5})", "/format/token", "a token must be"},
      {R"({"type": "token", "token": "<｜end▁of▁sentence｜>"})", "/format/token", "end-of-sequence"},
      {R"({"type": "any_tokens", "max_tokens": 2147483648})", "/format/max_tokens", "'max_tokens' must be"},
      {R"({"type": "triggered_tags", "triggers": ["<"], "tags": [{"type": "tag", "begin": {"type": "token",
          "token": "<think>"}, "content": {"type": "any_text"}, "end": "x"}]})",
       "/format/tags/0/begin", "token_triggered_tags takes tokens"},
      {R"({"type": "token_triggered_tags", "trigger_tokens": ["<think>"], "tags": [{"type": "tag", "begin": "<a>",
          "content": {"type": "any_text"}, "end": "x"}]})",
       "/format/tags/0/begin", "must begin with a token"},
      {R"({"type": "token_triggered_tags", "trigger_tokens": ["<think>"], "tags": [{"type": "tag", "begin":
          {"type": "token", "token": "</think>"}, "content": {"type": "any_text"}, "end": "x"}]})",
       "/format/tags/0/begin", "none of the trigger tokens"},
      {R"({"type": "token_triggered_tags", "trigger_tokens": [], "tags": []})", "/format/trigger_tokens",
       "must not be empty"},
      {R"({"type": "tag", "begin": {"type": "const_string", "value": "a"}, "content": {"type": "any_text"},
          "end": "b"})", "/format/begin/type", "must be {\"type\": \"token\""},
      {R"({"type": "token_dispatch", "rules": [["<think>"]]})", "/format/rules/0", "[token, format]"},
  };
  for (const auto& c : cases) {
    const auto e = token_error(c.format);
    CHECK_MESSAGE(e.pointer == c.pointer, c.format, " -> ", e.pointer, ": ", e.message);
    CHECK_MESSAGE(e.message.find(c.message) != std::string::npos, c.format, " -> ", e.message);
  }
  // At most 12 different tokens and exclusions.
  std::string many = R"({"type": "or", "elements": [)";
  for (int i = 0; i < 13; ++i) many += (i ? ", " : "") + std::string(R"({"type": "token", "token": )") + std::to_string(1000 + i) + "}";
  const auto e = token_error(many + "]}");
  CHECK(e.message.find("at most 12") != std::string::npos);
}
