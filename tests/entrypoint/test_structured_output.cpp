// The entrypoint's constraint table (actors/entrypoint/structured_output.hpp): what a device is
// told to allow at each position of a constrained request, and how it follows the ids drawn.
#include "actors/entrypoint/structured_output.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

using troupe::actors::constraint_table;
using troupe::recipe::response_format;

namespace {

const troupe::recipe::tokenizer& v4() {
  static const auto t = troupe::recipe::tokenizer::from_file(std::string(TROUPE_SOURCE_DIR)
                                                             + "/recipe/data/deepseek-v4/tokenizer.json.gz");
  return t;
}

std::vector<std::uint32_t> ids_of(const std::vector<std::uint32_t>& mask) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t id = 0; id < mask.size() * 32; ++id)
    if ((mask[id / 32] >> (id % 32)) & 1u)
      out.push_back(id);
  return out;
}

bool allows(const std::vector<std::uint32_t>& mask, std::uint32_t id) {
  return (mask[id / 32] >> (id % 32)) & 1u;
}

std::uint32_t id_of(const std::string& text) {
  const auto ids = v4().encode(text, troupe::recipe::encode_mode::raw);
  REQUIRE(ids.size() == 1);
  return ids[0];
}

std::string key(const response_format& f) { return constraint_table::format_key(f); }

// add(), waiting for its verdict.
std::optional<troupe::recipe::api_error> add_now(constraint_table& t, std::uint64_t id, const std::string& k,
                                                 bool thinking, const std::string& param,
                                                 std::span<const std::string> tool_params = {}) {
  std::promise<std::optional<troupe::recipe::api_error>> verdict;
  auto f = verdict.get_future();
  t.add(id, k, thinking, param, tool_params,
        [&verdict](std::optional<troupe::recipe::api_error> e) { verdict.set_value(std::move(e)); });
  return f.get();
}

// restore(), and its verdict: at once, or from the compile thread.
std::optional<std::string> restore_now(constraint_table& t, std::uint64_t id, const troupe::runtime::constraint_spec& spec,
                                       std::vector<std::int32_t> context) {
  std::promise<std::optional<std::string>> verdict;
  auto f = verdict.get_future();
  auto r = t.restore(id, spec, std::move(context), [&verdict](std::optional<std::string> why) { verdict.set_value(why); });
  if (r.state == constraint_table::restore_result::compiling)
    return f.get();
  if (r.state == constraint_table::restore_result::refused)
    return r.why;
  return std::nullopt;
}

std::string regex(std::string pattern) {
  response_format f;
  f.type = response_format::kind::regex;
  f.regex = std::move(pattern);
  return key(f);
}

// A conversation with a strict weather tool and a plain lookup tool.
troupe::recipe::conversation with_tools(troupe::recipe::tool_choice choice) {
  troupe::recipe::conversation c;
  c.tool_choice = choice;
  troupe::recipe::tool_definition weather;
  weather.name = "get_weather";
  weather.strict_schema = R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})";
  weather.schema_param = "tools[0].function.parameters";
  troupe::recipe::tool_definition lookup;
  lookup.name = "lookup";
  c.tools = {weather, lookup};
  return c;
}

}  // namespace

TEST_CASE("structured output table: a regex request allows exactly its tokens, position by position") {
  constraint_table t(v4());
  REQUIRE_FALSE(add_now(t, 7, regex("(yes|no)!"), false, "response_format"));
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  REQUIRE(t.allowed(7, 100, mask));
  for (const auto id : ids_of(mask)) {
    const auto bytes = v4().decode_bytes(std::vector<troupe::recipe::token_id>{id});
    const bool prefix = std::string("yes!").starts_with(bytes) || std::string("no!").starts_with(bytes);
    CHECK_MESSAGE(prefix, bytes);
  }
  CHECK(allows(mask, id_of("yes")));
  t.accepted(7, 100, static_cast<std::int32_t>(id_of("yes")));
  REQUIRE(t.allowed(7, 101, mask));
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{id_of("!")});
  t.accepted(7, 101, static_cast<std::int32_t>(id_of("!")));
  REQUIRE(t.allowed(7, 102, mask));
  const auto eos = *v4().token_to_id("<｜end▁of▁sentence｜>");
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{eos});
  // The step at 101 drawn again: the table rolls back to it.
  REQUIRE(t.allowed(7, 101, mask));
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{id_of("!")});
  // A position it never saw: only end-of-sentence.
  REQUIRE(t.allowed(7, 150, mask));
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{eos});
  t.remove(7);
  CHECK_FALSE(t.allowed(7, 101, mask));
}

TEST_CASE("structured output table: a compact JSON format allows no whitespace, a whitespace pattern's its own") {
  constraint_table t(v4());
  response_format f;
  f.type = response_format::kind::json_schema;
  f.schema_json = R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "required": ["a", "b"], "additionalProperties": false})";
  response_format compact = f;
  compact.compact = true;
  response_format spaced = f;
  spaced.whitespace_pattern = "\n?";
  CHECK(key(compact) != key(f));
  CHECK(key(spaced) != key(f));
  REQUIRE_FALSE(add_now(t, 1, key(f), false, "response_format"));
  REQUIRE_FALSE(add_now(t, 2, key(compact), false, "structured_outputs.json"));
  REQUIRE_FALSE(add_now(t, 4, key(spaced), false, "structured_outputs.json"));
  // Each walks its own form, token by token as a device samples, up to the next key's quote.
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  auto walk = [&](std::uint64_t id, const std::string& text) {
    std::uint64_t position = 10;
    for (const auto token : v4().encode(text, troupe::recipe::encode_mode::raw)) {
      REQUIRE(t.allowed(id, position, mask));
      REQUIRE(allows(mask, token));
      t.accepted(id, position++, static_cast<std::int32_t>(token));
    }
    REQUIRE(t.allowed(id, position, mask));
    const auto next = ids_of(mask);
    REQUIRE_FALSE(next.empty());
    return next;
  };
  auto starts_with_space = [](std::uint32_t id) {
    const auto bytes = v4().decode_bytes(std::vector<troupe::recipe::token_id>{id});
    return !bytes.empty() && bytes[0] == ' ';
  };
  for (const auto id : walk(1, R"({"a": 1,)"))
    CHECK_MESSAGE(starts_with_space(id), id);
  for (const auto id : walk(2, R"({"a":1,)"))
    CHECK_MESSAGE(!starts_with_space(id), id);
  bool newline = false;
  for (const auto id : walk(4, "{\n\"a\":1\n,")) {
    CHECK_MESSAGE(!starts_with_space(id), id);
    newline = newline || v4().decode_bytes(std::vector<troupe::recipe::token_id>{id})[0] == '\n';
  }
  CHECK(newline);
  // A malformed spacing key is refused, naming the field.
  for (const char* bad : {"compact:regex:a", "whitespace:1: regex:a", "whitespace:9: object", "whitespace:x:object",
                          "whitespace:1:xobject"}) {
    auto e = add_now(t, 3, bad, false, "structured_outputs.json");
    REQUIRE_MESSAGE(e, bad);
    CHECK(e->param == "structured_outputs.json");
  }
}

TEST_CASE("structured output table: in thinking mode the constraint starts after </think>") {
  constraint_table t(v4());
  REQUIRE_FALSE(add_now(t, 8, regex("ok"), true, "response_format"));
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  CHECK_FALSE(t.allowed(8, 10, mask));  // reasoning: unconstrained
  t.accepted(8, 10, static_cast<std::int32_t>(id_of("!")));
  CHECK_FALSE(t.allowed(8, 11, mask));
  t.accepted(8, 11, static_cast<std::int32_t>(*v4().token_to_id("</think>")));
  REQUIRE(t.allowed(8, 12, mask));
  CHECK(allows(mask, id_of("ok")));
  CHECK_FALSE(allows(mask, id_of("!")));
  t.remove(8);
  CHECK(t.size() == 0);
}

TEST_CASE("structured output table: a refused schema is a 400 naming the keyword, its pointer and the field") {
  response_format f;
  f.type = response_format::kind::json_schema;
  f.schema_json = R"({"type": "object", "properties": {"a": {"type": "string", "minProperties": 1, "not": {}}}})";
  constraint_table t(v4());
  const auto e = add_now(t, 9, key(f), false, "text.format");
  REQUIRE(e.has_value());
  CHECK(e->status == 400);
  CHECK(e->param == "text.format");
  CHECK(e->message.find("#/properties/a") != std::string::npos);
  // Until the caller ends the request, a device sampling it may only end the output.
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  REQUIRE(t.allowed(9, 30, mask));
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{*v4().token_to_id("<｜end▁of▁sentence｜>")});
  t.remove(9);
  CHECK(t.size() == 0);
  response_format text;
  CHECK_FALSE(add_now(t, 10, key(text), false, "response_format"));
  CHECK(t.size() == 0);  // a text format registers nothing
}

TEST_CASE("structured output table: a new key compiles on the pool; the verdict comes before any mask") {
  // A device asking for the first mask while the compile runs waits for it, and by then the
  // verdict has been given (the entrypoint answers the client before tokens can follow).
  response_format f;
  f.type = response_format::kind::json_schema;
  f.schema_json = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                      "n": {"type": "integer"}}, "required": ["name", "n"], "additionalProperties": false})";
  constraint_table t(v4(), 1);
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  for (std::uint64_t id : {21, 22}) {  // 21 compiles, 22 finds it cached
    std::atomic<bool> heard{false};
    bool wrong = false;
    t.add(id, key(f), false, "response_format", {}, [&](std::optional<troupe::recipe::api_error> e) {
      wrong = e.has_value();
      heard = true;
    });
    if (id == 22)
      CHECK(heard);  // a cached key is ready at once
    REQUIRE(t.allowed(id, 40, mask));
    CHECK(heard);
    CHECK_FALSE(wrong);
    CHECK(allows(mask, id_of("{")));
    CHECK_FALSE(allows(mask, id_of("[")));
  }
  // A refused key: the device waiting for it is told to end the output, after the verdict.
  f.schema_json = R"({"type": "object", "properties": {"a": {"not": {}}}})";
  std::atomic<bool> refused{false};
  t.add(23, key(f), false, "response_format", {},
        [&](std::optional<troupe::recipe::api_error> e) { refused = e.has_value(); });
  REQUIRE(t.allowed(23, 40, mask));
  CHECK(refused);
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{*v4().token_to_id("<｜end▁of▁sentence｜>")});
  // A request ended while its key compiles: the device is told nothing, nothing is kept.
  f.schema_json = R"({"type": "array", "items": {"type": "string", "maxLength": 25}})";
  t.add(24, key(f), false, "response_format", {}, [](std::optional<troupe::recipe::api_error>) {});
  t.remove(24);
  CHECK_FALSE(t.allowed(24, 40, mask));
  for (std::uint64_t id : {21, 22, 23})
    t.remove(id);
  CHECK(t.size() == 0);
}

TEST_CASE("structured output table: every kind of key compiles where it is rebuilt; others are refused") {
  response_format schema;
  schema.type = response_format::kind::json_schema;
  schema.schema_json = R"({"type": "object", "properties": {"a": {"type": "integer"}}})";
  response_format object;
  object.type = response_format::kind::json_object;
  response_format ebnf;
  ebnf.type = response_format::kind::grammar;
  ebnf.grammar = "root ::= \"yes\" | \"no\"";
  response_format tag;
  tag.type = response_format::kind::structural_tag;
  tag.structural_tag = R"({"format": {"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": "</a>"}})";
  const auto tools = constraint_table::tools_key(with_tools(troupe::recipe::tool_choice::automatic),
                                                 troupe::recipe::prompt_format::v4, key(schema));
  constraint_table t(v4());
  const std::vector<std::int32_t> prompt(5, 0);
  std::uint64_t id = 1;
  for (const auto& k : {key(schema), key(object), key(ebnf), key(tag), regex("(yes|no)!"), regex(""), tools})
    CHECK_MESSAGE(!restore_now(t, id++, {k, false, prompt.size()}, prompt), k);
  CHECK(key(response_format{}).empty());
  CHECK(restore_now(t, id++, {"", false, 5}, prompt).has_value());
  CHECK(restore_now(t, id++, {"ebnf:root ::= \"x\"", false, 5}, prompt).has_value());
  CHECK(restore_now(t, id++, {"tools:[1]", false, 5}, prompt).has_value());
}

TEST_CASE("structured output table: strict or required tools constrain the output to calls of those tools") {
  using troupe::recipe::tool_choice;
  const auto v4f = troupe::recipe::prompt_format::v4;
  // No constraint where nothing asks for one: no tools, tools off, auto tools that are not strict.
  auto plain = with_tools(tool_choice::automatic);
  plain.tools[0].strict_schema.reset();
  CHECK(constraint_table::tools_key(plain, v4f, "").empty());
  CHECK(constraint_table::tools_key(plain, v4f, regex("x")) != regex("x"));  // a format beside tools
  CHECK(constraint_table::tools_key(with_tools(tool_choice::none), v4f, regex("x")) == regex("x"));
  CHECK(constraint_table::tools_key(troupe::recipe::conversation{}, v4f, "").empty());
  CHECK(constraint_table::tools_key(plain, troupe::recipe::prompt_format::v41, "") == "");
  auto one = plain;  // parallel calls off: a grammar with one call at most, even without strict tools
  one.one_call = true;
  CHECK(constraint_table::tools_key(one, v4f, "").find("\"one_call\":true") != std::string::npos);

  // tool_choice required: the prompt opened the block, so the output starts with `<｜DSML｜invoke`.
  const std::string required = constraint_table::tools_key(with_tools(tool_choice::required), v4f, "");
  REQUIRE(required.starts_with("tools:"));
  constraint_table t(v4());
  const std::vector<std::string> params{"tools[0].function.parameters", "tools[1].function.parameters"};
  REQUIRE_FALSE(add_now(t, 3, required, false, "response_format", params));
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  REQUIRE(t.allowed(3, 20, mask));
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{id_of("<")});
  t.accepted(3, 20, static_cast<std::int32_t>(id_of("<")));
  REQUIRE(t.allowed(3, 21, mask));
  const auto dsml = *v4().token_to_id("｜DSML｜");
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{dsml});  // the control token, nothing else

  // A strict schema the engine refuses: a 400 naming that tool's field.
  auto bad = with_tools(tool_choice::automatic);
  bad.tools[1].strict_schema = R"({"type": "object", "properties": {"q": {"type": "string", "not": {}}}})";
  bad.tools[1].schema_param = "tools[1].function.parameters";
  const auto e = add_now(t, 4, constraint_table::tools_key(bad, v4f, ""), false, "response_format", params);
  REQUIRE(e.has_value());
  CHECK(e->status == 400);
  CHECK(e->param == "tools[1].function.parameters");
  CHECK(e->message.find("'not'") != std::string::npos);
  CHECK(e->message.find("#/properties/q") != std::string::npos);
}

TEST_CASE("structured output table: a constraint rebuilt in another process continues where the output stands") {
  // The control process's table followed tokens 100.. of request 7; an instance process's
  // table is given the spec and the context (prompt, then the output so far) and must allow
  // at the next position exactly what the first table allows.
  constraint_table control(v4()), instance(v4());
  const auto f = regex("(yes|no), (yes|no)!");
  REQUIRE_FALSE(add_now(control, 7, f, false, "response_format"));
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32), other(mask.size());
  std::vector<std::int32_t> context(100, static_cast<std::int32_t>(id_of("!")));  // a prompt
  for (const std::string piece : {"yes", ",", " no"}) {
    REQUIRE(control.allowed(7, context.size(), mask));
    control.accepted(7, context.size(), static_cast<std::int32_t>(id_of(piece)));
    context.push_back(static_cast<std::int32_t>(id_of(piece)));
  }
  const troupe::runtime::constraint_spec spec{f, false, 100};
  REQUIRE_FALSE(restore_now(instance, 7, spec, context));
  REQUIRE(control.allowed(7, 103, mask));
  REQUIRE(instance.allowed(7, 103, other));
  CHECK(ids_of(other) == ids_of(mask));
  CHECK(ids_of(other) == std::vector<std::uint32_t>{id_of("!")});
  // Only the output is replayed: a prompt the grammar would refuse does not matter, but an
  // output token it refuses does, and nothing is registered then.
  context[101] = static_cast<std::int32_t>(id_of("!"));
  const auto e = restore_now(instance, 8, spec, context);
  REQUIRE(e.has_value());
  CHECK(e->find("position 101") != std::string::npos);
  CHECK_FALSE(instance.allowed(8, 103, other));
  // A spec whose format does not compile is refused with the compiler's words.
  const troupe::runtime::constraint_spec bad{"regex:(", false, 100};
  const auto b = restore_now(instance, 9, bad, context);
  REQUIRE(b.has_value());
  CHECK(b->find("regex") != std::string::npos);
  CHECK(restore_now(instance, 10, {"nonsense", false, 0}, context).has_value());
}

TEST_CASE("structured output table: a long output so far is replayed on a compile thread, even for a known format") {
  constraint_table t(v4());
  const auto a = static_cast<std::int32_t>(id_of("a"));
  const troupe::runtime::constraint_spec spec{regex("a*b"), false, 10};
  std::vector<std::int32_t> context(10, 0);
  REQUIRE_FALSE(restore_now(t, 1, spec, context));  // compiles the format
  context.insert(context.end(), 300, a);
  std::promise<std::optional<std::string>> verdict;
  auto r = t.restore(2, spec, context, [&](std::optional<std::string> why) { verdict.set_value(why); });
  CHECK(r.state == constraint_table::restore_result::compiling);
  CHECK_FALSE(verdict.get_future().get());
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  REQUIRE(t.allowed(2, context.size(), mask));
  CHECK(allows(mask, id_of("a")));
  CHECK(allows(mask, id_of("b")));
  // Short, the same replay is done at once.
  context.resize(10 + 200);
  CHECK(t.restore(3, spec, context, [](std::optional<std::string>) { FAIL("no compile thread"); }).state ==
        constraint_table::restore_result::rebuilt);
}

TEST_CASE("structured output table: a rebuilt thinking-mode constraint starts after the </think> it was given") {
  constraint_table t(v4());
  const auto think_end = static_cast<std::int32_t>(*v4().token_to_id("</think>"));
  const troupe::runtime::constraint_spec spec{regex("ok"), true, 10};
  std::vector<std::int32_t> context(10, 0);
  context.push_back(static_cast<std::int32_t>(id_of("!")));  // reasoning, position 10
  REQUIRE_FALSE(restore_now(t, 1, spec, context));
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  CHECK_FALSE(t.allowed(1, 11, mask));  // still reasoning
  context.push_back(think_end);
  REQUIRE_FALSE(restore_now(t, 2, spec, context));
  REQUIRE(t.allowed(2, 12, mask));
  CHECK(allows(mask, id_of("ok")));
  CHECK_FALSE(allows(mask, id_of("!")));
}

TEST_CASE("structured output table: a grammar request follows its rules; a bad grammar is a 400 naming the position") {
  response_format f;
  f.type = response_format::kind::grammar;
  f.grammar = "root ::= answer \"!\"\nanswer ::= \"yes\" | \"no\" | \"(\" answer \")\"";
  constraint_table t(v4());
  REQUIRE_FALSE(add_now(t, 11, key(f), false, "response_format"));
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  const auto eos = *v4().token_to_id("<｜end▁of▁sentence｜>");
  std::uint64_t pos = 50;
  REQUIRE(t.allowed(11, pos, mask));
  CHECK_FALSE(allows(mask, id_of("!")));  // "!" only after a whole answer
  for (const std::string tok : {"(", "(", "yes", ")", ")", "!"}) {
    REQUIRE(t.allowed(11, pos, mask));
    CHECK_MESSAGE(allows(mask, id_of(tok)), tok);
    CHECK_FALSE(allows(mask, eos));
    t.accepted(11, pos++, static_cast<std::int32_t>(id_of(tok)));
  }
  REQUIRE(t.allowed(11, pos, mask));
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{eos});
  t.remove(11);

  f.grammar = "root ::= answer\nanswer ::= \"yes\" | maybe";
  const auto e = add_now(t, 12, key(f), false, "response_format");
  REQUIRE(e.has_value());
  CHECK(e->status == 400);
  CHECK(e->type == "invalid_request_error");
  CHECK(e->param == "response_format");
  CHECK(e->message == "Invalid grammar for structured output: line 2, column 20: undefined rule 'maybe'.");
  t.remove(12);  // the caller ends a refused request
  CHECK(t.size() == 0);
}

TEST_CASE("structured output table: a structural tag leaves text free until a trigger; a bad one is a 400") {
  response_format f;
  f.type = response_format::kind::structural_tag;
  f.structural_tag = R"({"type": "structural_tag", "triggers": ["<f="], "structures": [{"begin": "<f=a>",
      "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                 "additionalProperties": false}, "end": "</f>"}]})";
  constraint_table t(v4());
  REQUIRE_FALSE(add_now(t, 13, key(f), false, "response_format"));
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  const auto eos = *v4().token_to_id("<｜end▁of▁sentence｜>");
  std::uint64_t pos = 5;
  REQUIRE(t.allowed(13, pos, mask));
  CHECK(allows(mask, eos));  // free text may end
  CHECK(ids_of(mask).size() > v4().vocab_size() / 2);
  const auto text = v4().encode("Hi <f=a>{\"n\": 4}</f>", troupe::recipe::encode_mode::raw);
  for (std::size_t i = 0; i < text.size(); ++i) {
    REQUIRE(t.allowed(13, pos, mask));
    REQUIRE(allows(mask, text[i]));
    const auto so_far = v4().decode_bytes({text.data(), i});
    // Inside the call: a few tokens allowed, and not the end of the output.
    if (so_far.find("<f=") != std::string::npos) {
      CHECK_MESSAGE(ids_of(mask).size() < 2000, so_far);
      CHECK_FALSE(allows(mask, eos));
    }
    t.accepted(13, pos++, static_cast<std::int32_t>(text[i]));
  }
  REQUIRE(t.allowed(13, pos, mask));
  CHECK(allows(mask, eos));
  t.remove(13);

  // Token-level formats: a call begins and ends with control tokens, which only the grammar's
  // token symbols let through; accepted() reads them as those tokens.
  f.structural_tag = R"({"format": {"type": "token_triggered_tags", "trigger_tokens": ["<｜tool▁call▁begin｜>"],
      "at_least_one": true, "stop_after_first": true, "tags": [{"type": "tag",
      "begin": {"type": "token", "token": "<｜tool▁call▁begin｜>"}, "content": {"type": "regex", "pattern": "[0-9]+"},
      "end": {"type": "token", "token": "<｜tool▁call▁end｜>"}}]}})";
  REQUIRE_FALSE(add_now(t, 15, key(f), false, "response_format"));
  const auto begin = *v4().token_to_id("<｜tool▁call▁begin｜>"), end = *v4().token_to_id("<｜tool▁call▁end｜>");
  pos = 0;
  REQUIRE(t.allowed(15, pos, mask));
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{begin});
  t.accepted(15, pos++, static_cast<std::int32_t>(begin));
  REQUIRE(t.allowed(15, pos, mask));
  CHECK_FALSE(allows(mask, end));
  const auto digits = v4().encode("42", troupe::recipe::encode_mode::raw);
  for (const auto id : digits) {
    REQUIRE(t.allowed(15, pos, mask));
    REQUIRE(allows(mask, id));
    t.accepted(15, pos++, static_cast<std::int32_t>(id));
  }
  REQUIRE(t.allowed(15, pos, mask));
  CHECK(allows(mask, end));
  CHECK_FALSE(allows(mask, eos));
  t.accepted(15, pos++, static_cast<std::int32_t>(end));
  REQUIRE(t.allowed(15, pos, mask));
  CHECK(ids_of(mask) == std::vector<std::uint32_t>{eos});
  t.remove(15);

  f.structural_tag = R"({"format": {"type": "tag", "begin": "<a>", "content": {"type": "token", "token": "<｜nope｜>"},
      "end": "</a>"}})";
  const auto e = add_now(t, 14, key(f), false, "structured_outputs.structural_tag");
  REQUIRE(e.has_value());
  CHECK(e->status == 400);
  CHECK(e->param == "structured_outputs.structural_tag");
  CHECK(e->message == "Invalid structural tag for structured output: unknown token '<｜nope｜>' (at "
                      "'#/format/content/token').");
  t.remove(14);
}

TEST_CASE("structured output table: a Lark grammar has a key of its own; a bad one is a 400 naming the position") {
  response_format f;
  f.type = response_format::kind::grammar;
  f.grammar = "start: \"yes\" | \"no\"";
  f.syntax = response_format::grammar_syntax::lark;
  response_format same_text = f;
  same_text.syntax = response_format::grammar_syntax::gbnf;
  CHECK(key(f) == "lark:" + f.grammar);
  CHECK(key(f) != key(same_text));  // the same text in the other syntax is another constraint
  constraint_table t(v4());
  REQUIRE_FALSE(add_now(t, 21, key(f), false, "response_format"));
  std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
  REQUIRE(t.allowed(21, 50, mask));
  CHECK(allows(mask, id_of("yes")));
  CHECK_FALSE(allows(mask, id_of("maybe")));
  const auto gbnf = add_now(t, 22, key(same_text), false, "response_format");
  REQUIRE(gbnf.has_value());
  CHECK(gbnf->message.find("Invalid grammar for structured output: line 1, column 6") == 0);

  f.grammar = "start: answer\nanswer: \"yes\" | maybe";
  const auto e = add_now(t, 23, key(f), false, "response_format");
  REQUIRE(e.has_value());
  CHECK(e->status == 400);
  CHECK(e->param == "response_format");
  CHECK(e->message == "Invalid Lark grammar for structured output: line 2, column 17: undefined rule 'maybe'.");
  t.remove(21);
  t.remove(22);
  t.remove(23);
  CHECK(t.size() == 0);
}

TEST_CASE("structured output table: warming the next state's mask on a compile thread changes no mask") {
  // A nested schema along a valid output: the masks asked for, with the warming on and off, are
  // the same (each token followed by the time a forward pass would give the compile threads).
  response_format f;
  f.type = response_format::kind::json_schema;
  f.schema_json = R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
      "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}}, "n": {"type": "integer"}},
      "required": ["name", "tags", "n"], "additionalProperties": false})";
  const auto text = v4().encode(R"({"name": "Ada", "tags": ["bb", "a"], "n": -42})", troupe::recipe::encode_mode::raw);
  std::vector<std::vector<std::uint32_t>> masks[2];
  for (const bool warm : {false, true}) {
    constraint_table t(v4(), 2, warm);
    REQUIRE_FALSE(add_now(t, 1, key(f), false, "response_format"));
    std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
    for (std::size_t i = 0; i <= text.size(); ++i) {
      REQUIRE(t.allowed(1, i, mask));
      masks[warm].push_back(ids_of(mask));
      if (i == text.size()) break;
      REQUIRE(allows(mask, text[i]));
      t.accepted(1, i, static_cast<std::int32_t>(text[i]));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  CHECK(masks[0] == masks[1]);
  CHECK(masks[1].back() == std::vector<std::uint32_t>{*v4().token_to_id("<｜end▁of▁sentence｜>")});
}
