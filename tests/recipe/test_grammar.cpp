// The structured-output engine (recipe/grammar/): regexes against std::regex, integer bounds,
// the canonical JSON rules, masks against a token-by-token check, random walks through allowed
// tokens that must always produce valid JSON, serialisation and rollback.
#include <doctest/doctest.h>

#include <random>
#include <thread>

#include "grammar_fixture.hpp"
#include "recipe/grammar/token_mask.hpp"
#include "recipe_fixture.hpp"

using namespace troupe::recipe::testing;
using troupe::recipe::grammar::mask_computer;
using troupe::recipe::grammar::matcher;
using troupe::recipe::grammar::vocabulary;

namespace {

// A strict-mode style schema: nested objects, enums, arrays with bounds, anyOf with null,
// recursion through $defs, a pattern, a format and integer bounds.
const ojson& strict_schema() {
  static const ojson s = ojson::parse(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 12},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "role": {"enum": ["admin", "user", "guest"]},
      "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "minItems": 1, "maxItems": 3},
      "email": {"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]},
      "tree": {"$ref": "#/$defs/node"},
      "born": {"type": "string", "format": "date"},
      "score": {"type": "number"},
      "ok": {"type": "boolean"}
    },
    "required": ["name", "age", "role", "tags", "email", "tree", "born", "score", "ok"],
    "additionalProperties": false,
    "$defs": {
      "node": {
        "type": "object",
        "properties": {"v": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5},
                       "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"],
        "additionalProperties": false
      }
    }
  })");
  return s;
}

}  // namespace

TEST_CASE("grammar regex: matches exactly what std::regex_match matches, on every short string") {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"a*b", "ab"},          {"(ab|a)*", "ab"},        {"a{2,3}", "ab"},         {"[a-c]+-?[^a-c]", "abd-"},
      {"(a|b)?c{0,2}", "abc"}, {"\\d+\\.\\d*", "1.a"},   {"a(?:b|)+c", "abc"},     {"[\\w-]{2}", "a-_."},
      {"x|y|", "xyz"},        {"a{3}", "a"},            {"(a?){2}b", "ab"},       {"[^-a]*", "a-b"},
      {"\\s\\S", " a\t"},     {"a+?b*?", "ab"},         {"[.][^.]", ".a-"},       {"\\x41\\u0062", "Abc"}};
  for (const auto& [pattern, alphabet] : cases) {
    const auto g = regex_grammar(pattern);
    const std::regex oracle(pattern, std::regex::ECMAScript);
    for (const auto& s : all_strings(alphabet, 5)) {
      INFO("pattern ", pattern, " on \"", s, "\"");
      CHECK(accepts(g, s) == std::regex_match(s, oracle));
    }
  }
}

TEST_CASE("grammar enclosed: open, a sentence of the rule, close, as the subset construction of the same gives") {
  // Closing texts that the rule's own sentences can also hold, start or continue ("ab" inside
  // (ab)*, "aa" after a+), so that the product must follow several ways at once.
  const std::vector<std::string> patterns{"[ab]*", "a|ab", "(ab)*c?", "a+", "", "b{2,3}"};
  const std::vector<std::pair<std::string, std::string>> ends{{"", "ab"}, {"x", "a"}, {"c", "aa"}, {"", ""},
                                                              {"ab", "bab"}, {"x", "c"}};
  for (const auto& p : patterns)
    for (const auto& [open, close] : ends) {
      const auto a = regex_grammar(p);
      auto g = std::make_shared<gr::grammar>();
      g->rules.push_back(gr::enclosed(open, a->rules[a->root], close, "t", 4096));
      REQUIRE(gr::prune(*g));
      const auto oracle = regex_grammar(open + "(?:" + p + ")" + close);
      for (const auto& s : all_strings("abcx", 6)) {
        INFO("\"", open, "\" (", p, ") \"", close, "\" on \"", s, "\"");
        CHECK(accepts(g, s) == accepts(oracle, s));
      }
    }
}

TEST_CASE("grammar regex: characters are code points encoded as UTF-8") {
  const auto g = regex_grammar("[α-ω]+.😀?");
  CHECK(accepts(g, "αβγx"));
  CHECK(accepts(g, "ωé😀"));
  CHECK(accepts(g, "α😀"));  // . matches the 4-byte code point
  CHECK_FALSE(accepts(g, "a😀"));
  CHECK_FALSE(accepts(g, "α\xce"));  // half a code point
  CHECK_FALSE(accepts(g, "α\n"));    // . excludes line terminators
}

TEST_CASE("grammar regex: constructs that cannot be enforced exactly are refused with their offset") {
  for (const auto& [pattern, offset] : std::vector<std::pair<std::string, std::size_t>>{
           {"a(?=b)", 1}, {"(a)\\1", 3}, {"a\\bc", 1}, {"\\p{L}", 0}, {"a^b", 0}, {"(a", 0}, {"a{5,2}", 1}, {"*", 0}}) {
    const auto r = troupe::recipe::grammar::compile_regex(pattern);
    const auto* e = std::get_if<troupe::recipe::grammar::regex_error>(&r);
    REQUIRE_MESSAGE(e != nullptr, pattern);
    CHECK_MESSAGE(e->offset == offset, pattern, ": ", e->message);
  }
  // The n-th letter from the end is an a: 2^n DFA states, past the limit.
  const auto huge = troupe::recipe::grammar::compile_regex("[ab]*a[ab]{20}");
  CHECK(std::holds_alternative<troupe::recipe::grammar::regex_error>(huge));
  // 2,000 optional pieces in a row: every subset holds thousands of NFA states; refused by the
  // subset work limit (a fuzz input that took 6 s before it).
  std::string chain;
  for (int i = 0; i < 2000; ++i) chain += "(ab|cd)?[x-z]{0,3}";
  const auto wide = troupe::recipe::grammar::compile_regex(chain);
  REQUIRE(std::holds_alternative<troupe::recipe::grammar::regex_error>(wide));
  CHECK(std::get<troupe::recipe::grammar::regex_error>(wide).message.find("too large") != std::string::npos);
}

TEST_CASE("grammar schema: integer bounds accept exactly the integers in range") {
  for (const auto& [lo, hi] : std::vector<std::pair<int, int>>{{-130, 130}, {7, 7}, {0, 1000}, {-99, -10}, {95, 205}}) {
    const auto g = schema_grammar({{"type", "integer"}, {"minimum", lo}, {"maximum", hi}});
    for (int x = -1200; x <= 1200; ++x) {
      INFO("[", lo, ", ", hi, "] ", x);
      CHECK(accepts(g, std::to_string(x)) == (x >= lo && x <= hi));
    }
    CHECK_FALSE(accepts(g, "-0"));
    CHECK_FALSE(accepts(g, "007"));
  }
  const auto open = schema_grammar({{"type", "integer"}, {"exclusiveMinimum", 41}});
  CHECK(accepts(open, "42"));
  CHECK(accepts(open, "123456789012"));
  CHECK_FALSE(accepts(open, "41"));
  CHECK_FALSE(accepts(open, "-50"));
}

TEST_CASE("grammar schema: minLength and maxLength count characters: escapes and multi-byte ones are one each") {
  // Strings of 0..5 characters drawn from one-byte, two-byte, four-byte and escaped characters,
  // against bounds that share a rule (the two 2..3 properties) and bounds that do not.
  const std::vector<std::string> chars{"a", "\\\"", "\\n", "\\u0001", "é", "😀"};
  for (const auto& [lo, hi] : std::vector<std::pair<int, int>>{{0, 0}, {2, 3}, {0, 5}, {4, 4}}) {
    const auto g = schema_grammar(ojson::parse(
        R"({"type": "object", "properties": {"a": {"type": "string", "minLength": )" + std::to_string(lo) +
        R"(, "maxLength": )" + std::to_string(hi) + R"(}, "b": {"type": "string", "minLength": 2, "maxLength": 3}},
            "required": ["a", "b"], "additionalProperties": false})"));
    std::mt19937 rng(static_cast<unsigned>(lo * 31 + hi));
    for (int n = 0; n <= 5; ++n)
      for (int trial = 0; trial < 8; ++trial) {
        std::string text;
        for (int i = 0; i < n; ++i) text += chars[rng() % chars.size()];
        INFO("[", lo, ", ", hi, "] ", text);
        CHECK(accepts(g, R"({"a": ")" + text + R"(", "b": "xy"})") == (n >= lo && n <= hi));
        CHECK(accepts(g, R"({"a": ")" + std::string(static_cast<std::size_t>(lo), 'z') + R"(", "b": ")" + text + "\"}") ==
              (n >= 2 && n <= 3));
      }
  }
  // Bounds that admit no string make the schema accept nothing; bounds past the state limit
  // name the keyword.
  auto r = troupe::recipe::grammar::compile_json_schema(
      ojson::parse(R"({"type": "string", "minLength": 3, "maxLength": 2})"));
  CHECK(std::get<troupe::recipe::grammar::schema_error>(r).message == "the schema accepts no JSON value");
  r = troupe::recipe::grammar::compile_json_schema(ojson::parse(R"({"type": "string", "maxLength": 1000})"));
  const auto& e = std::get<troupe::recipe::grammar::schema_error>(r);
  CHECK(e.keyword == "maxLength");
  CHECK(e.message.find("automaton states") != std::string::npos);
}

TEST_CASE("grammar schema: the canonical form is json.dumps spacing, properties order, canonical escapes") {
  const auto g = schema_grammar(ojson::parse(
      R"({"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "array"}}, "required": ["b"]})"));
  CHECK(accepts(g, R"({"b": "x\"\n\u0001é", "a": [1, {"k": null}]})"));
  CHECK(accepts(g, R"({"b": "", "z": true})"));           // additional members after the declared ones
  CHECK_FALSE(accepts(g, R"({"a": [], "b": ""})"));       // declared members in properties order
  CHECK_FALSE(accepts(g, R"({"b":""})"));                 // ": " and ", " exactly
  CHECK_FALSE(accepts(g, R"({"b": "", "a": [1,2]})"));
  CHECK_FALSE(accepts(g, R"( {"b": ""})"));
  CHECK_FALSE(accepts(g, R"({"b": "\u0041"})"));          // no escape where none is needed
  CHECK_FALSE(accepts(g, R"({"b": "\/"})"));
  CHECK_FALSE(accepts(g, R"({"b": "", "b": ""})"));       // a declared name is not an additional one
  CHECK_FALSE(accepts(g, R"({"a": []})"));                // required
}

TEST_CASE("grammar schema: the compact style has no whitespace at all") {
  const auto schema = ojson::parse(
      R"({"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "array"},
          "c": {"const": {"k": [1, 2]}}}, "required": ["b"]})");
  gr::json_style compact;
  compact.compact = true;
  auto r = gr::compile_json_schema(schema, {}, compact);
  REQUIRE(std::holds_alternative<gr::grammar>(r));
  const auto g = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
  CHECK(accepts(g, R"({"b":"x y","a":[1,{"k":null},[]],"c":{"k":[1,2]}})"));
  CHECK(accepts(g, R"({"b":"","z":true,"y":{}})"));
  CHECK_FALSE(accepts(g, R"({"b": ""})"));
  CHECK_FALSE(accepts(g, R"({"b":"","a":[1, 2]})"));
  CHECK_FALSE(accepts(g, R"({"b":"","c":{"k": [1,2]}})"));
  CHECK(gr::canonical_json(nlohmann::json::parse(R"({"k": [1, {"j": null}]})"), compact)
        == R"({"k":[1,{"j":null}]})");
  const auto any = std::make_shared<const gr::grammar>(gr::any_json_object(compact));
  CHECK(accepts(any, R"({"a":[1,"x"],"b":{"c":false}})"));
  CHECK_FALSE(accepts(any, R"({"a": 1})"));
}

TEST_CASE("grammar schema: any_order takes permitted members in any order, as many as the required ones") {
  const auto schema = ojson::parse(
      R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
          "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {"enum": [1, 2]},
          "v": {"type": "boolean"}}, "required": ["k", "v"], "additionalProperties": false}},
          "no": false}, "required": ["name", "age"], "additionalProperties": false})");
  gr::json_style style;
  style.any_order = true;
  auto r = gr::compile_json_schema(schema, {}, style);
  REQUIRE(std::holds_alternative<gr::grammar>(r));
  const auto g = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
  CHECK(accepts(g, R"({"name": "Ada", "age": 36})"));
  CHECK(accepts(g, R"({"age": 36, "name": "Ada"})"));
  CHECK(accepts(g, R"({"tags": [{"v": true, "k": 2}], "age": 1, "name": ""})"));  // nested too
  CHECK(accepts(g, R"({"age": 1, "age": 2})"));  // as XGrammar: keys are not tracked, only counted
  CHECK_FALSE(accepts(g, R"({"age": 36})"));     // fewer entries than required properties
  CHECK_FALSE(accepts(g, R"({})"));
  CHECK_FALSE(accepts(g, R"({"name": "Ada", "age": 36, "x": 1})"));  // additionalProperties false
  CHECK_FALSE(accepts(g, R"({"name": "Ada", "age": 36, "no": 1})"));  // a false schema
  CHECK_FALSE(accepts(g, R"({"name": 1, "age": 36})"));
  CHECK_FALSE(accepts(g, R"({"name": "Ada", "age": 36, "tags": [{"k": 1}]})"));
  // Without required members the empty object is one; other keys where additionalProperties
  // allows them, never the declared names with another schema.
  const auto open = ojson::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})");
  auto o = gr::compile_json_schema(open, {}, style);
  REQUIRE(std::holds_alternative<gr::grammar>(o));
  const auto og = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(o)));
  CHECK(accepts(og, "{}"));
  CHECK(accepts(og, R"({"z": [1], "a": 2, "b": null})"));
  CHECK_FALSE(accepts(og, R"({"a": "x"})"));
  check_masks_along(g, R"({"tags": [{"v": false, "k": 1}, {"k": 2, "v": true}], "age": -7, "name": "Zoë"})");
}

TEST_CASE("grammar schema: a whitespace pattern's text between tokens around { } [ ] , :, none elsewhere") {
  auto st = gr::whitespace_style(R"([\n ]?)");
  REQUIRE(std::holds_alternative<gr::json_style>(st));
  const auto style = std::get<gr::json_style>(st);
  const auto schema = ojson::parse(
      R"({"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "array"},
          "c": {"enum": [{"k": [1, 2], "e": {}}, 5]}, "d": {"type": "array", "items": {"type": "integer"},
          "maxItems": 2}}, "required": ["b"]})");
  auto r = gr::compile_json_schema(schema, {}, style);
  REQUIRE(std::holds_alternative<gr::grammar>(r));
  const auto g = std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
  CHECK(accepts(g, R"({"b":"x y","a":[1,{"k":null},[]],"c":{"e":{},"k":[1,2]}})"));
  CHECK(accepts(g, "{\n\"b\" :\n\"\" ,\n\"a\": [ 1 ,\n{ } ] ,\"c\":{ \"e\":{\n},\"k\":[1, 2 ]},\"d\":[\n3,4]\n}"));
  CHECK(accepts(g, R"({"b":"","c":5,"z":{"y":[]}})"));
  CHECK(accepts(g, R"({"b":"","d":[ ]})"));
  CHECK_FALSE(accepts(g, R"( {"b":""})"));         // not before the value
  CHECK_FALSE(accepts(g, R"({"b":""} )"));         // nor after it
  CHECK_FALSE(accepts(g, R"({"b":  ""})"));        // one text of the pattern, not two
  CHECK_FALSE(accepts(g, R"({"b":"","d":[  ]})")); // an empty array: one between its brackets
  CHECK_FALSE(accepts(g, "{\"b\":\"\"\t}"));       // a tab is not in the pattern
  CHECK_FALSE(accepts(g, R"({"b":"","c":{"k":[1,2],"e":{}}})"));  // enum objects in canonical key order
  CHECK_FALSE(accepts(g, R"({"b":"","d":[1,2,3]})"));
  // The pattern may match JSON whitespace only; \s matches other spaces too.
  for (const char* bad : {R"(\s*)", R"([ x]*)", "[ \u00a0]", "(", "[ ]{0,65}"}) {
    INFO(bad);
    CHECK(std::holds_alternative<std::string>(gr::whitespace_style(bad)));
  }
  CHECK(std::get<std::string>(gr::whitespace_style(R"(\s)")).find("[ \\t\\n\\r]") != std::string::npos);
  // Matching only the empty text is the compact form.
  const auto none = std::make_shared<const gr::grammar>(gr::any_json_object(std::get<gr::json_style>(gr::whitespace_style(""))));
  CHECK(accepts(none, R"({"a":[1,{}]})"));
  CHECK_FALSE(accepts(none, R"({"a": 1})"));
}

TEST_CASE("grammar schema: left recursion and schemas accepting nothing are refused") {
  auto r = troupe::recipe::grammar::compile_json_schema(ojson::parse(R"({"$ref": "#"})"));
  REQUIRE(std::holds_alternative<troupe::recipe::grammar::schema_error>(r));
  CHECK(std::get<troupe::recipe::grammar::schema_error>(r).keyword == "$ref");
  r = troupe::recipe::grammar::compile_json_schema(ojson::parse(R"({"type": "integer", "minimum": 5, "maximum": 4})"));
  CHECK(std::holds_alternative<troupe::recipe::grammar::schema_error>(r));
  r = troupe::recipe::grammar::compile_json_schema(std::string_view("{\"type\": "));
  CHECK(std::get<troupe::recipe::grammar::schema_error>(r).message == "the schema is not valid JSON");
  r = troupe::recipe::grammar::compile_json_schema(ojson::parse(R"({"type": "number", "maximum": 3})"));
  CHECK(std::get<troupe::recipe::grammar::schema_error>(r).keyword == "maximum");
}

TEST_CASE("grammar mask: equals trying every token of the DeepSeek-V4 vocabulary, along a generation") {
  const auto g = schema_grammar(strict_schema());
  const mask_computer masks(g, v4_vocab());
  matcher m(g);
  // A valid output, fed token by token as the V4 tokenizer splits it; the mask is compared with
  // the token-by-token answer at a spread of its states.
  const std::string text =
      R"({"name": "Ada \"L\"", "age": 36, "role": "admin", "tags": ["math", "code"], "email": null, )"
      R"("tree": {"v": -4, "kids": [{"v": 0}]}, "born": "1815-12-10", "score": -1.5e3, "ok": true})";
  const auto ids = v4().encode(text, troupe::recipe::encode_mode::raw);
  int compared = 0;
  for (std::size_t i = 0; i <= ids.size(); ++i) {
    if (i % 3 == 0 || i == ids.size()) {
      INFO("after ", i, " tokens: ", text.substr(0, v4().decode_bytes({ids.data(), i}).size()));
      const auto fast = masks.allowed(m);
      CHECK(fast == brute_force_allowed(m, *v4_vocab()));
      ++compared;
    }
    if (i < ids.size()) REQUIRE(m.accept_token(v4_vocab()->bytes(ids[i])));
  }
  CHECK(m.is_complete());
  CHECK_FALSE(m.can_continue());
  CHECK(masks.allowed(m) == v4_vocab()->eos());
  CHECK(compared > 10);
}

TEST_CASE("grammar vocabulary: text tokens are sorted out by their characters, the others set apart") {
  // Text: a valid UTF-8 prefix of characters a JSON string holds unescaped.
  const std::vector<std::string> bytes{
      "a",                       // 0: 1 character
      "ab",                      // 1: 2
      "\xC3\xA9",                // 2: é, 1
      "\xC3",                    // 3: é's first byte: a partial character counts as one
      "\x7F",                    // 4: DEL, which JSON strings hold raw: 1
      "x\xE4\xB8",               // 5: x and two bytes of 中: 2
      "\xA9",                    // 6: a continuation byte first: not text
      "a\"",                     // 7: a quote: not text
      "b\\",                     // 8: a backslash: not text
      "x\n",                     // 9: a control character: not text
      "\xED\xA0\x80",            // 10: a surrogate: not text
      "\xE0\x80\x80",            // 11: an overlong form: not text
      "\xF4\x90\x80\x80",        // 12: past U+10FFFF: not text
      std::string(40, 'z'),      // 13: 40 characters, past the kept masks
      "\xE4\xB8\xAD\xE6\x96\x87",  // 14: 中文, 2
      "",                        // 15: no bytes: never allowed
  };
  const vocabulary v(bytes, std::vector<bool>(bytes.size(), true), {});
  const auto ids = [&](std::uint8_t chars) {
    std::vector<std::uint32_t> out;
    const std::uint32_t* m = v.text_mask(vocabulary::json_text, chars);
    for (std::uint32_t id = 0; id < v.size(); ++id)
      if ((m[id >> 5] >> (id & 31)) & 1) out.push_back(id);
    return out;
  };
  CHECK(ids(0).empty());
  CHECK(ids(1) == std::vector<std::uint32_t>{0, 2, 3, 4});
  CHECK(ids(2) == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 14});
  CHECK(ids(vocabulary::text_mask_chars) == ids(2));
  CHECK(ids(vocabulary::any_text) == std::vector<std::uint32_t>{0, 1, 2, 3, 4, 5, 13, 14});
  CHECK(v.max_text_chars(vocabulary::json_text) == 40);
  // The ASCII classes: tokens of their bytes only.
  const auto class_ids = [&](unsigned cls, std::uint8_t chars) {
    std::vector<std::uint32_t> out;
    const std::uint32_t* m = v.text_mask(cls, chars);
    for (std::uint32_t id = 0; id < v.size(); ++id)
      if ((m[id >> 5] >> (id & 31)) & 1) out.push_back(id);
    CHECK(out.size() == v.text_count(cls, chars));
    return out;
  };
  CHECK(class_ids(vocabulary::lower, 1) == std::vector<std::uint32_t>{0});
  CHECK(class_ids(vocabulary::lower, vocabulary::any_text) == std::vector<std::uint32_t>{0, 1, 13});
  CHECK(class_ids(vocabulary::letters, vocabulary::any_text) == std::vector<std::uint32_t>{0, 1, 13});
  CHECK(class_ids(vocabulary::digits, vocabulary::any_text).empty());
  CHECK(v.max_text_chars(vocabulary::lower) == 40);
  // A node's cover is the most characters of a text token below it, or not_text.
  const auto& t = v.trie();
  for (std::uint32_t n = 1; n < t.size(); ++n) {
    std::uint8_t cover = 0;
    for (std::uint32_t m = n; m < t[n].end; ++m)
      for (const auto id : v.ids_at(m)) {
        const auto all = ids(vocabulary::any_text);
        std::uint8_t chars = vocabulary::not_text;
        if (std::find(all.begin(), all.end(), id) != all.end())
          for (std::uint8_t k = 1; k <= vocabulary::text_mask_chars && chars == vocabulary::not_text; ++k) {
            const auto some = ids(k);
            if (std::find(some.begin(), some.end(), id) != some.end()) chars = k;
          }
        if (id == 13) chars = 40;
        cover = std::max(cover, chars);
      }
    CHECK(v.cover(vocabulary::json_text)[n] == cover);
  }
}

TEST_CASE("grammar mask: a first mask inside a string takes text tokens whole, as trying every token does") {
  // Each mask from a fresh mask_computer (a first mask, where the text budget decides what is
  // walked), after byte chunks that also stop inside a character, an escape and a closing tag.
  const std::vector<std::pair<ojson, std::string>> cases{
      {ojson::parse(R"({"type": "string"})"), "\"Ab \u4e2d\u6587\\n\\\" z\u00e9\U0001F600.\""},
      {ojson::parse(R"({"type": "string", "maxLength": 3})"), "\"\u4e2d\u00e9x\""},
      {ojson::parse(R"({"type": "string", "minLength": 2, "maxLength": 40})"),
       "\"The quick brown fox jumps over the lazy\""},
      {ojson::parse(R"({"type": "string", "pattern": "^[a-z]+$"})"), "\"abcdef\""},
      // Every character's first byte is taken, not every continuation after it: è is refused.
      {ojson::parse(R"({"type": "string", "pattern": "^[^\u00e8]*$"})"), "\"\u00e9t\u00e9\""},
      {ojson::parse(R"({"type": "array", "items": {"type": "string", "maxLength": 34}})"),
       "[\"0123456789012345678901234567890123\", \"\"]"},
      {ojson::parse(R"({"enum": ["ab", "abc", "\u00e9t\u00e9"]})"), "\"\u00e9t\u00e9\""},
  };
  std::mt19937_64 rng(41);
  int compared = 0;
  for (const auto& [schema, text] : cases) {
    const auto g = schema_grammar(schema);
    matcher m(g);
    for (std::size_t at = 0; at <= text.size();) {
      INFO("schema ", schema.dump(), " after ", text.substr(0, at));
      const mask_computer fresh(g, v4_vocab());
      CHECK(fresh.allowed(m) == brute_force_allowed(m, *v4_vocab()));
      ++compared;
      if (at == text.size()) break;
      const std::size_t n = std::min<std::size_t>(1 + rng() % 3, text.size() - at);
      REQUIRE(m.accept_token(text.substr(at, n)));
      at += n;
    }
    CHECK(m.is_complete());
  }
  CHECK(compared > 60);
}

TEST_CASE("grammar mask: warming a state builds its entries, from another thread, and changes no mask") {
  // What the constraint table does after each accepted token: warm() on a compile thread while
  // the device computes, then the device's fill() finds the entries built.
  const auto g = schema_grammar(ojson::parse(R"({"type": "object", "properties": {"a": {"type": "string"},
      "b": {"type": "array", "items": {"type": "integer"}}}, "required": ["a", "b"], "additionalProperties": false})"));
  const std::string text = R"({"a": "x\"y", "b": [1, -20, 3]})";
  const mask_computer warmed(g, v4_vocab()), cold(g, v4_vocab());
  matcher m(g);
  int built = 0;
  for (std::size_t at = 0; at <= text.size(); ++at) {
    INFO("after ", text.substr(0, at));
    const matcher copy = m.without_history();
    CHECK(copy.state() == m.state());
    CHECK(copy.rollback_depth() == 0);
    const bool was_warm = warmed.is_warm(m);
    bool did = false;
    std::thread([&] { did = warmed.warm(copy); }).join();
    CHECK(did == !was_warm);
    built += did;
    CHECK(warmed.is_warm(m));
    CHECK_FALSE(warmed.warm(m));  // nothing left to build
    CHECK(warmed.allowed(m) == cold.allowed(m));
    if (at < text.size()) REQUIRE(m.accept_token(text.substr(at, 1)));
  }
  CHECK(built > 5);
  CHECK(warmed.cached_states() == cold.cached_states());

  // Every frame up front (a small grammar after its compile): nothing is built past the limit;
  // within it, every mask along the output finds its entries built and equals the cold one.
  const mask_computer all(g, v4_vocab());
  CHECK(all.warm_all(3) == 0);
  CHECK(all.cached_states() == 0);
  std::size_t frames = 0;
  for (const auto& r : g->rules)
    for (std::uint32_t s = 0; s < r.size(); ++s) frames += r.has_bytes[s];
  CHECK(all.warm_all(frames) == frames);
  CHECK(all.cached_states() == frames);
  matcher again(g);
  for (std::size_t at = 0; at <= text.size(); ++at) {
    CHECK(all.is_warm(again));
    CHECK(all.allowed(again) == cold.allowed(again));
    if (at < text.size()) REQUIRE(again.accept_token(text.substr(at, 1)));
  }
  CHECK(all.cached_states() == frames);
}

TEST_CASE("grammar mask: first masks of random patterns equal trying every token of a small vocabulary") {
  // Tokens of one to three pieces (lower and upper case, a digit, é, 中, a quote, a backslash,
  // the bytes of a closing tag, a newline), lone lead and continuation bytes, and long runs past
  // the kept text masks: every kind of token the text classes sort out.
  const std::vector<std::string> pieces{"a", "b", "c", "A", "7", "\xC3\xA9", "\xE4\xB8\xAD", "\"", "\\", "<", "/", "\n", " "};
  std::vector<std::string> bytes;
  for (const auto& x : pieces) {
    bytes.push_back(x);
    for (const auto& y : pieces) {
      bytes.push_back(x + y);
      for (const auto& z : {std::string("a"), std::string("\xC3\xA9"), std::string("\""), std::string("<")})
        bytes.push_back(x + y + z);
    }
  }
  for (const char* t : {"\xC3", "\xA9", "\xE4\xB8", "\xAD", "a\xE4", "\xED\xA0\x80", "\xC3\xA8", "b\xC3\xA8"})
    bytes.push_back(t);
  for (const std::size_t n : {20, 33, 40}) bytes.push_back(std::string(n, 'a'));
  bytes.push_back(std::string(20, 'b') + "\"");
  const auto eos = static_cast<std::uint32_t>(bytes.size());
  bytes.emplace_back();  // end of sequence
  const auto vocab = std::make_shared<const vocabulary>(bytes, std::vector<bool>(bytes.size(), true),
                                                        std::vector<std::uint32_t>{eos});
  const auto brute = [&](const matcher& m) {
    std::vector<std::uint32_t> ids;
    for (std::uint32_t id = 0; id < eos; ++id)
      if (m.can_accept(bytes[id])) ids.push_back(id);
    if (m.is_complete()) ids.push_back(eos);
    return ids;
  };
  // Random patterns, alone or as a JSON string's pattern, or a JSON string's bounds.
  std::mt19937_64 rng(2026);
  const std::vector<std::string> atoms{"a", "b", "\u00e9", "\u4e2d", "\\\"", "<", "/", "[a-c]", "[^a]", "[\u00e9\u4e2d]",
                                       ".", "(?:a|\u00e9b)", "\\\\", "[^\u00e8]", "[a-z]", "[A-Za-z]", "[0-9]", "[a-zA-Z0-9]", "[^0-9]"};
  const std::vector<std::string> repeats{"", "", "*", "+", "?", "{0,3}", "{2,5}", "{1,40}"};
  int compared = 0, refused = 0;
  for (int round = 0; round < 120; ++round) {
    std::string pattern;
    for (int k = 1 + static_cast<int>(rng() % 4); k > 0; --k)
      pattern += atoms[rng() % atoms.size()] + repeats[rng() % repeats.size()];
    std::variant<gr::grammar, gr::regex_error> by_regex = gr::regex_error{};
    std::variant<gr::grammar, gr::schema_error> by_schema = gr::schema_error{};
    if (round % 3 == 0) {
      by_regex = gr::compile_regex(pattern);
    } else if (round % 3 == 1) {
      by_schema = gr::compile_json_schema(ojson{{"type", "string"}, {"pattern", "^" + pattern + "$"}});
    } else {
      const auto hi = 1 + rng() % 40;
      by_schema = gr::compile_json_schema(ojson{{"type", "string"}, {"minLength", rng() % (hi + 1)}, {"maxLength", hi}});
    }
    gr::grammar* compiled = round % 3 == 0 ? std::get_if<gr::grammar>(&by_regex) : std::get_if<gr::grammar>(&by_schema);
    if (!compiled) {
      ++refused;  // past the state limits
      continue;
    }
    const auto g = std::make_shared<const gr::grammar>(std::move(*compiled));
    matcher m(g);
    for (int step = 0; step < 24; ++step) {
      INFO("pattern ", pattern, " round ", round, " step ", step);
      const auto want = brute(m);
      const mask_computer fresh(g, vocab);
      CHECK(fresh.allowed(m) == want);
      ++compared;
      std::vector<std::uint32_t> next(want.begin(), want.end());
      std::erase(next, eos);
      if (next.empty()) break;
      REQUIRE(m.accept_token(bytes[next[rng() % next.size()]]));
    }
  }
  MESSAGE(compared, " masks compared, ", refused, " of 120 grammars past the limits");
  CHECK(refused < 20);
  CHECK(compared > 500);
}

TEST_CASE("grammar mask: random walks through allowed tokens always end in valid canonical JSON") {
  const std::vector<ojson> schemas{
      strict_schema(),
      ojson::parse(R"({"type": "object"})"),
      ojson::parse(R"({"type": "array", "prefixItems": [{"const": "id"}, {"type": "integer", "minimum": 10}],
                      "items": {"oneOf": [{"type": "string", "format": "uuid"}, {"type": "boolean"}]}, "maxItems": 4})"),
      ojson::parse(R"({"type": "object", "properties": {"ip": {"type": "string", "format": "ipv4"},
                      "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"}, "n": {"type": "integer", "maximum": -3}},
                      "required": ["code"], "additionalProperties": {"type": "integer"}})"),
  };
  std::mt19937_64 rng(14);
  const auto& vocab = *v4_vocab();
  int completed = 0, walks = 0, beyond_double = 0;
  for (const auto& schema : schemas) {
    const auto g = schema_grammar(schema);
    const mask_computer masks(g, v4_vocab());
    const validator check(schema);
    for (int w = 0; w < 6; ++w, ++walks) {
      matcher m(g);
      std::string out;
      for (int step = 0; step < 400; ++step) {
        auto allowed = masks.allowed(m);
        REQUIRE_MESSAGE(!allowed.empty(), "a dead end after ", out);
        if (m.is_complete() && (step > 40 || rng() % 4 == 0)) break;
        // End-of-sequence is allowed exactly when the output is complete.
        const bool eos = std::erase_if(allowed, [&](std::uint32_t id) {
                           return std::find(vocab.eos().begin(), vocab.eos().end(), id) != vocab.eos().end();
                         }) > 0;
        REQUIRE(eos == m.is_complete());
        if (allowed.empty()) break;
        // A third of the steps pick among tokens that can close something, so that walks end.
        std::vector<std::uint32_t> closers;
        for (const auto id : allowed)
          if (vocab.bytes(id).find_first_of("\"]},") != std::string::npos) closers.push_back(id);
        const auto& pool = !closers.empty() && rng() % 3 == 0 ? closers : allowed;
        const auto id = pool[rng() % pool.size()];
        REQUIRE_MESSAGE(m.accept_token(vocab.bytes(id)), "the matcher refused an allowed token after ", out);
        out += vocab.bytes(id);
      }
      if (!m.is_complete()) continue;
      ++completed;
      INFO("schema ", schema.dump(), "\noutput ", out);
      if (std::regex_search(out, std::regex("[0-9]{16}"))) {  // a number beyond double precision
        ++beyond_double;
        continue;
      }
      const ojson parsed = ojson::parse(out);
      CHECK(check.valid(parsed));
      CHECK(canonical_instance(parsed, {}, false) == out);  // spacing and escapes as specified
    }
  }
  MESSAGE(completed, " of ", walks, " random walks completed, ", beyond_double,
          " of them with a number of 16 digits or more (not checked), the others validated");
  CHECK(completed - beyond_double >= walks / 2);
}

TEST_CASE("grammar matcher: a serialised state restores to the same state and masks, only for its grammar") {
  const auto g = schema_grammar(strict_schema());
  const auto g2 = schema_grammar(strict_schema());  // compiled again: same fingerprint
  const mask_computer masks(g, v4_vocab()), masks2(g2, v4_vocab());
  matcher m(g);
  REQUIRE(m.accept_token(R"({"name": "x", "age": 1)"));
  const std::string bytes = m.serialize();
  auto r = matcher::restore(g2, bytes);
  REQUIRE(r.has_value());
  CHECK(r->state() == m.state());
  CHECK(masks2.allowed(*r) == masks.allowed(m));
  CHECK(r->accept_token(R"(2, "role": "user")"));
  CHECK_FALSE(matcher::restore(regex_grammar("a+"), bytes).has_value());
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) CHECK_FALSE(matcher::restore(g, bytes.substr(0, cut)).has_value());
  std::string corrupt = bytes;
  corrupt[corrupt.size() - 1] ^= 0x40;
  CHECK_FALSE(matcher::restore(g, corrupt).has_value());
}

TEST_CASE("grammar matcher: rollback by k tokens returns to the state k tokens back") {
  const auto g = schema_grammar(strict_schema());
  matcher m(g);
  const std::vector<std::string> tokens{"{\"", "name", "\": \"", "Bo", "\", \"", "age", "\": ", "4", "2"};
  std::vector<troupe::recipe::grammar::match_state> states{m.state()};
  for (const auto& t : tokens) {
    REQUIRE(m.accept_token(t));
    states.push_back(m.state());
  }
  CHECK_FALSE(m.accept_token("}"));  // refused: nothing changed
  CHECK(m.state() == states.back());
  REQUIRE(m.rollback(3));
  CHECK(m.state() == states[states.size() - 4]);
  CHECK(m.accept_token("\": "));
  CHECK(m.state() == states[states.size() - 3]);
  CHECK_FALSE(m.rollback(100));
  CHECK(m.rollback(m.rollback_depth()));
  CHECK(m.state() == states[0]);
}
