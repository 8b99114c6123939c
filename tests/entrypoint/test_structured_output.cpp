// The entrypoint's constraint table (actors/entrypoint/structured_output.hpp): what a device is
// told to allow at each position of a constrained request, and how it follows the ids drawn.
#include "actors/entrypoint/structured_output.hpp"

#include <doctest/doctest.h>

#include <string>
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

response_format regex(std::string pattern) {
  response_format f;
  f.type = response_format::kind::regex;
  f.regex = std::move(pattern);
  return f;
}

}  // namespace

TEST_CASE("structured output table: a regex request allows exactly its tokens, position by position") {
  constraint_table t(v4());
  REQUIRE_FALSE(t.add(7, regex("(yes|no)!"), false, "response_format"));
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

TEST_CASE("structured output table: in thinking mode the constraint starts after </think>") {
  constraint_table t(v4());
  REQUIRE_FALSE(t.add(8, regex("ok"), true, "response_format"));
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
  const auto e = t.add(9, f, false, "text.format");
  REQUIRE(e.has_value());
  CHECK(e->status == 400);
  CHECK(e->param == "text.format");
  CHECK(e->message.find("#/properties/a") != std::string::npos);
  CHECK(t.size() == 0);
  response_format text;
  CHECK_FALSE(t.add(10, text, false, "response_format"));
  CHECK(t.size() == 0);  // a text format registers nothing
}

TEST_CASE("structured output table: a grammar request follows its rules; a bad grammar is a 400 naming the position") {
  response_format f;
  f.type = response_format::kind::grammar;
  f.grammar = "root ::= answer \"!\"\nanswer ::= \"yes\" | \"no\" | \"(\" answer \")\"";
  constraint_table t(v4());
  REQUIRE_FALSE(t.add(11, f, false, "response_format"));
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
  const auto e = t.add(12, f, false, "response_format");
  REQUIRE(e.has_value());
  CHECK(e->status == 400);
  CHECK(e->type == "invalid_request_error");
  CHECK(e->param == "response_format");
  CHECK(e->message == "Invalid grammar for structured output: line 2, column 20: undefined rule 'maybe'.");
  CHECK(t.size() == 0);
}
