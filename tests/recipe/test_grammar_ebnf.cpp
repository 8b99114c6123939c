// EBNF (GBNF) grammars (recipe/grammar/ebnf.hpp): regular grammars against std::regex_match,
// recursive ones against checkers written here (a bracket stack, a recursive-descent parser of
// arithmetic, nlohmann-json's parser for JSON), on every short string over an alphabet; masks
// against trying every token of the V4 vocabulary; errors with their line and column.
#include <doctest/doctest.h>

#include <regex>

#include "grammar_fixture.hpp"

using namespace troupe::recipe::testing;

namespace {

// Brackets () and [] nested and closed in order.
bool balanced(const std::string& s) {
  std::string open;
  for (const char c : s) {
    if (c == '(' || c == '[') {
      open += c;
    } else {
      if (open.empty() || open.back() != (c == ')' ? '(' : '[')) return false;
      open.pop_back();
    }
  }
  return open.empty();
}

// expr := term (('+'|'-') term)*, term := factor ('*' factor)*, factor := digit+ | '(' expr ')' |
// '-' factor: LL(1), so a greedy recursive descent decides it.
class arithmetic {
 public:
  static bool valid(const std::string& s) {
    arithmetic p{s};
    return p.expr() && p.i_ == s.size();
  }

 private:
  explicit arithmetic(const std::string& s) : s_(s) {}
  bool at(char c) const { return i_ < s_.size() && s_[i_] == c; }
  bool expr() {
    if (!term()) return false;
    while (at('+') || at('-')) {
      ++i_;
      if (!term()) return false;
    }
    return true;
  }
  bool term() {
    if (!factor()) return false;
    while (at('*')) {
      ++i_;
      if (!factor()) return false;
    }
    return true;
  }
  bool factor() {
    if (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return true;
    }
    if (at('(')) {
      ++i_;
      if (!expr() || !at(')')) return false;
      ++i_;
      return true;
    }
    if (at('-')) {
      ++i_;
      return factor();
    }
    return false;
  }
  const std::string& s_;
  std::size_t i_ = 0;
};

const char* const arithmetic_grammar = R"g(
# arithmetic with unary minus
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor ("*" factor)*
factor ::= [0-9]+
         | "(" expr ")"
         | "-" factor
)g";

// JSON (RFC 8259) in EBNF, whitespace included.
const char* const json_grammar = R"g(
root    ::= ws value ws
value   ::= object | array | string | number | "true" | "false" | "null"
object  ::= "{" ws ( member ( ws "," ws member )* ws )? "}"
member  ::= string ws ":" ws value
array   ::= "[" ws ( value ( ws "," ws value )* ws )? "]"
string  ::= "\"" char* "\""
char    ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number  ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws      ::= [ \t\n\r]*
)g";

}  // namespace

TEST_CASE("grammar ebnf: regular grammars match exactly what the equivalent regex matches, on every short string") {
  struct example {
    std::string ebnf, regex, alphabet;
  };
  const std::vector<example> cases{
      {R"g(root ::= "a"* "b")g", "a*b", "ab"},
      {R"g(root ::= ("ab" | "a")*)g", "(ab|a)*", "ab"},
      {R"g(root ::= "a"{2,3})g", "a{2,3}", "ab"},
      {R"g(root ::= [a-c]+ "-"? [^a-c])g", "[a-c]+-?[^a-c]", "abd-"},
      {"root ::= x y?\nx ::= \"a\" | \"b\"\ny ::= \"c\"{,2}", "(a|b)(c{0,2})?", "abc"},
      {R"g(root ::= ("a" | ) "b"+)g", "(a|)b+", "ab"},
      {R"g(root ::= [\-a]{1,} .)g", "[-a]+[\\s\\S]", "a-\n"},
      {R"g(root ::= "\x41" "\n"? [\t ])g", "A\\n?[\\t ]", "A\n\t b"},
      {"root ::= item (\",\" item){0,2}\nitem ::= [ab] # a letter\n", "[ab](,[ab]){0,2}", "ab,"},
      {R"g(root ::= "a" root | "b")g", "a*b", "ab"},
      {"root ::= \"x\" (\n  \"y\"\n  | \"z\" \"z\"\n)", "x(y|zz)", "xyz"},
      {R"g(root ::= [^\]\\]? "]")g", "[^\\]\\\\]?\\]", "]\\a"},
  };
  for (const auto& c : cases) {
    const auto g = ebnf_grammar(c.ebnf);
    const std::regex oracle(c.regex, std::regex::ECMAScript);
    for (const auto& s : all_strings(c.alphabet, 5)) {
      INFO("grammar ", c.ebnf, " on \"", s, "\"");
      CHECK(accepts(g, s) == std::regex_match(s, oracle));
    }
  }
}

TEST_CASE("grammar ebnf: recursive grammars agree with checkers written here, on every short string") {
  SUBCASE("balanced brackets") {
    const auto g = ebnf_grammar("root ::= pair*\npair ::= \"(\" root \")\" | \"[\" root \"]\"");
    int valid = 0;
    for (const auto& s : all_strings("()[]", 8)) {
      INFO("\"", s, "\"");
      CHECK(accepts(g, s) == balanced(s));
      valid += balanced(s);
    }
    CHECK(valid > 100);
  }
  SUBCASE("arithmetic expressions") {
    const auto g = ebnf_grammar(arithmetic_grammar);
    int valid = 0;
    for (const auto& s : all_strings("1+*()-", 6)) {
      INFO("\"", s, "\"");
      CHECK(accepts(g, s) == arithmetic::valid(s));
      valid += arithmetic::valid(s);
    }
    CHECK(valid > 100);
    CHECK(accepts(g, "(12+-3)*4-(((5)))"));
  }
  SUBCASE("JSON against nlohmann-json's parser") {
    const auto g = ebnf_grammar(json_grammar);
    for (const std::string alphabet : {"[]{}\":,1 ", "\"-0.1e\\n"}) {
      int valid = 0;
      for (const auto& s : all_strings(alphabet, 5)) {
        const bool ok = nlohmann::json::accept(s);
        INFO("\"", s, "\"");
        CHECK(accepts(g, s) == ok);
        valid += ok;
      }
      CHECK(valid > 20);
    }
    for (const std::string s : {R"g({"a": [1, -2.5e+3, true, null], "b\u00e9\n": {"c": "d"}})g", " [ ] ", "\"é😀\"",
                                "[1,]", "{\"a\" 1}", "01", "\"\\x\"", "[\"\x01\"]"}) {
      INFO(s);
      CHECK(accepts(g, s) == nlohmann::json::accept(s));
    }
  }
}

TEST_CASE("grammar ebnf: right recursion does not deepen the stack; nesting is limited to 256 levels") {
  const auto g = ebnf_grammar(R"g(root ::= "(" root ")" root | "")g");
  std::string seq;
  for (int i = 0; i < 2000; ++i) seq += "()";
  CHECK(accepts(g, seq));
  const auto nested = [](int n) { return std::string(static_cast<std::size_t>(n), '(') + std::string(static_cast<std::size_t>(n), ')'); };
  CHECK(accepts(g, nested(200)));
  CHECK_FALSE(accepts(g, nested(300)));
}

TEST_CASE("grammar ebnf: masks equal trying every token of the DeepSeek-V4 vocabulary") {
  struct example {
    const char* grammar;
    std::string text;
  };
  for (const auto& [grammar, text] : std::vector<example>{
           {json_grammar, " {\"name\": \"Ada \\\"L\\\"\", \"tags\": [\"math\", 1.5e3, -0],\n  \"ok\": true, \"x\": null} "},
           {arithmetic_grammar, "(12+-345)*6-((7))*89+(1024*-(3-4))-5*(6+7*(8-9))"}}) {
    check_masks_along(ebnf_grammar(grammar), text);
  }
}

TEST_CASE("grammar ebnf: errors name the line, the column and what was expected") {
  struct example {
    std::string grammar;
    std::size_t line, column;
    std::string message;  // a part of it
  };
  const std::vector<example> cases{
      {"root ::= \"a\"\nroot ::= \"b\"", 2, 1, "rule 'root' is defined twice (first at line 1, column 1)"},
      {"root ::= \"a\" thing", 1, 14, "undefined rule 'thing'"},
      {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", 2, 1, "rule 'expr' is left-recursive"},
      {"root ::= a\na ::= b? \"x\"\nb ::= \"y\"? a", 2, 1, "left-recursive"},  // through a nullable prefix
      {"root ::= \"a\" root", 1, 1, "rule 'root' matches no string"},
      {"root ::= \"a\" | loop\nloop ::= \"b\" loop", 2, 1, "rule 'loop' matches no string"},
      {"root: \"a\"", 1, 5, "expected '::=' after the rule name 'root' (Lark's 'name: ...' syntax is not accepted)"},
      {"root ::= (\"a\" | \"b\"", 1, 20, "expected ')' to close the '(' at line 1, column 10"},
      {"root ::= \"a\")", 1, 13, "unbalanced ')'"},
      {"root ::= \"ab", 1, 10, "unterminated string"},
      {"root ::= \"a\nb\"", 1, 12, "a string cannot span lines"},
      {"root ::= [a-", 1, 10, "unterminated character class"},
      {"root ::= [z-a]", 1, 11, "range out of order"},
      {"\n\nroot ::= \"\\q\"", 3, 11, "unknown escape '\\q'"},
      {"root ::= \"\\u12\"", 1, 11, "expected 4 hex digits"},
      {"root ::= \"\\uD800\"", 1, 11, "not a Unicode scalar value"},
      {"root ::= \"a\"{3,1}", 1, 13, "n < m"},
      {"root ::= \"a\"{1001}", 1, 13, "repetition bound above 1000"},
      {"root ::= \"a\"{x}", 1, 14, "expected a number"},
      {"root ::= \"a\"**", 1, 14, "cannot follow another repetition"},
      {"root ::= * \"a\"", 1, 10, "nothing to repeat"},
      {"root ::= /[a-z]+/", 1, 10, "regex terminals /.../ (Lark) are not supported"},
      {"root ::= 'a'", 1, 10, "double quotes"},
      {"root ::= (= \"a\") \"a\"", 1, 10, "lookahead assertions"},
      {"%import common.NUMBER\nroot ::= \"a\"", 1, 1, "Lark directives"},
      {"root ::= \"a\" ;", 1, 14, "unexpected ';': expected a string \"...\", a character class [...], '.', '(' or a rule name"},
      {"3root ::= \"a\"", 1, 1, "unexpected '3': expected a rule name"},
      {"root ::= [ab]* \"a\" [ab]{20}", 1, 1, "rule 'root': rule root needs more than 4096 automaton states"},
      {"root ::= ((\"\"{1000}){1000}){1000}", 1, 1, "too large"},
      {"root ::= \"\xff\"", 1, 11, "invalid UTF-8"},
  };
  for (const auto& c : cases) {
    const auto r = gr::compile_ebnf(c.grammar);
    const auto* e = std::get_if<gr::ebnf_error>(&r);
    REQUIRE_MESSAGE(e != nullptr, c.grammar);
    INFO(c.grammar, " -> ", e->to_string());
    CHECK(e->line == c.line);
    CHECK(e->column == c.column);
    CHECK(e->message.find(c.message) != std::string::npos);
    CHECK(e->to_string() == "line " + std::to_string(c.line) + ", column " + std::to_string(c.column) + ": " + e->message);
  }
  // Errors about the grammar as a whole have no position.
  for (const auto& [grammar, message] : std::vector<std::pair<std::string, std::string>>{
           {"", "the grammar defines no rule"},
           {"  # only a comment\n", "the grammar defines no rule"},
           {"start ::= \"a\"", "the grammar has no rule named 'root' (the start rule)"}}) {
    const auto r = gr::compile_ebnf(grammar);
    const auto* e = std::get_if<gr::ebnf_error>(&r);
    REQUIRE(e != nullptr);
    CHECK(e->line == 0);
    CHECK(e->to_string() == message);
  }
  // Another start rule may be named.
  CHECK(std::holds_alternative<gr::grammar>(gr::compile_ebnf("start ::= \"a\"", "start")));
}

TEST_CASE("grammar ebnf: rules the start rule does not reach are checked but not compiled") {
  const auto r = gr::compile_ebnf("root ::= \"a\"\nunused ::= \"b\" root");
  REQUIRE(std::holds_alternative<gr::grammar>(r));
  CHECK(std::get<gr::grammar>(r).rules.size() == 1);
  const auto bad = gr::compile_ebnf("root ::= \"a\"\nunused ::= missing");
  REQUIRE(std::holds_alternative<gr::ebnf_error>(bad));
  CHECK(std::get<gr::ebnf_error>(bad).message == "undefined rule 'missing'");
}

TEST_CASE("grammar ebnf: strings and classes are Unicode code points encoded as UTF-8") {
  const auto g = ebnf_grammar(R"g(root ::= [α-ω]+ "\u00e9" "\U0001F600"? [^a] .)g");
  CHECK(accepts(g, "αβé😀xy"));
  CHECK(accepts(g, "ωé😀😀"));
  CHECK(accepts(g, "αé\n\n"));  // `.` is any code point, newline included
  CHECK_FALSE(accepts(g, "αéay"));
  CHECK_FALSE(accepts(g, "αé\xce"));  // half a code point
}
