// Tool calls as a grammar (recipe/grammar/tool_calls.hpp): the DSML block with the request's
// tool names and a strict tool's parameters, V4 and V4.1 spellings, tool_choice required, an
// answer format beside the tools, refused schemas; masks against trying every token of the V4
// vocabulary; random generations through the masks, parsed by the stream parser into calls whose
// arguments validate against the tool's schema.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <tuple>

#include "grammar_fixture.hpp"
#include "recipe/grammar/tool_calls.hpp"
#include "recipe/stream_parser.hpp"

using namespace troupe::recipe::testing;
using troupe::recipe::grammar::mask_computer;
using troupe::recipe::grammar::matcher;

namespace {

const std::string D(1, static_cast<char>(gr::dsml_byte));

// A strict tool in OpenAI's strict form: every property required, "no value" as null.
const ojson& weather() {
  static const ojson s = ojson::parse(R"({
    "type": "object",
    "properties": {
      "city": {"type": "string", "maxLength": 12},
      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
      "days": {"type": "integer", "minimum": 1, "maximum": 7},
      "when": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
      "stops": {"type": "array", "items": {"$ref": "#/$defs/stop"}, "maxItems": 2}
    },
    "required": ["city", "unit", "days", "when", "stops"],
    "additionalProperties": false,
    "$defs": {"stop": {"type": "string", "maxLength": 6}}
  })");
  return s;
}

std::shared_ptr<const gr::grammar> tools_grammar(const gr::tool_calls_spec& spec) {
  auto r = gr::compile_tool_calls(spec);
  if (auto* e = std::get_if<gr::tool_calls_error>(&r)) FAIL("tools refused: ", e->error.to_string());
  return std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
}

gr::tool_calls_spec weather_and_lookup(bool v41 = false) {
  gr::tool_calls_spec spec;
  spec.tools = {{"get_weather", weather()}, {"lookup", std::nullopt}};
  spec.v41 = v41;
  return spec;
}

// (key, written as a string, value) as the prompt renders a call's parameters.
using param = std::tuple<std::string, bool, std::string>;

std::string invoke(const std::string& name, const std::vector<param>& params, bool v41 = false) {
  std::string s = "<" + D + (v41 ? " invoke" : "invoke") + " name=\"" + name + "\">\n";
  for (const auto& [key, is_string, value] : params)
    s += "<" + D + (v41 ? " parameter" : "parameter") + " name=\"" + key + "\" string=\"" +
         (is_string ? "true" : "false") + "\">" + value + "</" + D + (v41 ? " parameter" : "parameter") + ">\n";
  if (v41 && params.empty()) s += "\n";
  return s + "</" + D + (v41 ? " invoke" : "invoke") + ">\n";
}

std::string block(const std::string& calls, bool v41 = false) {
  const std::string w = v41 ? " calls" : "tool_calls";
  return "\n\n<" + D + w + ">\n" + calls + "</" + D + w + ">";
}

std::vector<param> paris(std::string days = "3") {
  return {{"city", true, "Paris"}, {"unit", true, "celsius"}, {"days", false, days},
          {"when", false, "null"}, {"stops", false, R"(["Lyon"])"}};
}

}  // namespace

TEST_CASE("grammar tools: the DSML block with the tools' names, a strict tool's parameters by its schema") {
  const auto g = tools_grammar(weather_and_lookup());
  // An answer without calls, or text then one block of calls.
  CHECK(accepts(g, ""));
  CHECK(accepts(g, "It is sunny in Paris <3"));
  CHECK(accepts(g, block(invoke("get_weather", paris()))));
  CHECK(accepts(g, "Let me check." + block(invoke("get_weather", paris()) + invoke("lookup", {}))));
  // Strings raw (string="true") or as JSON (string="false"); the anyOf's string branch raw.
  auto p = paris();
  std::get<1>(p[0]) = false, std::get<2>(p[0]) = R"("Paris")";
  std::get<1>(p[3]) = true, std::get<2>(p[3]) = "2026-12-04";
  CHECK(accepts(g, block(invoke("get_weather", p))));
  // A tool without a schema takes any parameters.
  CHECK(accepts(g, block(invoke("lookup", {{"q", true, "a </b> \"c\"\n"}, {"n", false, "{oops"}}))));
  // Refused: an unknown tool; a parameter missing, repeated, out of order or unknown; values
  // outside the schema; JSON that is not JSON; text after the block; a block not after "\n\n".
  CHECK_FALSE(accepts(g, block(invoke("get_wether", paris()))));
  p = paris();
  p.erase(p.begin() + 2);
  CHECK_FALSE(accepts(g, block(invoke("get_weather", p))));
  p = paris();
  std::swap(p[0], p[1]);
  CHECK_FALSE(accepts(g, block(invoke("get_weather", p))));
  p = paris();
  p.push_back({"extra", true, "x"});
  CHECK_FALSE(accepts(g, block(invoke("get_weather", p))));
  CHECK_FALSE(accepts(g, block(invoke("get_weather", paris("9")))));
  p = paris();
  std::get<2>(p[1]) = "kelvin";
  CHECK_FALSE(accepts(g, block(invoke("get_weather", p))));
  p = paris();
  std::get<1>(p[2]) = true;  // an integer is not a string
  CHECK_FALSE(accepts(g, block(invoke("get_weather", p))));
  p = paris();
  std::get<1>(p[0]) = false;  // Paris unquoted is not JSON
  CHECK_FALSE(accepts(g, block(invoke("get_weather", p))));
  p = paris();
  std::get<1>(p[3]) = true, std::get<2>(p[3]) = "tomorrow";
  CHECK_FALSE(accepts(g, block(invoke("get_weather", p))));
  p = paris();
  std::get<2>(p[0]) = "Llanfairpwllgwyngyll";  // maxLength 12
  CHECK_FALSE(accepts(g, block(invoke("get_weather", p))));
  // Raw text may hold what begins the closing tag (`<`, `</`), counted as characters; 12 is
  // the most.
  for (const auto& [city, ok] : std::vector<std::pair<std::string, bool>>{
           {"a</b", true}, {"<</<</<</</<", true}, {"<</<</<</</<<", false}, {"é\"ü</ 12345", true}, {"", true}}) {
    p = paris();
    std::get<2>(p[0]) = city;
    INFO(city);
    CHECK(accepts(g, block(invoke("get_weather", p))) == ok);
  }
  CHECK_FALSE(accepts(g, block(invoke("lookup", {})) + "done"));
  CHECK_FALSE(accepts(g, "<" + D + "tool_calls>\n" + invoke("lookup", {}) + "</" + D + "tool_calls>"));
  CHECK_FALSE(accepts(g, block("")));  // a block holds at least one call
  CHECK_FALSE(accepts(g, "a " + D + " b"));  // the control token is not text
}

TEST_CASE("grammar tools: V4.1 spells the block with a space and writes an empty line in a call without parameters") {
  const auto g = tools_grammar(weather_and_lookup(true));
  CHECK(accepts(g, block(invoke("get_weather", paris(), true) + invoke("lookup", {}, true), true)));
  CHECK_FALSE(accepts(g, block(invoke("get_weather", paris()))));  // V4's spelling
  // No parameters: the empty line, as the V4.1 prompt renders past calls.
  CHECK_FALSE(accepts(g, block("<" + D + " invoke name=\"lookup\">\n</" + D + " invoke>\n", true)));
}

TEST_CASE("grammar tools: tool_choice required starts inside the block, `any` with it; a response format is the other answer") {
  auto spec = weather_and_lookup();
  spec.mode = gr::tool_calls_mode::opened;
  const auto required = tools_grammar(spec);
  CHECK(accepts(required, invoke("get_weather", paris()) + "</" + D + "tool_calls>"));
  CHECK_FALSE(accepts(required, ""));
  CHECK_FALSE(accepts(required, "Sure." + block(invoke("get_weather", paris()))));
  // Messages' tool_choice any: the prompt is auto's, the output a block of calls.
  spec.mode = gr::tool_calls_mode::forced;
  const auto forced = tools_grammar(spec);
  CHECK(accepts(forced, block(invoke("get_weather", paris()))));
  CHECK_FALSE(accepts(forced, "Sure." + block(invoke("get_weather", paris()))));
  CHECK_FALSE(accepts(forced, ""));

  const auto format = schema_grammar(ojson::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                                      "required": ["a"], "additionalProperties": false})"));
  spec = weather_and_lookup();
  spec.content = format.get();
  const auto both = tools_grammar(spec);
  CHECK(accepts(both, R"({"a": 1})"));
  CHECK(accepts(both, block(invoke("lookup", {}))));
  CHECK_FALSE(accepts(both, "It is sunny."));
  CHECK_FALSE(accepts(both, R"({"a": 1})" + block(invoke("lookup", {}))));
}

TEST_CASE("grammar tools: parallel calls off allows one call in the block, in every mode") {
  auto spec = weather_and_lookup();
  spec.one_call = true;
  const auto optional = tools_grammar(spec);
  CHECK(accepts(optional, "It is sunny."));
  CHECK(accepts(optional, "Let me check." + block(invoke("lookup", {}))));
  CHECK_FALSE(accepts(optional, block(invoke("get_weather", paris()) + invoke("lookup", {}))));
  CHECK_FALSE(accepts(optional, block(invoke("lookup", {}) + invoke("lookup", {}))));
  spec.mode = gr::tool_calls_mode::opened;
  const auto required = tools_grammar(spec);
  CHECK(accepts(required, invoke("get_weather", paris()) + "</" + D + "tool_calls>"));
  CHECK_FALSE(accepts(required, invoke("get_weather", paris()) + invoke("lookup", {}) + "</" + D + "tool_calls>"));
  spec.mode = gr::tool_calls_mode::forced;
  const auto forced = tools_grammar(spec);
  CHECK(accepts(forced, block(invoke("lookup", {}))));
  CHECK_FALSE(accepts(forced, block(invoke("lookup", {}) + invoke("get_weather", paris()))));
}

TEST_CASE("grammar tools: a strict schema the engine cannot enforce is refused naming the tool, keyword and pointer") {
  auto refused = [](const ojson& schema) {
    gr::tool_calls_spec spec;
    spec.tools = {{"ok", std::nullopt}, {"bad", schema}};
    auto r = gr::compile_tool_calls(spec);
    REQUIRE(std::holds_alternative<gr::tool_calls_error>(r));
    const auto e = std::get<gr::tool_calls_error>(r);
    CHECK(e.tool == std::optional<std::size_t>(1));
    return e.error;
  };
  auto e = refused(ojson::parse(R"({"anyOf": [{"type": "object"}]})"));
  CHECK(e.keyword == "anyOf");
  e = refused(ojson::parse(R"({"type": "object", "properties": {"x/y": {"not": {"type": "null"}}}})"));
  CHECK(e.keyword == "not");
  CHECK(e.pointer == "/properties/x~1y");
  e = refused(ojson::parse(R"({"type": "object", "properties": {}, "additionalProperties": true})"));
  CHECK(e.keyword == "additionalProperties");
  e = refused(ojson::parse(R"({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]})"));
  CHECK(e.keyword == "required");
  e = refused(ojson::parse(R"({"type": "array"})"));
  CHECK(e.keyword == "type");
}

TEST_CASE("grammar tools: masks equal trying every token of the DeepSeek-V4 vocabulary, along a call") {
  const auto g = tools_grammar(weather_and_lookup());
  const mask_computer masks(g, v4_vocab());
  const auto dsml = v4().token_to_id("｜DSML｜");
  REQUIRE(dsml);
  // The output as the model writes it: text runs tokenized raw, the control token by its id. (The
  // token-by-token answer never takes a text token holding the control token's byte: equal masks
  // show that no text token can stand in for it.)
  const std::string text = "Checking." + block(invoke("get_weather", paris()) + invoke("lookup", {{"q", true, "x"}}));
  std::vector<std::uint32_t> ids;
  std::size_t from = 0;
  for (std::size_t at; (at = text.find(D, from)) != std::string::npos; from = at + 1) {
    for (const auto id : v4().encode(text.substr(from, at - from), troupe::recipe::encode_mode::raw)) ids.push_back(id);
    ids.push_back(*dsml);
  }
  for (const auto id : v4().encode(text.substr(from), troupe::recipe::encode_mode::raw)) ids.push_back(id);
  matcher m(g);
  int compared = 0, dsml_allowed = 0;
  for (std::size_t i = 0; i <= ids.size(); ++i) {
    if (i % 4 == 0 || i == ids.size() || (i < ids.size() && ids[i] == *dsml)) {
      const auto fast = masks.allowed(m);
      CHECK(fast == brute_force_allowed(m, *v4_vocab()));
      dsml_allowed += std::binary_search(fast.begin(), fast.end(), *dsml);
      ++compared;
    }
    if (i < ids.size()) REQUIRE(m.accept_token(v4_vocab()->bytes(ids[i])));
  }
  CHECK(m.is_complete());
  CHECK(masks.allowed(m) == v4_vocab()->eos());
  CHECK(compared > 20);
  CHECK(dsml_allowed >= 14);  // at each of the control token's places
}

TEST_CASE("grammar tools: random generations through the masks parse into calls whose arguments validate") {
  auto spec = weather_and_lookup();
  spec.mode = gr::tool_calls_mode::opened;
  const auto g = tools_grammar(spec);
  const mask_computer masks(g, v4_vocab());
  const validator check(weather());
  const auto& vocab = *v4_vocab();
  std::mt19937_64 rng(41);
  int calls = 0, weather_calls = 0, walks = 0, completed = 0;
  for (; walks < 12; ++walks) {
    matcher m(g);
    std::vector<troupe::recipe::token_id> out;
    for (int step = 0; step < 600 && !m.is_complete(); ++step) {
      const auto allowed = masks.allowed(m);
      REQUIRE(!allowed.empty());
      // Half of the steps pick among tokens that can end something, so that walks end.
      std::vector<std::uint32_t> closers;
      for (const auto id : allowed)
        if (vocab.bytes(id).find_first_of("<\"]}\xff") != std::string::npos) closers.push_back(id);
      const auto& pool = !closers.empty() && rng() % 2 == 0 ? closers : allowed;
      const auto id = pool[rng() % pool.size()];
      REQUIRE(m.accept_token(vocab.bytes(id)));
      out.push_back(id);
    }
    if (!m.is_complete()) continue;
    ++completed;
    troupe::recipe::stream_options o;
    o.parse_tool_calls = true;
    o.start = troupe::recipe::stream_start::tool_calls;
    auto parser = std::get<troupe::recipe::stream_parser>(troupe::recipe::stream_parser::create(v4(), o));
    std::vector<troupe::recipe::stream_event> events;
    parser.push(out, events);
    parser.finish(troupe::recipe::backend_finish::stop, events);
    std::map<int, std::pair<std::string, std::string>> parsed;  // index -> name, arguments
    for (const auto& e : events) {
      using k = troupe::recipe::stream_event::kind;
      CHECK(e.type != k::text);
      if (e.type == k::tool_call) parsed[e.index].first = e.text;
      if (e.type == k::arguments) parsed[e.index].second += e.text;
    }
    REQUIRE(!parsed.empty());
    for (const auto& [index, call] : parsed) {
      const auto& [name, arguments] = call;
      INFO("call ", index, " ", name, " ", arguments);
      ++calls;
      REQUIRE((name == "get_weather" || name == "lookup"));
      if (name == "lookup") continue;
      ++weather_calls;
      const auto args = ojson::parse(arguments, nullptr, false);
      REQUIRE_FALSE(args.is_discarded());
      CHECK(check.valid(args));
    }
  }
  MESSAGE(completed, " of ", walks, " generations completed with ", calls, " calls, ", weather_calls,
          " of get_weather (arguments validated)");
  CHECK(completed >= walks / 2);
  CHECK(weather_calls >= 4);
}
