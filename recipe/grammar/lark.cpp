// Lark grammars to the grammar representation (lark.hpp).
#include "recipe/grammar/lark.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "recipe/grammar/decimal.hpp"
#include "recipe/grammar/ebnf_syntax.hpp"
#include "recipe/grammar/regex.hpp"
#include "recipe/tokenizer.hpp"

namespace troupe::recipe::grammar {

namespace {

using syntax::failure;
using syntax::node;
using syntax::rule_def;
using syntax::unbounded;

// Lark's common.lark terminals, as patterns written here from what each one matches (Python's
// `re` reading, lark_regex). ESCAPED_STRING and C_COMMENT end at the first unescaped `"` / the
// first `*/`, as Lark's lazy patterns do.
const std::map<std::string, std::string, std::less<>>& common_terminals() {
  static const std::map<std::string, std::string, std::less<>> m{
      {"DIGIT", "[0-9]"},
      {"HEXDIGIT", "[0-9a-fA-F]"},
      {"INT", "[0-9]+"},
      {"SIGNED_INT", "[+-]?[0-9]+"},
      {"DECIMAL", "[0-9]+\\.[0-9]*|\\.[0-9]+"},
      {"FLOAT", "[0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?"},
      {"SIGNED_FLOAT", "[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?)"},
      {"NUMBER", "[0-9]+([eE][+-]?[0-9]+)?|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?"},
      {"SIGNED_NUMBER", "[+-]?([0-9]+([eE][+-]?[0-9]+)?|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?)"},
      {"ESCAPED_STRING", "\"([^\"\\\\\\n]|\\\\[^\\n])*\""},
      {"LCASE_LETTER", "[a-z]"},
      {"UCASE_LETTER", "[A-Z]"},
      {"LETTER", "[a-zA-Z]"},
      {"WORD", "[a-zA-Z]+"},
      {"CNAME", "[_a-zA-Z][_a-zA-Z0-9]*"},
      {"WS_INLINE", "[ \\t]+"},
      {"WS", "[ \\t\\f\\r\\n]+"},
      {"CR", "\\r"},
      {"LF", "\\n"},
      {"NEWLINE", "(\\r?\\n)+"},
      {"SH_COMMENT", "#[^\\n]*"},
      {"CPP_COMMENT", "//[^\\n]*"},
      {"C_COMMENT", "/\\*([^*]|\\*+[^*/])*\\*+/"},
      {"SQL_COMMENT", "--[^\\n]*"},
  };
  return m;
}

bool lower(char c) { return c >= 'a' && c <= 'z'; }
bool upper(char c) { return c >= 'A' && c <= 'Z'; }
bool digit(char c) { return c >= '0' && c <= '9'; }
bool name_char(char c) { return lower(c) || upper(c) || digit(c) || c == '_'; }

// Terminal names are uppercase (`_?[A-Z][_A-Z0-9]*`), rule names lowercase; the synthetic rules
// ("%...") are neither.
bool is_terminal(std::string_view name) {
  for (const char c : name)
    if (upper(c) || lower(c)) return upper(c);
  return false;
}

node make(node::kind k) {
  node n;
  n.k = k;
  return n;
}

node ref(std::string name, std::size_t at) {
  node n = make(node::kind::ref);
  n.text = std::move(name);
  n.at = at;
  return n;
}

constexpr std::string_view ignore_rule = "%ignore";  // the %ignore'd terminals, repeated
constexpr std::string_view start_rule_name = "%start";  // %ignore, the start rule, %ignore

class parser : public syntax::scanner {
 public:
  parser(std::string_view t, const limits& lim) : scanner(t), lim_(lim) {}

  std::vector<rule_def> defs;
  std::vector<node> ignored;  // each %ignore's expansion
  std::size_t first_ignore_at = 0;

  void parse_all() {
    while (true) {
      skip_all();
      if (eof()) break;
      if (peek() == '%')
        directive();
      else
        definition();
      skip_inline();
      if (!eof() && peek() != '\n') {
        if (peek() == ')' || peek() == ']') fail("unbalanced '" + std::string(1, peek()) + "'");
        fail("unexpected " + describe(pos_) + ": expected the end of the line");
      }
    }
  }

 private:
  // Spaces, tabs, carriage returns and comments, up to the end of the line.
  std::size_t skip_inline_from(std::size_t p) const {
    while (p < t_.size()) {
      const char c = t_[p];
      if (c == ' ' || c == '\t' || c == '\r') {
        ++p;
      } else if (c == '#' || (c == '/' && p + 1 < t_.size() && t_[p + 1] == '/')) {
        while (p < t_.size() && t_[p] != '\n') ++p;
      } else {
        break;
      }
    }
    return p;
  }
  void skip_inline() { pos_ = skip_inline_from(pos_); }
  std::size_t skip_all_from(std::size_t p) const {
    while (true) {
      p = skip_inline_from(p);
      if (p >= t_.size() || t_[p] != '\n') return p;
      ++p;
    }
  }
  void skip_all() { pos_ = skip_all_from(pos_); }

  std::string name() {
    const std::size_t start = pos_;
    while (!eof() && name_char(peek())) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  // A rule or terminal name as Lark spells it: lowercase or uppercase, not mixed.
  std::string checked_name(std::size_t at) {
    std::string n = name();
    if (n.empty()) fail("unexpected " + describe(at) + ": expected a rule or terminal name", at);
    bool has_lower = false, has_upper = false;
    for (const char c : n) has_lower |= lower(c), has_upper |= upper(c);
    if (digit(n[0]) || (!has_lower && !has_upper))
      fail("'" + n + "' is not a name: names start with a letter or '_'", at);
    if (has_lower && has_upper)
      fail("'" + n + "' mixes cases: rule names are lowercase, terminal names uppercase", at);
    return n;
  }

  void definition() {
    const std::size_t at = pos_;
    bool modifier = false;
    if (peek() == '?' || peek() == '!') {  // inline / keep tokens: shapes of Lark's tree only
      ++pos_;
      modifier = true;
    }
    const std::size_t name_at = pos_;
    rule_def d;
    d.name = checked_name(name_at);
    d.at = at;
    terminal_ = is_terminal(d.name);
    if (modifier && terminal_) fail("a terminal takes no '?' or '!' modifier", at);
    if (!eof() && peek() == '{') fail("templates ('" + d.name + "{...}') are not supported");
    skip_inline();
    if (!eof() && peek() == '.') {  // a priority: it orders Lark's lexer or parser, not the language
      ++pos_;
      if (!eof() && (peek() == '-' || peek() == '+')) ++pos_;
      if (!detail::read_decimal(t_, pos_)) fail("expected a number after '.' (a priority)");
      skip_inline();
    }
    if (t_.substr(pos_, 3) == "::=")
      fail("expected ':' after the name '" + d.name + "' ('::=' is GBNF: send \"syntax\": \"gbnf\")");
    if (eof() || peek() != ':')
      fail("unexpected " + describe(pos_) + ": expected ':' after the name '" + d.name + "'");
    ++pos_;
    d.body = expansions(0);
    defs.push_back(std::move(d));
  }

  void directive() {
    const std::size_t at = pos_;
    ++pos_;
    const std::string word = name();
    if (word == "ignore") {
      terminal_ = true;
      if (ignored.empty()) first_ignore_at = at;
      skip_inline();
      if (eof() || peek() == '\n') fail("expected a terminal after %ignore");
      ignored.push_back(expansions(0));
      return;
    }
    if (word == "import") {
      import();
      return;
    }
    if (word == "declare")
      fail("%declare is not supported: a declared terminal has no definition to constrain the output with", at);
    if (word == "override" || word == "extend")
      fail("%" + word + " is not supported (it changes imported grammars; only common terminals can be imported)", at);
    fail("unknown directive '%" + word + "': expected %import or %ignore", at);
  }

  void import() {
    skip_inline();
    const std::size_t path_at = pos_;
    if (eof() || !name_char(peek()) || name() != "common")
      fail("only Lark's common terminals can be imported ('%import common.NAME'): other modules and files are "
           "not available",
           path_at);
    std::vector<std::pair<std::string, std::size_t>> names;  // imported name, offset
    if (!eof() && peek() == '.') {
      ++pos_;
      const std::size_t n_at = pos_;
      names.emplace_back(name(), n_at);
      if (!eof() && peek() == '.') fail("only Lark's common terminals can be imported ('%import common.NAME')", path_at);
      skip_inline();
      if (t_.substr(pos_, 2) == "->") {
        pos_ += 2;
        skip_inline();
        const std::size_t alias_at = pos_;
        const std::string alias = checked_name(alias_at);
        if (!is_terminal(alias)) fail("the common terminal '" + names[0].first + "' must be imported as a terminal (an uppercase name)", alias_at);
        add_import(names[0].first, names[0].second, alias);
        return;
      }
    } else {
      skip_inline();
      if (eof() || peek() != '(') fail("expected '.NAME' or '(NAME, ...)' after '%import common'");
      ++pos_;
      while (true) {
        skip_inline();
        const std::size_t n_at = pos_;
        names.emplace_back(name(), n_at);
        skip_inline();
        if (!eof() && peek() == ',') {
          ++pos_;
          continue;
        }
        if (eof() || peek() != ')') fail("unexpected " + describe(pos_) + ": expected ',' or ')' in the import list");
        ++pos_;
        break;
      }
    }
    for (const auto& [n, n_at] : names) add_import(n, n_at, n);
  }

  void add_import(const std::string& name, std::size_t at, const std::string& as) {
    const auto it = common_terminals().find(name);
    if (it == common_terminals().end()) {
      std::string known;
      for (const auto& [k, v] : common_terminals()) known += (known.empty() ? "" : ", ") + k;
      fail("'" + name + "' is not one of the common terminals supported: " + known, at);
    }
    if (!imported_.emplace(as, name).second) {
      if (imported_[as] == name) return;  // imported again: the same definition
      fail("'" + as + "' is imported twice as different terminals", at);
    }
    auto re = regex::parse_lark(it->second, {}, lim_);
    rule_def d;
    d.name = as;
    d.at = at;
    d.body = make(node::kind::pattern);
    d.body.re = std::make_shared<const regex>(std::move(std::get<regex>(re)));
    defs.push_back(std::move(d));
  }

  // Alternatives; a line that starts with `|` continues them.
  node expansions(int depth) {
    if (depth > syntax::max_nesting)
      fail("parentheses nested more than " + std::to_string(syntax::max_nesting) + " levels deep");
    node n = make(node::kind::alt);
    n.kids.push_back(alias(depth));
    while (true) {
      skip_inline();
      if (!eof() && peek() == '|') {
        ++pos_;
      } else if (!eof() && peek() == '\n' && skip_all_from(pos_) < t_.size() && t_[skip_all_from(pos_)] == '|') {
        pos_ = skip_all_from(pos_) + 1;
      } else {
        break;
      }
      n.kids.push_back(alias(depth));
    }
    if (n.kids.size() == 1) return std::move(n.kids[0]);
    return n;
  }

  // One alternative, perhaps with `-> alias` (a tree node name: ignored).
  node alias(int depth) {
    node n = sequence(depth);
    if (t_.substr(pos_, 2) == "->") {
      pos_ += 2;
      skip_inline();
      checked_name(pos_);
    }
    return n;
  }

  node sequence(int depth) {
    node n = make(node::kind::seq);
    while (true) {
      skip_inline();
      if (eof()) break;
      const char c = peek();
      if (c == '|' || c == ')' || c == ']' || c == '\n' || t_.substr(pos_, 2) == "->") break;
      n.kids.push_back(expr(depth));
    }
    if (n.kids.size() == 1) return std::move(n.kids[0]);
    return n;
  }

  static bool op_char(char c) { return c == '*' || c == '+' || c == '?' || c == '~'; }

  std::uint32_t bound(std::size_t at) {
    skip_inline();
    const auto v = detail::read_decimal(t_, pos_);
    if (!v) fail("expected a number after '~'");
    if (*v > lim_.max_repeat) fail("repetition bound above " + std::to_string(lim_.max_repeat), at);
    return *v;
  }

  node expr(int depth) {
    node a = atom(depth);
    skip_inline();
    if (eof() || !op_char(peek())) return a;
    const std::size_t at = pos_;
    node r = make(node::kind::repeat);
    switch (peek()) {
      case '*': r.min = 0, r.max = unbounded, ++pos_; break;
      case '+': r.min = 1, r.max = unbounded, ++pos_; break;
      case '?': r.min = 0, r.max = 1, ++pos_; break;
      default: {  // x~n, x~n..m
        ++pos_;
        r.min = r.max = bound(at);
        skip_inline();
        if (t_.substr(pos_, 2) == "..") {
          pos_ += 2;
          r.max = bound(at);
          if (r.max < r.min) fail("repetition ~n..m with m < n", at);
        }
      }
    }
    skip_inline();
    if (!eof() && op_char(peek()))
      fail("a repetition cannot follow another repetition (put the operand in parentheses)");
    r.kids.push_back(std::move(a));
    return r;
  }

  node atom(int depth) {
    const std::size_t at = pos_;
    const char c = peek();
    if (c == '(' || c == '[') {
      ++pos_;
      node n = expansions(depth + 1);
      skip_inline();
      const char close = c == '(' ? ')' : ']';
      if (eof() || peek() != close) {
        const auto [line, col] = line_column(at);
        fail("unexpected " + describe(pos_) + ": expected '" + std::string(1, close) + "' to close the '" +
             std::string(1, c) + "' at line " + std::to_string(line) + ", column " + std::to_string(col));
      }
      ++pos_;
      if (c == '(') return n;
      node opt = make(node::kind::repeat);
      opt.min = 0;
      opt.max = 1;
      opt.kids.push_back(std::move(n));
      return opt;
    }
    if (c == '"' || c == '\'') {
      const std::size_t first_at = pos_;
      auto [first, fold] = string_literal();
      const std::size_t after = skip_inline_from(pos_);
      if (t_.substr(after, 2) != "..") return literal_node(first, fold, first_at);
      pos_ = after + 2;
      skip_inline();
      const std::size_t second_at = pos_;
      if (eof() || (peek() != '"' && peek() != '\'')) fail("expected a string after '..' (a range \"a\"..\"z\")");
      auto [second, fold2] = string_literal();
      if (fold || fold2) fail("a range takes no 'i' flag", at);
      const auto lo = single_code_point(first, first_at), hi = single_code_point(second, second_at);
      if (hi < lo) fail("range out of order", at);
      node n = make(node::kind::set);
      n.set = normalize_code_points({{lo, hi}});
      return n;
    }
    if (c == '/') return pattern();
    if (name_char(c)) {
      const std::string n = checked_name(at);
      if (!eof() && peek() == '{') fail("templates ('" + n + "{...}') are not supported");
      if (terminal_ && !is_terminal(n))
        fail("a terminal cannot reference the rule '" + n + "' (terminals are regular: make this a rule)", at);
      return ref(n, at);
    }
    if (c == '<') fail("special tokens '<...>' (llguidance) are not supported");
    if (c == '*' || c == '+' || c == '?' || c == '~') fail("nothing to repeat before '" + std::string(1, c) + "'");
    if (c == '%') fail("a directive starts a line of its own");
    fail("unexpected " + describe(at) + ": expected a string \"...\", a regex /.../, a name, '(' or '['");
  }

  // "..." or '...', then an optional `i`: the UTF-8 text and whether it is case-insensitive.
  std::pair<std::string, bool> string_literal() {
    const std::size_t at = pos_;
    const char quote = peek();
    ++pos_;
    std::string text;
    while (true) {
      if (eof()) fail("unterminated string (missing " + std::string(1, quote) + ")", at);
      const char c = peek();
      if (c == quote) break;
      if (c == '\n') fail("a string cannot span lines (write \\n)");
      recipe::append_utf8(text, c == '\\' ? escape({}, false, quote == '"' ? "\\\"" : "\\'") : code_point());
    }
    ++pos_;
    const bool fold = !eof() && peek() == 'i' && (pos_ + 1 >= t_.size() || !name_char(t_[pos_ + 1]));
    if (fold) ++pos_;
    return {std::move(text), fold};
  }

  std::uint32_t single_code_point(const std::string& s, std::size_t at) {
    const auto c = static_cast<unsigned char>(s.empty() ? 0 : s[0]);
    const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    if (s.empty() || s.size() != len) fail("a range's ends are single characters", at);
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (std::size_t i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3f);
    return cp;
  }

  // A literal; with `i`, a sequence of one class per character (ASCII letters in both cases).
  node literal_node(const std::string& text, bool fold, std::size_t at) {
    node n = make(node::kind::literal);
    n.text = text;
    if (!fold) return n;
    node s = make(node::kind::seq);
    for (const char c : text) {
      if (static_cast<unsigned char>(c) >= 0x80)
        fail("the 'i' flag applies to ASCII letters only here: a non-ASCII character in a case-insensitive "
             "string is not supported",
             at);
      node k = make(node::kind::set);
      const auto u = static_cast<std::uint32_t>(static_cast<unsigned char>(c));
      k.set = {{u, u}};
      if (lower(c) || upper(c)) k.set = normalize_code_points({{u, u}, {u ^ 0x20, u ^ 0x20}});
      s.kids.push_back(std::move(k));
    }
    return s;
  }

  // /pattern/flags (a `\/` inside is a slash).
  node pattern() {
    const std::size_t at = pos_;
    ++pos_;
    const std::size_t body = pos_;
    while (true) {
      if (eof()) fail("unterminated regex (missing '/')", at);
      if (peek() == '\n') fail("a regex cannot span lines");
      if (peek() == '/') break;
      if (peek() == '\\' && pos_ + 1 < t_.size() && t_[pos_ + 1] != '\n') ++pos_;
      ++pos_;
    }
    const std::string_view text = t_.substr(body, pos_ - body);
    ++pos_;
    lark_regex flags;
    while (!eof() && lower(peek())) {
      switch (peek()) {
        case 'i': flags.ignore_case = true; break;
        case 's': flags.dot_all = true; break;
        case 'm':  // multiline: only changes anchors, which a terminal cannot hold
        case 'u': break;  // Unicode: Python 3's default
        default:
          fail("regex flag '" + std::string(1, peek()) + "' is not supported (supported: i, s; m and u change nothing here)");
      }
      ++pos_;
    }
    auto re = regex::parse_lark(text, flags, lim_);
    if (auto* e = std::get_if<regex_error>(&re)) fail("in the regex: " + e->message, body + e->offset);
    node n = make(node::kind::pattern);
    n.re = std::make_shared<const regex>(std::move(std::get<regex>(re)));
    return n;
  }

  const limits& lim_;
  bool terminal_ = false;  // parsing a terminal's body (or an %ignore)
  std::map<std::string, std::string> imported_;  // name -> the common terminal it is
};

// Inserts `%ignore` between the elements of a rule body and between repetitions.
void interleave_ignored(node& n) {
  switch (n.k) {
    case node::kind::seq: {
      std::vector<node> kids;
      for (auto& k : n.kids) {
        interleave_ignored(k);
        if (!kids.empty()) kids.push_back(ref(std::string(ignore_rule), 0));
        kids.push_back(std::move(k));
      }
      n.kids = std::move(kids);
      return;
    }
    case node::kind::alt:
      for (auto& k : n.kids) interleave_ignored(k);
      return;
    case node::kind::repeat:
      interleave_ignored(n.kids[0]);
      n.kids.push_back(ref(std::string(ignore_rule), 0));
      return;
    default: return;
  }
}

}  // namespace

std::variant<grammar, ebnf_error> compile_lark(std::string_view text, std::string_view start_rule, const limits& lim) {
  parser p(text, lim);
  try {
    p.parse_all();
  } catch (const failure& f) {
    return p.error_at(f.message, f.at);
  }
  std::vector<rule_def>& defs = p.defs;

  // Terminals are regular in Lark: one that reaches itself is refused (a cycle of terminal
  // references; they reference no rules, the parser checked).
  std::map<std::string, const rule_def*> terminals;
  for (const auto& d : defs)
    if (is_terminal(d.name)) terminals.emplace(d.name, &d);
  std::map<std::string, int> state;  // 1: on the path, 2: done
  std::function<const rule_def*(const rule_def&)> cycle = [&](const rule_def& d) -> const rule_def* {
    state[d.name] = 1;
    std::vector<const node*> stack{&d.body};
    while (!stack.empty()) {
      const node* n = stack.back();
      stack.pop_back();
      for (const auto& k : n->kids) stack.push_back(&k);
      if (n->k != node::kind::ref) continue;
      const auto it = terminals.find(n->text);
      if (it == terminals.end()) continue;  // undefined: compile_rules says so
      if (state[n->text] == 1) return it->second;
      if (state[n->text] == 0)
        if (const auto* c = cycle(*it->second)) return c;
    }
    state[d.name] = 2;
    return nullptr;
  };
  for (const auto& [name, d] : terminals)
    if (state[name] == 0)
      if (const auto* c = cycle(*d))
        return p.error_at("terminal '" + c->name + "' is recursive: terminals are regular in Lark (write the recursion in a rule)", c->at);

  std::string root(start_rule);
  if (!p.ignored.empty()) {
    for (auto& d : defs)
      if (!is_terminal(d.name)) interleave_ignored(d.body);
    rule_def ig;
    ig.name = ignore_rule;
    ig.at = p.first_ignore_at;
    ig.body = make(node::kind::repeat);
    ig.body.min = 0;
    ig.body.max = unbounded;
    ig.body.kids.push_back(make(node::kind::alt));
    ig.body.kids[0].kids = std::move(p.ignored);
    defs.push_back(std::move(ig));
    rule_def s;
    s.name = start_rule_name;
    s.body = make(node::kind::seq);
    s.body.kids.push_back(ref(std::string(ignore_rule), 0));
    s.body.kids.push_back(ref(root, 0));
    s.body.kids.push_back(ref(std::string(ignore_rule), 0));
    for (const auto& d : defs)
      if (d.name == root) s.at = d.at;
    const bool has_root = std::any_of(defs.begin(), defs.end(), [&](const rule_def& d) { return d.name == root; });
    if (!has_root) return ebnf_error{"the grammar has no rule named '" + root + "' (the start rule)", 0, 0};
    defs.push_back(std::move(s));
    root = start_rule_name;
  }
  const std::string start(start_rule);
  return syntax::compile_rules(
      defs, root, p, lim,
      [start](std::string_view name) {
        if (name == ignore_rule) return std::string("the %ignore terminals");
        if (name == start_rule_name) return "rule '" + start + "'";
        return (is_terminal(name) ? "terminal '" : "rule '") + std::string(name) + "'";
      },
      "write 'a: a \"+\" b | b' as 'a: b (\"+\" b)*'");
}

bool looks_like_lark(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"' || c == '\'') {  // a string literal, to its end or the end of the line
      for (++i; i < text.size() && text[i] != c && text[i] != '\n'; ++i)
        if (text[i] == '\\') ++i;
      ++i;
    } else if (c == '#' || (c == '/' && i + 1 < text.size() && text[i + 1] == '/')) {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (text.substr(i, 3) == "::=") {
      return false;
    } else {
      ++i;
    }
  }
  return true;
}

}  // namespace troupe::recipe::grammar
