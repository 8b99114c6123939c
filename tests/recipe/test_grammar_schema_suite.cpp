// The JSON-Schema-Test-Suite (draft 2020-12) decides which instances a compiled schema accepts:
// for every schema the compiler takes, each valid instance (in canonical form) is accepted and
// each invalid one rejected; every schema it refuses names a keyword.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "grammar_fixture.hpp"

using namespace troupe::recipe::testing;

namespace {

ojson read_suite_file(const std::string& name) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/tests/recipe/fixtures/json-schema-test-suite/" + name);
  REQUIRE_MESSAGE(in.good(), "cannot open ", name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ojson::parse(ss.str());
}

struct tally {
  int groups = 0, compiled = 0, refused = 0, cases = 0, agreed = 0, oneof_overlap = 0, format_asserted = 0;
};

// Runs one suite file; returns the counts. Every disagreement fails the test, except an invalid
// instance accepted because it matches more than one oneOf branch (oneOf compiles as anyOf) and
// a string the suite calls valid because `format` is only an annotation by default (formats are
// asserted here); both are counted (docs/structured-output.md).
tally run_file(const std::string& name) {
  tally t;
  for (const auto& group : read_suite_file(name)) {
    ++t.groups;
    const ojson& schema = group["schema"];
    auto compiled = troupe::recipe::grammar::compile_json_schema(schema);
    if (auto* e = std::get_if<troupe::recipe::grammar::schema_error>(&compiled)) {
      ++t.refused;
      INFO(name, ": ", group["description"].get<std::string>(), ": ", e->to_string());
      CHECK(!e->message.empty());
      continue;
    }
    ++t.compiled;
    const auto g = std::make_shared<const troupe::recipe::grammar::grammar>(
        std::move(std::get<troupe::recipe::grammar::grammar>(compiled)));
    std::vector<std::string> order;
    property_order(schema, order);
    for (const auto& test : group["tests"]) {
      ++t.cases;
      const std::string text = canonical_instance(test["data"], order);
      const bool expected = test["valid"].get<bool>();
      const bool got = accepts(g, text);
      if (got == expected) {
        ++t.agreed;
        continue;
      }
      if (!expected && got && schema.is_object() && schema.contains("oneOf") &&
          validator(schema).matching_branches(test["data"], schema["oneOf"]) > 1) {
        ++t.oneof_overlap;
        continue;
      }
      if (expected && !got && schema.is_object() && schema.contains("format") && test["data"].is_string()) {
        ++t.format_asserted;
        continue;
      }
      FAIL_CHECK(name, ": ", group["description"].get<std::string>(), " / ",
                 test["description"].get<std::string>(), ": ", text, " expected ",
                 std::string(expected ? "valid" : "invalid"));
    }
  }
  MESSAGE(name, ": ", t.groups, " groups, ", t.compiled, " compiled, ", t.refused, " refused; ", t.agreed, "/",
          t.cases, " cases agree", t.oneof_overlap ? ", oneOf overlaps " + std::to_string(t.oneof_overlap) : "",
          t.format_asserted ? ", format asserted " + std::to_string(t.format_asserted) : "");
  return t;
}

}  // namespace

TEST_CASE("grammar suite: each supported keyword's test file agrees with the JSON-Schema-Test-Suite") {
  // file, groups the compiler takes today (the rest are refused with an error naming the
  // keyword: patternProperties, dependentSchemas, allOf of several schemas, remote $ref, Unicode property escapes,
  // number bounds, a schema that accepts nothing, ...)
  const std::vector<std::pair<std::string, int>> files{
      {"type.json", 11},          {"enum.json", 14},      {"const.json", 17},      {"properties.json", 5},
      {"required.json", 5},       {"additionalProperties.json", 4}, {"items.json", 9}, {"prefixItems.json", 4},
      {"minItems.json", 2},       {"maxItems.json", 2},   {"anyOf.json", 5},       {"oneOf.json", 7},
      {"allOf.json", 2},          {"ref.json", 17},       {"defs.json", 0},        {"pattern.json", 2},
      {"minLength.json", 2},      {"maxLength.json", 2},  {"minimum.json", 0},     {"maximum.json", 0},
      {"exclusiveMinimum.json", 0}, {"exclusiveMaximum.json", 0}, {"format.json", 7}, {"boolean_schema.json", 1}};
  int compiled = 0, cases = 0, agreed = 0;
  for (const auto& [file, at_least] : files) {
    const tally t = run_file(file);
    CHECK_MESSAGE(t.compiled >= at_least, file, ": only ", t.compiled, " groups compiled");
    compiled += t.compiled;
    cases += t.cases;
    agreed += t.agreed;
  }
  MESSAGE("suite: ", compiled, " schemas compiled, ", agreed, "/", cases, " of their cases agree");
}

TEST_CASE("grammar suite: a refused schema names the keyword and its JSON pointer") {
  const auto r = troupe::recipe::grammar::compile_json_schema(
      ojson::parse(R"({"type": "object", "properties": {"a/b": {"items": {"not": {}}}}})"));
  const auto* e = std::get_if<troupe::recipe::grammar::schema_error>(&r);
  REQUIRE(e != nullptr);
  CHECK(e->keyword == "not");
  CHECK(e->pointer == "/properties/a~1b/items");
  CHECK(e->to_string().find("'not' at '#/properties/a~1b/items'") != std::string::npos);
}
