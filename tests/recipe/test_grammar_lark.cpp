// Lark grammars (recipe/grammar/lark.hpp): each construct against the equivalent ECMAScript regex
// on every short string, %ignore placement, case-insensitive literals, the common terminals,
// errors with their positions, left recursion, masks equal to trying every token along a JSON-ish
// Lark grammar, and the API's `syntax` field and detection.
#include "recipe/chat_completions.hpp"
#include "recipe/grammar/lark.hpp"
#include "recipe/responses.hpp"
#include "grammar_fixture.hpp"

#include <doctest/doctest.h>

#include <regex>
#include <string>
#include <vector>

using namespace troupe::recipe::testing;

namespace {

std::shared_ptr<const gr::grammar> lark_grammar(const std::string& text) {
  auto r = gr::compile_lark(text);
  if (auto* e = std::get_if<gr::ebnf_error>(&r)) FAIL("grammar refused: ", e->to_string(), "\n", text);
  return std::make_shared<const gr::grammar>(std::move(std::get<gr::grammar>(r)));
}

gr::ebnf_error lark_error(const std::string& text) {
  auto r = gr::compile_lark(text);
  const auto* e = std::get_if<gr::ebnf_error>(&r);
  REQUIRE_MESSAGE(e != nullptr, text);
  return *e;
}

// The grammar accepts exactly the strings over `alphabet` (up to `len`) that `pattern` matches.
void same_as_regex(const std::string& grammar, const std::string& pattern, const std::string& alphabet,
                   std::size_t len = 5) {
  const auto g = lark_grammar(grammar);
  const std::regex re(pattern);
  int accepted = 0;
  for (const auto& s : all_strings(alphabet, len)) {
    const bool want = std::regex_match(s, re);
    accepted += want;
    if (accepts(g, s) != want) {
      INFO(grammar, " vs /", pattern, "/ on '", s, "'");
      CHECK(accepts(g, s) == want);
    }
  }
  CHECK_MESSAGE(accepted > 0, grammar);
}

const char* const json_lark = R"lark(
// JSON, as a Lark user writes it
?start: value
?value: object
      | array
      | string
      | SIGNED_NUMBER      -> number
      | "true"             -> true
      | "false"            -> false
      | "null"             -> null
array  : "[" [value ("," value)*] "]"
object : "{" [pair ("," pair)*] "}"
pair   : string ":" value
string : ESCAPED_STRING

%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
)lark";

}  // namespace

TEST_CASE("grammar lark: each construct matches what the equivalent regex matches, on every short string") {
  struct example {
    const char* grammar;
    const char* pattern;
    const char* alphabet;
  };
  for (const auto& c : std::vector<example>{
           {"start: \"a\" | \"b\" \"c\"", "a|bc", "abc"},
           {"start: 'a' \"b\"?", "ab?", "ab"},
           {"start: [\"x\"] \"y\"~2..3", "x?y{2,3}", "xy"},
           {"start: (\"a\" | B)+\nB: \"b\"..\"c\"", "[abc]+", "abcd"},
           {"start: A? B*\nA: /a|ab/\nB: \"b\"i", "(a|ab)?[bB]*", "abB"},
           {"start: x~3\nx: \"a\" | \"b\"", "[ab]{3}", "ab"},
           {"start: \"a\"* \"b\"+ \"c\"?", "a*b+c?", "abc"},
           {"start: X\nX.2: /[^b\\n]+/ \"b\"", "[^b\\n]+b", "ab\nc"},  // a priority is ignored
           {"start: item\n     | item \",\" start\nitem: \"a\" -> first\n    | \"b\"", "[ab](,[ab])*", "ab,"},
           {"start: \"a\"\n\n  // a comment between alternatives\n  | \"b\" # another\n", "a|b", "abc"},
           {"?start: _x\n_x: y\n!y: \"y\"", "y", "xy"},  // ?, !, _ are just names here
           {"start: /a.c/", "a[^\\n]c", "abc\n"},          // `.` is any character but "\n" (Python)
           {"start: /a.c/s", "a[^]c", "abc\n"},            // `s`: `.` is any character
           {"start: /[]a]+/", "[\\]a]+", "]ab"},           // `]` first in a class is a literal (Python)
           {"start: /a{,2}/", "a{0,2}", "a{,2}"},          // {,n} is {0,n} (Python)
           {"start: /[^a]b/i", "[^aA][bB]", "aAbB"},       // `i` before the negation, as Python does
           {"start: \"\\x41\\u0042\\t\\\"\\\\\"", "AB\\t\"\\\\", "AB\t\"\\"},
       })
    same_as_regex(c.grammar, c.pattern, c.alphabet);
}

TEST_CASE("grammar lark: %ignore goes between the terminals of rules, and before and after, never inside a terminal") {
  same_as_regex("start: \"a\" (\",\" \"a\")*\n%ignore \" \"", " *a( *, *a)* *", "a, ");
  same_as_regex("start: \"a\"+\n%ignore \" \"", " *a( *a)* *", "a ");              // between repetitions
  same_as_regex("start: AB+\nAB: \"a\" \"b\"\n%ignore \" \"", " *ab( *ab)* *", "ab ");  // not inside AB
  same_as_regex("start: x x\nx: \"a\" \"b\"?\n%ignore \" \"", " *a( *b)? *a( *b)? *", "ab ");  // across rules
  same_as_regex("start: \"a\" \"b\"\n%ignore \" \"\n%ignore /-+/", "[ -]*a[ -]*b[ -]*", "ab -", 6);  // two %ignores
  same_as_regex("start: \"a\"~2\n%ignore (X | \"-\")\nX: \"x\"", "[x-]*a[x-]*a[x-]*", "ax-", 6);

  const auto g = lark_grammar(json_lark);
  for (const char* ok : {"{}", "[]", " { \"a\" : 1 , \"b\":[true,false , null] }\n", "-1.5e3", "\"x\\\"y\"",
                         "[ [ ] , { } ]", "{\"k\": {\"n\": \"v\"}}"})
    CHECK_MESSAGE(accepts(g, ok), ok);
  for (const char* bad : {"{\"a\": 1 2}", "t rue", "- 1", "[1,]", "{\"a\"}", "\"a\nb\"", "{'a': 1}"})
    CHECK_MESSAGE(!accepts(g, bad), bad);
}

TEST_CASE("grammar lark: case-insensitive strings and regexes cover ASCII letters") {
  const auto g = lark_grammar("start: \"select\"i \" \" NAME \";\"\nNAME: /[a-z_]+/i");
  for (const char* ok : {"select a;", "SELECT Foo_Bar;", "SeLeCt x;"}) CHECK_MESSAGE(accepts(g, ok), ok);
  for (const char* bad : {"select 1;", "selec a;", "select  a;"}) CHECK_MESSAGE(!accepts(g, bad), bad);
  CHECK(lark_error("start: \"é\"i").message.find("'i' flag applies to ASCII letters only") != std::string::npos);
  CHECK(lark_error("start: /[à-ÿ]/i").message.find("'i' flag applies to ASCII letters only") != std::string::npos);
  CHECK(accepts(lark_grammar("start: /[^\"]+/i"), "é\xe2\x82\xac"));  // non-ASCII from a negation is fine
}

TEST_CASE("grammar lark: the common terminals match what Lark's common.lark matches") {
  struct example {
    const char* name;
    std::vector<std::string> ok, bad;
  };
  for (const auto& c : std::vector<example>{
           {"DIGIT", {"0", "9"}, {"a", "12", ""}},
           {"HEXDIGIT", {"a", "F", "7"}, {"g", "ff"}},
           {"INT", {"0", "0123"}, {"-1", "", "1.0"}},
           {"SIGNED_INT", {"+1", "-20", "3"}, {"+-1", "1e3"}},
           {"DECIMAL", {"1.", "1.5", ".5"}, {".", "1", "1.5e3"}},
           {"FLOAT", {"1e5", "1.5E-3", ".5", "1."}, {"1", "e5", ".e5"}},
           {"SIGNED_FLOAT", {"-1e5", "+.5"}, {"-1"}},
           {"NUMBER", {"1", "1.5", "1e5", ".5e+2"}, {"-1", "1e", "."}},
           {"SIGNED_NUMBER", {"-1", "+1.5", "1e-5"}, {"--1", "1.5.2"}},
           {"ESCAPED_STRING", {"\"\"", "\"a\\\"b\"", "\"\\\\\"", "\"é\\n\""}, {"\"a\"b\"", "\"a\\\"", "\"a\nb\"", "'a'"}},
           {"LCASE_LETTER", {"a"}, {"A", "ab"}},
           {"UCASE_LETTER", {"Z"}, {"z"}},
           {"LETTER", {"a", "Z"}, {"1", "_"}},
           {"WORD", {"abcXYZ"}, {"ab1", ""}},
           {"CNAME", {"_a1", "x", "__"}, {"1a", "a-b"}},
           {"WS_INLINE", {" \t "}, {"\n", ""}},
           {"WS", {" \t\f\r\n"}, {"", "\v"}},
           {"CR", {"\r"}, {"\n"}},
           {"LF", {"\n"}, {"\r"}},
           {"NEWLINE", {"\n", "\r\n\n"}, {"\r", "\n\r"}},
           {"SH_COMMENT", {"#", "# x"}, {"# x\n"}},
           {"CPP_COMMENT", {"// x"}, {"/ x"}},
           {"C_COMMENT", {"/**/", "/* a * b */", "/* a\n**/"}, {"/* a */ b */", "/*/"}},
           {"SQL_COMMENT", {"-- x"}, {"- x"}},
       }) {
    const auto g = lark_grammar(std::string("start: ") + c.name + "\n%import common." + c.name);
    for (const auto& s : c.ok) CHECK_MESSAGE(accepts(g, s), c.name, " '", s, "'");
    for (const auto& s : c.bad) CHECK_MESSAGE(!accepts(g, s), c.name, " '", s, "'");
  }
  // A list, an alias, and the same terminal imported twice.
  const auto g = lark_grammar("start: N \",\" WORD\n%import common (WORD, WS)\n%import common.INT -> N\n"
                              "%import common.WORD\n%ignore WS");
  CHECK(accepts(g, "12 , ab"));
  CHECK_FALSE(accepts(g, "ab,12"));
}

TEST_CASE("grammar lark: errors name the line, the column and what was expected") {
  struct example {
    std::string grammar;
    std::size_t line, column;
    std::string message;  // a part of it
  };
  const std::vector<example> cases{
      {"start: expr\nexpr: expr \"+\" term | term\nterm: \"1\"", 2, 1,
       "rule 'expr' is left-recursive: it can reach itself without consuming any output (write 'a: a \"+\" b | b' "
       "as 'a: b (\"+\" b)*')"},
      {"start: a\na: b? \"x\"\nb: \"y\"? a", 2, 1, "left-recursive"},
      {"start: \"a\"\nstart: \"b\"", 2, 1, "rule 'start' is defined twice (first at line 1, column 1)"},
      {"start: \"a\" thing", 1, 12, "undefined rule 'thing'"},
      {"start: A", 1, 8, "undefined terminal 'A'"},
      {"start: A\nA: \"a\" A", 2, 1, "terminal 'A' is recursive"},
      {"start: A\nA: \"a\" b\nb: \"b\"", 2, 8, "a terminal cannot reference the rule 'b'"},
      {"start ::= \"a\"", 1, 7, "'::=' is GBNF"},
      {"start \"a\"", 1, 7, "unexpected '\"': expected ':' after the name 'start'"},
      {"start: (\"a\" | \"b\"", 1, 18, "expected ')' to close the '(' at line 1, column 8"},
      {"start: [\"a\"\n  \"b\"]", 1, 12, "expected ']' to close the '['"},
      {"start: \"a\")", 1, 11, "unbalanced ')'"},
      {"start: \"ab", 1, 8, "unterminated string"},
      {"start: \"a\nb\"", 1, 10, "a string cannot span lines"},
      {"start: \"\\d\"", 1, 9, "unknown escape '\\d'"},
      {"start: \"\\v\"", 1, 9, "unknown escape '\\v'"},
      {"start: /a(?=b)/", 1, 10, "in the regex: lookaround and inline flags are not supported"},
      {"start: /^a/", 1, 9, "anchors are not supported in a Lark terminal"},
      {"start: /\".*?\"/", 1, 12, "lazy quantifiers are not supported"},
      {"start: /a/x", 1, 11, "regex flag 'x' is not supported"},
      {"start: /a\n/", 1, 10, "a regex cannot span lines"},
      {"start: \"a\"..\"bc\"", 1, 13, "a range's ends are single characters"},
      {"start: \"z\"..\"a\"", 1, 8, "range out of order"},
      {"start: \"a\"~3..1", 1, 11, "m < n"},
      {"start: \"a\"~1001", 1, 11, "repetition bound above 1000"},
      {"start: \"a\"*+", 1, 12, "cannot follow another repetition"},
      {"start: * \"a\"", 1, 8, "nothing to repeat"},
      {"start: list{\"a\"}", 1, 12, "templates"},
      {"list{x}: x", 1, 5, "templates"},
      {"start: <|endoftext|>", 1, 8, "special tokens"},
      {"start: \"a\"\n%declare B", 2, 1, "%declare is not supported"},
      {"start: \"a\"\n%override start: \"b\"", 2, 1, "%override is not supported"},
      {"start: \"a\"\n%import mymodule.X", 2, 9, "only Lark's common terminals can be imported"},
      {"start: \"a\"\n%import common.NOPE", 2, 16, "'NOPE' is not one of the common terminals supported: "},
      {"start: \"a\"\n%frobnicate", 2, 1, "unknown directive '%frobnicate'"},
      {"start: \"a\"\n%ignore", 2, 8, "expected a terminal after %ignore"},
      {"start: \"a\"\n%ignore rule", 2, 9, "a terminal cannot reference the rule 'rule'"},
      {"myRule: \"a\"", 1, 1, "mixes cases"},
      {"?NAME: \"a\"", 1, 1, "a terminal takes no '?' or '!' modifier"},
      {"start: \"a\"\n\"b\"", 2, 1, "expected a rule or terminal name"},
      {"start: \"a\" ;", 1, 12, "unexpected ';': expected a string \"...\", a regex /.../, a name, '(' or '['"},
      {"start: \"a\" | loop\nloop: \"b\" loop", 2, 1, "rule 'loop' matches no string"},
      {"start: /[ab]*a[ab]{20}/", 1, 1, "rule 'start': rule start needs more than 4096 automaton states"},
      {"start: \"\xff\"", 1, 9, "invalid UTF-8"},
  };
  for (const auto& c : cases) {
    const auto e = lark_error(c.grammar);
    INFO(c.grammar, " -> ", e.to_string());
    CHECK(e.line == c.line);
    CHECK(e.column == c.column);
    CHECK(e.message.find(c.message) != std::string::npos);
  }
  for (const auto& [grammar, message] : std::vector<std::pair<std::string, std::string>>{
           {"", "the grammar defines no rule"},
           {"// only a comment\n", "the grammar defines no rule"},
           {"root: \"a\"", "the grammar has no rule named 'start' (the start rule)"},
           {"root: \"a\"\n%ignore \" \"", "the grammar has no rule named 'start' (the start rule)"}}) {
    const auto e = lark_error(grammar);
    CHECK(e.line == 0);
    CHECK(e.to_string() == message);
  }
  CHECK(std::holds_alternative<gr::grammar>(gr::compile_lark("root: \"a\"", "root")));
}

TEST_CASE("grammar lark: masks equal trying every token of the DeepSeek-V4 vocabulary") {
  check_masks_along(lark_grammar(json_lark),
                    " {\"name\": \"Ada \\\"L\\\"\" , \"tags\": [\"math\", 1.5e3, -0],\n  \"ok\": true, \"x\": null} ");
}

TEST_CASE("grammar lark: a grammar is GBNF when a line holds '::=' outside strings and comments") {
  CHECK_FALSE(gr::looks_like_lark("root ::= \"a\""));
  CHECK_FALSE(gr::looks_like_lark("# a comment: x\n\nroot ::= [a-z]+ # ::="));
  CHECK(gr::looks_like_lark("start: \"a\""));
  CHECK(gr::looks_like_lark("start: \"::=\" | '::='\n// root ::= x\n# root ::= y"));
  CHECK(gr::looks_like_lark(""));
}

TEST_CASE("grammar lark: the API takes 'syntax' beside a grammar, detects it when absent, refuses other values") {
  using troupe::recipe::response_format;
  using syntax = response_format::grammar_syntax;
  troupe::recipe::chat_completions_config cfg;
  cfg.models = {"DeepSeek-V4-Pro"};
  auto chat = [&](const std::string& format) {
    return troupe::recipe::parse_chat_completions(
        R"({"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "a"}], "response_format": )" + format + "}",
        cfg);
  };
  auto chat_format = [&](const std::string& format) {
    auto r = chat(format);
    REQUIRE_MESSAGE(std::holds_alternative<troupe::recipe::chat_completions_request>(r), format);
    return std::get<troupe::recipe::chat_completions_request>(r).conversation.format;
  };
  CHECK(chat_format(R"({"type": "grammar", "grammar": "start: \"a\""})").syntax == syntax::lark);
  CHECK(chat_format(R"({"type": "grammar", "grammar": "root ::= \"a\""})").syntax == syntax::gbnf);
  CHECK(chat_format(R"({"type": "grammar", "grammar": "root ::= \"a\"", "syntax": "lark"})").syntax == syntax::lark);
  CHECK(chat_format(R"({"type": "grammar", "grammar": "start: \"a\"", "syntax": "gbnf"})").syntax == syntax::gbnf);
  CHECK(chat_format(R"({"type": "grammar", "grammar": "start: \"a\"", "syntax": null})").syntax == syntax::lark);
  const auto bad = chat(R"({"type": "grammar", "grammar": "start: \"a\"", "syntax": "ebnf"})");
  REQUIRE(std::holds_alternative<troupe::recipe::api_error>(bad));
  const auto& e = std::get<troupe::recipe::api_error>(bad);
  CHECK(e.status == 400);
  CHECK(e.param == "response_format.syntax");
  CHECK(e.message == "Invalid value for 'response_format.syntax': 'ebnf'. Supported values are 'lark' and 'gbnf'.");
  const auto not_string = chat(R"({"type": "grammar", "grammar": "start: \"a\"", "syntax": 1})");
  REQUIRE(std::holds_alternative<troupe::recipe::api_error>(not_string));
  CHECK(std::get<troupe::recipe::api_error>(not_string).param == "response_format.syntax");

  auto responses = [&](const std::string& format) {
    return troupe::recipe::parse_responses(
        R"({"model": "DeepSeek-V4-Pro", "input": "a", "text": {"format": )" + format + "}}", cfg);
  };
  const auto r = responses(R"({"type": "grammar", "grammar": "start: \"a\""})");
  REQUIRE(std::holds_alternative<troupe::recipe::responses_request>(r));
  CHECK(std::get<troupe::recipe::responses_request>(r).conversation.format.syntax == syntax::lark);
  const auto rbad = responses(R"({"type": "grammar", "grammar": "start: \"a\"", "syntax": "LARK"})");
  REQUIRE(std::holds_alternative<troupe::recipe::api_error>(rbad));
  CHECK(std::get<troupe::recipe::api_error>(rbad).param == "text.format.syntax");

  // vLLM's grammar fields detect Lark as vLLM does; SGLang's `ebnf` is GBNF.
  auto extra = [&](const std::string& field) {
    auto x = troupe::recipe::parse_chat_completions(
        R"({"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "a"}], )" + field + "}", cfg);
    REQUIRE_MESSAGE(std::holds_alternative<troupe::recipe::chat_completions_request>(x), field);
    return *std::get<troupe::recipe::chat_completions_request>(x).params.extra_constraint;
  };
  CHECK(extra(R"("structured_outputs": {"grammar": "start: \"a\""})").syntax == syntax::lark);
  CHECK(extra(R"("guided_grammar": "root ::= \"a\"")").syntax == syntax::gbnf);
  CHECK(extra(R"("ebnf": "start: \"a\"")").syntax == syntax::gbnf);
}
