// EBNF (GBNF) grammars to the grammar representation (ebnf.hpp).
#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/decimal.hpp"

#include <optional>
#include <vector>

#include "recipe/grammar/ebnf_syntax.hpp"
#include "recipe/tokenizer.hpp"

namespace troupe::recipe::grammar {

std::string ebnf_error::to_string() const {
  if (line == 0) return message;
  return "line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + message;
}

namespace {

using syntax::failure;
using syntax::node;
using syntax::rule_def;
using syntax::unbounded;
constexpr int max_nesting = syntax::max_nesting;

bool name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

class parser : public syntax::scanner {
 public:
  parser(std::string_view t, const limits& lim) : scanner(t), lim_(lim) {}

  std::vector<rule_def> parse_all() {
    std::vector<rule_def> rules;
    skip();
    while (!eof()) {
      if (!name_start(peek())) {
        if (peek() == '%') fail("Lark directives (%import, %ignore, ...) are not supported: expected a rule name");
        if (peek() == '?' || peek() == '!') fail("Lark rule modifiers are not supported: expected a rule name");
        fail("unexpected " + describe(pos_) + ": expected a rule name");
      }
      rule_def r;
      r.at = pos_;
      r.name = name();
      skip();
      if (t_.substr(pos_, 3) != "::=") {
        if (!eof() && peek() == ':')
          fail("expected '::=' after the rule name '" + r.name + "' (Lark's 'name: ...' syntax is not accepted)");
        fail("unexpected " + describe(pos_) + ": expected '::=' after the rule name '" + r.name + "'");
      }
      pos_ += 3;
      r.body = alternation(0);
      skip();
      if (!eof() && !at_rule_start()) {
        if (peek() == ')') fail("unbalanced ')'");
        fail("unexpected " + describe(pos_) + ": expected a rule 'name ::= ...'");
      }
      rules.push_back(std::move(r));
    }
    return rules;
  }

 private:
  std::size_t skip_from(std::size_t p) const {
    while (p < t_.size()) {
      const char c = t_[p];
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++p;
      } else if (c == '#') {
        while (p < t_.size() && t_[p] != '\n') ++p;
      } else {
        break;
      }
    }
    return p;
  }
  void skip() { pos_ = skip_from(pos_); }

  std::string name() {
    const std::size_t start = pos_;
    while (!eof() && name_char(peek())) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  // At `name ::=`: the next rule starts here, so the current body ends.
  bool at_rule_start() const {
    if (eof() || !name_start(peek())) return false;
    std::size_t p = pos_;
    while (p < t_.size() && name_char(t_[p])) ++p;
    p = skip_from(p);
    return t_.substr(p, 3) == "::=";
  }

  node alternation(int depth) {
    if (depth > max_nesting) fail("parentheses nested more than " + std::to_string(max_nesting) + " levels deep");
    node n;
    n.k = node::kind::alt;
    n.kids.push_back(sequence(depth));
    while (!eof() && peek() == '|') {
      ++pos_;
      n.kids.push_back(sequence(depth));
    }
    if (n.kids.size() == 1) return std::move(n.kids[0]);
    return n;
  }

  node sequence(int depth) {
    node n;
    n.k = node::kind::seq;
    while (true) {
      skip();
      if (eof() || peek() == '|' || peek() == ')' || at_rule_start()) break;
      n.kids.push_back(quantified(depth));
    }
    return n;
  }

  static bool quantifier_char(char c) { return c == '*' || c == '+' || c == '?' || c == '{'; }

  std::optional<std::uint32_t> number() { return detail::read_decimal(t_, pos_); }

  node quantified(int depth) {
    node a = primary(depth);
    const std::size_t q = skip_from(pos_);
    if (q >= t_.size() || !quantifier_char(t_[q])) return a;
    pos_ = q;
    std::uint32_t lo = 0, hi = 0;
    switch (peek()) {
      case '*': lo = 0, hi = unbounded, ++pos_; break;
      case '+': lo = 1, hi = unbounded, ++pos_; break;
      case '?': lo = 0, hi = 1, ++pos_; break;
      default: {  // {m} {m,} {m,n} {,n}
        ++pos_;
        skip();
        const auto m = number();
        skip();
        if (!eof() && peek() == ',') {
          ++pos_;
          skip();
          const auto n = number();
          if (!m && !n) fail("expected a number in '{m,n}'");
          lo = m.value_or(0);
          hi = n.value_or(unbounded);
        } else {
          if (!m) fail("expected a number in '{m,n}'");
          lo = hi = *m;
        }
        skip();
        if (eof() || peek() != '}') fail("unexpected " + describe(pos_) + ": expected '}' to close the repetition");
        ++pos_;
        if (hi < lo) fail("repetition {m,n} with n < m", q);
        if (lo > lim_.max_repeat || (hi != unbounded && hi > lim_.max_repeat))
          fail("repetition bound above " + std::to_string(lim_.max_repeat), q);
      }
    }
    const std::size_t after = skip_from(pos_);
    if (after < t_.size() && quantifier_char(t_[after]))
      fail("a repetition cannot follow another repetition (put the operand in parentheses)", after);
    node r;
    r.k = node::kind::repeat;
    r.min = lo;
    r.max = hi;
    r.kids.push_back(std::move(a));
    return r;
  }

  node primary(int depth) {
    const std::size_t at = pos_;
    const char c = peek();
    if (c == '"') return literal();
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      node n;
      n.k = node::kind::set;
      n.set = any_code_point();
      return n;
    }
    if (c == '(') {
      ++pos_;
      if (!eof() && (peek() == '=' || peek() == '!'))
        fail("lookahead assertions '(= ...)' are not supported", at);
      node n = alternation(depth + 1);
      skip();
      if (eof() || peek() != ')') {
        const auto [line, col] = line_column(at);
        fail("unexpected " + describe(pos_) + ": expected ')' to close the '(' at line " + std::to_string(line) +
             ", column " + std::to_string(col));
      }
      ++pos_;
      return n;
    }
    if (name_start(c)) {
      node n;
      n.k = node::kind::ref;
      n.at = pos_;
      n.text = name();
      return n;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("nothing to repeat before '" + std::string(1, c) + "'");
    if (c == '/') fail("regex terminals /.../ (Lark) are not supported: write a character class, a string or a rule");
    if (c == '\'') fail("strings are written in double quotes \"...\"");
    fail("unexpected " + describe(at) + ": expected a string \"...\", a character class [...], '.', '(' or a rule name");
  }

  node literal() {
    const std::size_t at = pos_;
    ++pos_;
    node n;
    n.k = node::kind::literal;
    while (true) {
      if (eof()) fail("unterminated string (missing '\"')", at);
      const char c = peek();
      if (c == '"') break;
      if (c == '\n') fail("a string cannot span lines (write \\n)");
      recipe::append_utf8(n.text, c == '\\' ? gbnf_escape() : code_point());
    }
    ++pos_;
    return n;
  }

  node char_class() {
    const std::size_t at = pos_;
    ++pos_;
    bool negate = false;
    if (!eof() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    code_point_ranges r;
    auto item = [&]() -> std::uint32_t {
      if (eof()) fail("unterminated character class (missing ']')", at);
      if (peek() == '\n') fail("a character class cannot span lines (write \\n)");
      return peek() == '\\' ? gbnf_escape() : code_point();
    };
    while (true) {
      if (eof()) fail("unterminated character class (missing ']')", at);
      if (peek() == ']') break;
      const std::size_t item_at = pos_;
      const std::uint32_t lo = item();
      if (pos_ + 1 < t_.size() && peek() == '-' && t_[pos_ + 1] != ']') {
        ++pos_;
        const std::uint32_t hi = item();
        if (hi < lo) fail("range out of order in the character class", item_at);
        r.emplace_back(lo, hi);
      } else {
        r.emplace_back(lo, lo);
      }
    }
    ++pos_;
    node n;
    n.k = node::kind::set;
    n.set = negate ? complement_code_points(r) : normalize_code_points(r);
    return n;
  }

  // GBNF's escapes: the common ones, \v, \0 and a backslash before any ASCII punctuation.
  std::uint32_t gbnf_escape() { return escape("v0", true, {}); }

  const limits& lim_;
};

}  // namespace

std::variant<grammar, ebnf_error> compile_ebnf(std::string_view text, std::string_view root_rule, const limits& lim) {
  parser p(text, lim);
  std::vector<rule_def> defs;
  try {
    defs = p.parse_all();
  } catch (const failure& f) {
    return p.error_at(f.message, f.at);
  }
  return syntax::compile_rules(defs, root_rule, p, lim,
                               [](std::string_view name) { return "rule '" + std::string(name) + "'"; },
                               "write 'a ::= a \"+\" b | b' as 'a ::= b (\"+\" b)*'");
}

}  // namespace troupe::recipe::grammar
