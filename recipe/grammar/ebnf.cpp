// EBNF (GBNF) grammars to the grammar representation (ebnf.hpp).
#include "recipe/grammar/ebnf.hpp"
#include "recipe/grammar/decimal.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "recipe/grammar/regex.hpp"

namespace troupe::recipe::grammar {

std::string ebnf_error::to_string() const {
  if (line == 0) return message;
  return "line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + message;
}

namespace {

constexpr std::uint32_t unbounded = 0xffffffffu;
constexpr int max_nesting = 100;              // parentheses
constexpr std::size_t max_nfa_states = 200000;  // per rule
constexpr std::uint64_t max_emit_steps = 2000000;

struct node {
  enum class kind { literal, set, ref, seq, alt, repeat } k = kind::seq;
  std::string text;        // literal: UTF-8 bytes; ref: the rule name
  code_point_ranges set;   // set
  std::size_t at = 0;      // ref: offset of the name
  std::uint32_t min = 0, max = 0;  // repeat
  std::vector<node> kids;
};

struct rule_def {
  std::string name;
  std::size_t at = 0;  // offset of the name
  node body;
};

struct failure {
  std::string message;
  std::size_t at;  // byte offset, or npos for the grammar as a whole
};

bool name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class parser {
 public:
  parser(std::string_view t, const limits& lim) : t_(t), lim_(lim) {}

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
  [[noreturn]] void fail(std::string msg, std::size_t at = std::string::npos) const {
    throw failure{std::move(msg), at == std::string::npos ? pos_ : at};
  }
  bool eof() const { return pos_ >= t_.size(); }
  char peek() const { return t_[pos_]; }

  std::string describe(std::size_t at) const {
    if (at >= t_.size()) return "end of the grammar";
    const auto c = static_cast<unsigned char>(t_[at]);
    if (c == '\n') return "end of line";
    if (c < 0x20 || c >= 0x7f) {
      static const char digits[] = "0123456789abcdef";
      return std::string("byte 0x") + digits[c >> 4] + digits[c & 15];
    }
    return std::string("'") + static_cast<char>(c) + "'";
  }

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

 public:
  std::pair<std::size_t, std::size_t> line_column(std::size_t at) const {
    std::size_t line = 1, col = 1;
    for (std::size_t i = 0; i < at && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return {line, col};
  }

 private:
  // One UTF-8 code point of the text (validated: no overlong forms, surrogates or values past
  // U+10FFFF).
  std::uint32_t code_point() {
    const std::size_t at = pos_;
    const auto c = static_cast<unsigned char>(t_[pos_]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + static_cast<std::size_t>(len) > t_.size()) fail("invalid UTF-8", at);
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int i = 1; i < len; ++i) {
      const auto d = static_cast<unsigned char>(t_[pos_ + static_cast<std::size_t>(i)]);
      if ((d & 0xc0) != 0x80) fail("invalid UTF-8", at);
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr std::uint32_t min_of_len[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_of_len[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) fail("invalid UTF-8", at);
    pos_ += static_cast<std::size_t>(len);
    return cp;
  }

  std::uint32_t hex(std::size_t digits, std::size_t at) {
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < digits; ++i) {
      const char h = eof() ? '\0' : peek();
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("expected " + std::to_string(digits) + " hex digits in the escape", at);
      v = v * 16 + static_cast<std::uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // At a backslash (in a string or a class).
  std::uint32_t escape() {
    const std::size_t at = pos_;
    ++pos_;
    if (eof()) fail("the grammar ends inside an escape", at);
    const char c = peek();
    ++pos_;
    std::uint32_t cp = 0;
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': cp = hex(2, at); break;
      case 'u': cp = hex(4, at); break;
      case 'U': cp = hex(8, at); break;
      default: {
        const auto u = static_cast<unsigned char>(c);
        if (u > 0x20 && u < 0x7f && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
          return u;
        pos_ = at + 1;
        fail("unknown escape '\\" + (u > 0x20 && u < 0x7f ? std::string(1, c) : describe(at + 1)) + "'", at);
      }
    }
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) fail("the escape is not a Unicode scalar value", at);
    return cp;
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
      append_utf8(n.text, c == '\\' ? escape() : code_point());
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
      return peek() == '\\' ? escape() : code_point();
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

  std::string_view t_;
  const limits& lim_;
  std::size_t pos_ = 0;
};

void collect_refs(const node& n, std::vector<const node*>& out) {
  if (n.k == node::kind::ref) out.push_back(&n);
  for (const auto& k : n.kids) collect_refs(k, out);
}

class emitter {
 public:
  // `ids`: the grammar rule of each called rule; `inlined`: the bodies of the rules emitted in
  // place instead of called.
  emitter(nfa_builder& b, const std::map<std::string, std::uint32_t>& ids,
          const std::map<std::string, const node*>& inlined)
      : b_(b), ids_(ids), inlined_(inlined) {}

  void emit(const node& n, std::uint32_t from, std::uint32_t to) {
    if (++steps_ > max_emit_steps || b_.size() > max_nfa_states) throw build_error{"the rule's automaton is too large"};
    switch (n.k) {
      case node::kind::literal: b_.literal(from, to, n.text); return;
      case node::kind::set: emit_code_points(b_, from, to, n.set, false); return;
      case node::kind::ref:
        if (const auto it = inlined_.find(n.text); it != inlined_.end())
          emit(*it->second, from, to);
        else
          b_.call(from, to, ids_.at(n.text));
        return;
      case node::kind::alt:
        for (const auto& k : n.kids) emit(k, from, to);
        return;
      case node::kind::seq: {
        if (n.kids.empty()) {
          b_.epsilon(from, to);
          return;
        }
        std::uint32_t cur = from;
        for (std::size_t i = 0; i < n.kids.size(); ++i) {
          const std::uint32_t nxt = i + 1 == n.kids.size() ? to : b_.add_state();
          emit(n.kids[i], cur, nxt);
          cur = nxt;
        }
        return;
      }
      case node::kind::repeat: {
        std::uint32_t cur = from;
        for (std::uint32_t i = 0; i < n.min; ++i) {
          const std::uint32_t nxt = b_.add_state();
          emit(n.kids[0], cur, nxt);
          cur = nxt;
        }
        if (n.max == unbounded) {
          const std::uint32_t loop = b_.add_state(), back = b_.add_state();
          b_.epsilon(cur, loop);
          emit(n.kids[0], loop, back);
          b_.epsilon(back, loop);
          b_.epsilon(loop, to);
          return;
        }
        for (std::uint32_t i = n.min; i < n.max; ++i) {
          b_.epsilon(cur, to);
          const std::uint32_t nxt = b_.add_state();
          emit(n.kids[0], cur, nxt);
          cur = nxt;
        }
        b_.epsilon(cur, to);
        return;
      }
    }
  }

 private:
  nfa_builder& b_;
  const std::map<std::string, std::uint32_t>& ids_;
  const std::map<std::string, const node*>& inlined_;
  std::uint64_t steps_ = 0;
};

}  // namespace

std::variant<grammar, ebnf_error> compile_ebnf(std::string_view text, std::string_view root_rule, const limits& lim) {
  parser p(text, lim);
  auto error_at = [&](std::string message, std::size_t at) {
    if (at == std::string::npos) return ebnf_error{std::move(message), 0, 0};
    const auto [line, col] = p.line_column(at);
    return ebnf_error{std::move(message), line, col};
  };
  std::vector<rule_def> defs;
  try {
    defs = p.parse_all();
  } catch (const failure& f) {
    return error_at(f.message, f.at);
  }
  if (defs.empty()) return ebnf_error{"the grammar defines no rule", 0, 0};

  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < defs.size(); ++i) {
    auto [it, inserted] = by_name.emplace(defs[i].name, i);
    if (!inserted) {
      const auto [line, col] = p.line_column(defs[it->second].at);
      return error_at("rule '" + defs[i].name + "' is defined twice (first at line " + std::to_string(line) +
                          ", column " + std::to_string(col) + ")",
                      defs[i].at);
    }
  }
  std::vector<std::vector<const node*>> refs(defs.size());
  for (std::size_t i = 0; i < defs.size(); ++i) {
    collect_refs(defs[i].body, refs[i]);
    for (const node* r : refs[i])
      if (!by_name.count(r->text)) return error_at("undefined rule '" + r->text + "'", r->at);
  }
  const auto root_it = by_name.find(std::string(root_rule));
  if (root_it == by_name.end())
    return ebnf_error{"the grammar has no rule named '" + std::string(root_rule) + "' (the start rule)", 0, 0};

  // Rules that reach no recursion and stay small are emitted in place of their references (a
  // `char` rule called per character would otherwise cost a call and a return per byte, and
  // make every mask inside a string walk below each return). Their size: nodes, inlined
  // references counted in full.
  constexpr std::size_t max_inlined_nodes = 4096;
  std::vector<std::size_t> size(defs.size(), 0);  // 0: not computed; npos: not inlinable
  std::vector<std::uint8_t> visiting(defs.size(), 0);
  auto count_nodes = [](const node& n, auto&& self) -> std::size_t {
    std::size_t c = 1;
    for (const auto& k : n.kids) c += self(k, self);
    return c;
  };
  auto inline_size = [&](std::size_t i, auto&& self) -> std::size_t {
    if (size[i]) return size[i];
    if (visiting[i]) return std::string::npos;  // on a cycle
    visiting[i] = 1;
    std::size_t total = count_nodes(defs[i].body, count_nodes);
    for (const node* r : refs[i]) {
      const std::size_t s = self(by_name.at(r->text), self);
      total = s == std::string::npos || total + s > max_inlined_nodes ? std::string::npos : total + s;
      if (total == std::string::npos) break;
    }
    visiting[i] = 0;
    size[i] = total > max_inlined_nodes ? std::string::npos : total;
    return size[i];
  };
  std::map<std::string, const node*> inlined;
  for (std::size_t i = 0; i < defs.size(); ++i)
    if (i != root_it->second && inline_size(i, inline_size) != std::string::npos) inlined.emplace(defs[i].name, &defs[i].body);

  // The start rule and the rules it calls (not inlined) get grammar rule ids, in the order they
  // are reached; an inlined rule's references are inlined too.
  std::vector<std::size_t> order{root_it->second};
  std::map<std::string, std::uint32_t> ids{{defs[root_it->second].name, 0}};
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const node* r : refs[order[i]])
      if (!inlined.count(r->text) && ids.emplace(r->text, static_cast<std::uint32_t>(order.size())).second)
        order.push_back(by_name.at(r->text));

  grammar g;
  g.root = 0;
  g.rules.resize(order.size());
  std::size_t total = 0;
  for (std::size_t id = 0; id < order.size(); ++id) {
    const rule_def& d = defs[order[id]];
    try {
      nfa_builder b;
      const auto s = b.add_state(), a = b.add_state();
      emitter(b, ids, inlined).emit(d.body, s, a);
      g.rules[id] = b.determinize(s, a, d.name, lim);
    } catch (const build_error& e) {
      return error_at("rule '" + d.name + "': " + e.message, d.at);
    }
    total += g.rules[id].size();
    if (total > lim.max_total_states)
      return error_at("the grammar needs more than " + std::to_string(lim.max_total_states) +
                          " automaton states (at rule '" + d.name + "')",
                      d.at);
  }
  if (const auto r = left_recursive_rule(g); !r.empty())
    return error_at("rule '" + r + "' is left-recursive: it can reach itself without consuming any output (write "
                    "'a ::= a \"+\" b | b' as 'a ::= b (\"+\" b)*')",
                    defs[by_name.at(r)].at);
  const bool root_ok = prune(g);
  for (std::size_t id = 0; id < order.size(); ++id) {
    const rule& r = g.rules[id];
    if (!r.accepting[0] && !r.has_bytes[0] && r.calls[0].empty())
      return error_at("rule '" + r.name + "' matches no string (every alternative needs the rule itself, or a rule "
                      "that matches nothing, again)",
                      defs[order[id]].at);
  }
  if (!root_ok) return error_at("the grammar matches no string", defs[root_it->second].at);
  return g;
}

}  // namespace troupe::recipe::grammar
