// Regular expressions to automata (regex.hpp).
#include "recipe/grammar/regex.hpp"
#include "recipe/grammar/decimal.hpp"

#include <algorithm>
#include <optional>

namespace troupe::recipe::grammar {

struct regex::node {
  enum class kind { set, concat, alt, repeat, start_anchor, end_anchor } k = kind::set;
  code_point_ranges set;
  std::vector<std::unique_ptr<node>> kids;
  std::uint32_t min = 0, max = 0;  // repeat; max == unbounded for no upper bound
  static constexpr std::uint32_t unbounded = 0xffffffffu;
};

code_point_ranges normalize_code_points(code_point_ranges r) {
  std::sort(r.begin(), r.end());
  code_point_ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.emplace_back(lo, hi);
  }
  // Surrogates cannot be encoded in UTF-8.
  code_point_ranges res;
  for (auto [lo, hi] : out) {
    if (hi < 0xd800 || lo > 0xdfff) {
      res.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xd800) res.emplace_back(lo, 0xd7ff);
    if (hi > 0xdfff) res.emplace_back(0xe000, hi);
  }
  return res;
}

code_point_ranges complement_code_points(const code_point_ranges& r) {
  code_point_ranges out;
  std::uint32_t next = 0;
  for (auto [lo, hi] : normalize_code_points(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10ffff) out.emplace_back(next, 0x10ffff);
  return normalize_code_points(out);
}

namespace {

using node = regex::node;
using node_ptr = std::unique_ptr<node>;
constexpr std::uint32_t max_cp = 0x10ffff;

code_point_ranges digit() { return {{'0', '9'}}; }
code_point_ranges word() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
code_point_ranges space() {  // ECMAScript WhiteSpace and LineTerminator
  return normalize_code_points({{0x09, 0x0d}, {0x20, 0x20}, {0xa0, 0xa0}, {0x1680, 0x1680}, {0x2000, 0x200a},
                                {0x2028, 0x2029}, {0x202f, 0x202f}, {0x205f, 0x205f}, {0x3000, 0x3000}, {0xfeff, 0xfeff}});
}

node_ptr make_set(code_point_ranges r) {
  auto n = std::make_unique<node>();
  n->k = node::kind::set;
  n->set = normalize_code_points(std::move(r));
  return n;
}

struct parse_failure {
  regex_error e;
};

// Under Lark's `i` flag: the other case of each ASCII letter in `r`.
code_point_ranges fold_ascii_case(code_point_ranges r) {
  const std::size_t n = r.size();
  for (std::size_t i = 0; i < n; ++i) {
    const auto [lo, hi] = r[i];
    for (const auto& [from, to] : {std::pair<std::uint32_t, std::uint32_t>{'a', 'A'}, {'A', 'a'}}) {
      const std::uint32_t a = std::max(lo, from), z = std::min(hi, from + 25);
      if (a <= z) r.emplace_back(a - from + to, z - from + to);
    }
  }
  return normalize_code_points(std::move(r));
}

class parser {
 public:
  // `lark`: the pattern of a Lark terminal (regex.hpp, lark_regex); null for ECMAScript.
  parser(std::string_view p, const limits& lim, const lark_regex* lark = nullptr) : p_(p), lim_(lim), lark_(lark) {}

  node_ptr parse_all() {
    auto n = alternation(0);
    if (pos_ < p_.size()) fail(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    return n;
  }

 private:
  [[noreturn]] void fail(std::string msg, std::size_t at = std::string::npos) {
    throw parse_failure{{std::move(msg), at == std::string::npos ? pos_ : at}};
  }
  bool eof() const { return pos_ >= p_.size(); }
  char peek() const { return p_[pos_]; }

  // One UTF-8 code point of the pattern.
  std::uint32_t code_point() {
    const auto c = static_cast<unsigned char>(p_[pos_]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + static_cast<std::size_t>(len) > p_.size()) fail("invalid UTF-8 in the pattern");
    std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int i = 1; i < len; ++i) {
      const auto d = static_cast<unsigned char>(p_[pos_ + static_cast<std::size_t>(i)]);
      if ((d & 0xc0) != 0x80) fail("invalid UTF-8 in the pattern");
      cp = (cp << 6) | (d & 0x3f);
    }
    pos_ += static_cast<std::size_t>(len);
    return cp;
  }

  node_ptr alternation(int depth) {
    if (depth > 200) fail("groups nested too deeply");
    std::vector<node_ptr> alts;
    alts.push_back(concatenation(depth));
    while (!eof() && peek() == '|') {
      ++pos_;
      alts.push_back(concatenation(depth));
    }
    if (alts.size() == 1) return std::move(alts[0]);
    auto n = std::make_unique<node>();
    n->k = node::kind::alt;
    n->kids = std::move(alts);
    return n;
  }

  node_ptr concatenation(int depth) {
    auto n = std::make_unique<node>();
    n->k = node::kind::concat;
    while (!eof() && peek() != '|' && peek() != ')') n->kids.push_back(quantified(depth));
    return n;
  }

  std::optional<std::uint32_t> number() { return detail::read_decimal(p_, pos_); }

  node_ptr quantified(int depth) {
    const std::size_t atom_at = pos_;
    auto a = atom(depth);
    if (eof()) return a;
    std::uint32_t lo = 0, hi = 0;
    const std::size_t q_at = pos_;
    switch (peek()) {
      case '*': lo = 0, hi = node::unbounded, ++pos_; break;
      case '+': lo = 1, hi = node::unbounded, ++pos_; break;
      case '?': lo = 0, hi = 1, ++pos_; break;
      case '{': {
        ++pos_;
        auto m = number();
        if (!m && lark_ && !eof() && peek() == ',') m = 0;  // Python's {,n}
        if (!m) {  // not a quantifier: a literal '{' (ECMAScript Annex B)
          pos_ = q_at;
          return a;
        }
        lo = hi = *m;
        if (!eof() && peek() == ',') {
          ++pos_;
          auto n = number();
          hi = n ? *n : node::unbounded;
        }
        if (eof() || peek() != '}') {
          pos_ = q_at;
          return a;
        }
        ++pos_;
        if (hi < lo) fail("quantifier {m,n} with n < m", q_at);
        if (lo > lim_.max_repeat || (hi != node::unbounded && hi > lim_.max_repeat))
          fail("quantifier bound above " + std::to_string(lim_.max_repeat), q_at);
        break;
      }
      default: return a;
    }
    if (a->k == node::kind::start_anchor || a->k == node::kind::end_anchor)
      fail("quantified anchor", atom_at);
    if (!eof() && peek() == '?') {
      if (lark_)
        fail("lazy quantifiers are not supported in a Lark terminal (Lark's lexer ends a lazy match early, which a "
             "constraint on whole lexemes cannot express): write a negated class, such as \"[^\"]*\" for \".*?\"");
      ++pos_;  // lazy: the same language
    }
    if (!eof() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
      if (peek() != '{' || (pos_ + 1 < p_.size() && p_[pos_ + 1] >= '0' && p_[pos_ + 1] <= '9'))
        fail("nothing to repeat");
    auto r = std::make_unique<node>();
    r->k = node::kind::repeat;
    r->min = lo;
    r->max = hi;
    r->kids.push_back(std::move(a));
    return r;
  }

  node_ptr atom(int depth) {
    const std::size_t at = pos_;
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (!eof() && peek() == '?') {
        ++pos_;
        if (eof()) fail("unterminated group");
        if (peek() == ':') {
          ++pos_;
        } else if (peek() == '<' && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
          const auto close = p_.find('>', pos_);
          if (close == std::string_view::npos) fail("unterminated group name");
          pos_ = close + 1;
        } else {
          fail("lookaround and inline flags are not supported", at);
        }
      }
      auto n = alternation(depth + 1);
      if (eof() || peek() != ')') fail("missing ')'", at);
      ++pos_;
      return n;
    }
    if (c == '[') return make_set(char_class());
    if (c == '.') {
      ++pos_;
      if (lark_) return make_set(lark_->dot_all ? any_code_point() : complement_code_points({{'\n', '\n'}}));
      return make_set(complement_code_points({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if ((c == '^' || c == '$') && lark_)
      fail("anchors are not supported in a Lark terminal (a terminal matches a whole lexeme)");
    if (c == '^' || c == '$') {
      ++pos_;
      auto n = std::make_unique<node>();
      n->k = c == '^' ? node::kind::start_anchor : node::kind::end_anchor;
      return n;
    }
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    if (c == ')') fail("unbalanced ')'");
    if (c == '\\') return make_set(folded(escape(false)));
    const auto cp = written(code_point(), at);
    return make_set(folded({{cp, cp}}));
  }

  // A code point the pattern spells out: under `i` it must not be a non-ASCII character, whose
  // other cases this engine does not know.
  std::uint32_t written(std::uint32_t cp, std::size_t at) {
    if (lark_ && lark_->ignore_case && cp >= 0x80)
      fail("the 'i' flag applies to ASCII letters only here: a non-ASCII character in a case-insensitive "
           "pattern is not supported",
           at);
    return cp;
  }
  code_point_ranges folded(code_point_ranges r) const {
    return lark_ && lark_->ignore_case ? fold_ascii_case(std::move(r)) : r;
  }

  std::uint32_t hex(std::size_t digits) {
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < digits; ++i) {
      if (eof()) fail("incomplete escape");
      const char h = peek();
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) fail("bad hex digit in escape");
      v = v * 16 + static_cast<std::uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // After a backslash (at pos_); in a class `\b` is a backspace.
  code_point_ranges escape(bool in_class) {
    const std::size_t at = pos_;
    ++pos_;
    if (eof()) fail("pattern ends with a backslash", at);
    const char c = peek();
    ++pos_;
    auto one = [](std::uint32_t cp) { return code_point_ranges{{cp, cp}}; };
    switch (c) {
      case 'd': return digit();
      case 'D': return complement_code_points(digit());
      case 'w': return word();
      case 'W': return complement_code_points(word());
      case 's': return space();
      case 'S': return complement_code_points(space());
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 't': return one('\t');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case '0':
        if (!eof() && peek() >= '0' && peek() <= '9') fail("octal escapes are not supported", at);
        return one(0);
      case 'x': return one(written(hex(2), at));
      case 'u': {
        if (!eof() && peek() == '{') {
          ++pos_;
          std::uint32_t v = 0;
          std::size_t n = 0;
          while (!eof() && peek() != '}') {
            v = v * 16 + hex(1);
            if (++n > 6 || v > max_cp) fail("code point escape out of range", at);
          }
          if (eof() || n == 0) fail("bad \\u{...} escape", at);
          ++pos_;
          return one(written(v, at));
        }
        std::uint32_t v = hex(4);
        if (v >= 0xd800 && v <= 0xdbff && pos_ + 1 < p_.size() && p_[pos_] == '\\' && p_[pos_ + 1] == 'u') {
          const std::size_t save = pos_;
          pos_ += 2;
          const std::uint32_t lo = hex(4);
          if (lo >= 0xdc00 && lo <= 0xdfff) return one(written(0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00), at));
          pos_ = save;
        }
        if (v >= 0xd800 && v <= 0xdfff) fail("lone surrogate escape", at);
        return one(written(v, at));
      }
      case 'b':
        if (in_class) return one('\b');
        fail("word boundary \\b is not supported", at);
      case 'B': fail("\\B is not supported", at);
      case 'p':
      case 'P': fail("Unicode property escapes are not supported", at);
      case 'c': fail("control escapes \\cX are not supported", at);
      case 'k': fail("named backreferences are not supported", at);
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported", at);
        if (static_cast<unsigned char>(c) >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
          fail(std::string("unknown escape \\") + c, at);
        return one(static_cast<unsigned char>(c));
    }
  }

  code_point_ranges char_class() {
    const std::size_t at = pos_;
    ++pos_;
    bool negate = false;
    if (!eof() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    code_point_ranges r;
    bool first = true;
    while (true) {
      if (eof()) fail("missing ']'", at);
      if (peek() == ']' && !first) break;
      if (peek() == ']' && !lark_) break;  // `[]` is the empty class in ECMAScript; in Python `]` first is literal
      first = false;
      auto item = [&]() -> code_point_ranges {
        if (peek() == '\\') return escape(true);
        const std::size_t cp_at = pos_;
        const auto cp = written(code_point(), cp_at);
        return {{cp, cp}};
      };
      const std::size_t item_at = pos_;
      code_point_ranges lo = item();
      if (pos_ + 1 < p_.size() && peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        code_point_ranges hi = item();
        if (lo.size() != 1 || hi.size() != 1 || lo[0].first != lo[0].second || hi[0].first != hi[0].second)
          fail("class escape in a range", item_at);
        if (hi[0].first < lo[0].first) fail("range out of order in class", item_at);
        r.emplace_back(lo[0].first, hi[0].first);
      } else {
        r.insert(r.end(), lo.begin(), lo.end());
      }
    }
    ++pos_;
    r = folded(normalize_code_points(r));
    return negate ? complement_code_points(r) : r;
  }

  std::string_view p_;
  const limits& lim_;
  const lark_regex* lark_;
  std::size_t pos_ = 0;
};

void no_anchors(const node& n) {
  if (n.k == node::kind::start_anchor || n.k == node::kind::end_anchor)
    throw parse_failure{{"'^' and '$' are supported only at the ends of a top-level alternative", 0}};
  for (const auto& k : n.kids) no_anchors(*k);
}

// Anchors: `^` only first and `$` only last in a top-level alternative (a concatenation).
void check_anchors(const node& alternative) {
  const auto& kids = alternative.kids;
  for (std::size_t i = 0; i < kids.size(); ++i) {
    const bool edge = (kids[i]->k == node::kind::start_anchor && i == 0) ||
                      (kids[i]->k == node::kind::end_anchor && i + 1 == kids.size());
    if (!edge) no_anchors(*kids[i]);
  }
}

void emit_node(const node& n, nfa_builder& b, std::uint32_t from, std::uint32_t to, bool json, std::size_t cap) {
  if (b.size() > cap) throw build_error{"the pattern's automaton is too large"};
  switch (n.k) {
    case node::kind::set: emit_code_points(b, from, to, n.set, json); return;
    case node::kind::start_anchor:
    case node::kind::end_anchor: b.epsilon(from, to); return;
    case node::kind::alt:
      for (const auto& k : n.kids) emit_node(*k, b, from, to, json, cap);
      return;
    case node::kind::concat: {
      std::uint32_t cur = from;
      for (std::size_t i = 0; i < n.kids.size(); ++i) {
        const std::uint32_t nxt = i + 1 == n.kids.size() ? to : b.add_state();
        emit_node(*n.kids[i], b, cur, nxt, json, cap);
        cur = nxt;
      }
      if (n.kids.empty()) b.epsilon(from, to);
      return;
    }
    case node::kind::repeat: {
      std::uint32_t cur = from;
      for (std::uint32_t i = 0; i < n.min; ++i) {
        const std::uint32_t nxt = b.add_state();
        emit_node(*n.kids[0], b, cur, nxt, json, cap);
        cur = nxt;
      }
      if (n.max == node::unbounded) {
        const std::uint32_t loop = b.add_state(), back = b.add_state();
        b.epsilon(cur, loop);
        emit_node(*n.kids[0], b, loop, back, json, cap);
        b.epsilon(back, loop);
        b.epsilon(loop, to);
        return;
      }
      for (std::uint32_t i = n.min; i < n.max; ++i) {
        b.epsilon(cur, to);
        const std::uint32_t nxt = b.add_state();
        emit_node(*n.kids[0], b, cur, nxt, json, cap);
        cur = nxt;
      }
      b.epsilon(cur, to);
      return;
    }
  }
}

// Inclusive range [lo, hi] of code points of the same UTF-8 length.
void emit_utf8(nfa_builder& b, std::uint32_t from, std::uint32_t to, std::uint32_t lo, std::uint32_t hi) {
  auto len = [](std::uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; };
  const int n = len(lo);
  for (int i = 1; i < n; ++i) {
    const std::uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        emit_utf8(b, from, to, lo, lo | m);
        emit_utf8(b, from, to, (lo | m) + 1, hi);
        return;
      }
      if ((hi & m) != m) {
        emit_utf8(b, from, to, lo, (hi & ~m) - 1);
        emit_utf8(b, from, to, hi & ~m, hi);
        return;
      }
    }
  }
  auto encode = [n](std::uint32_t cp, unsigned char* out) {
    if (n == 1) {
      out[0] = static_cast<unsigned char>(cp);
    } else {
      for (int i = n - 1; i > 0; --i) {
        out[i] = static_cast<unsigned char>(0x80 | (cp & 0x3f));
        cp >>= 6;
      }
      const unsigned lead = n == 2 ? 0xc0 : n == 3 ? 0xe0 : 0xf0;
      out[0] = static_cast<unsigned char>(lead | cp);
    }
  };
  unsigned char L[4], H[4];
  encode(lo, L);
  encode(hi, H);
  std::uint32_t cur = from;
  for (int i = 0; i < n; ++i) {
    const std::uint32_t nxt = i + 1 == n ? to : b.add_state();
    byte_set s;
    s.set_range(L[i], H[i]);
    b.bytes(cur, nxt, s);
    cur = nxt;
  }
}

}  // namespace

code_point_ranges any_code_point() { return complement_code_points({}); }

void emit_code_points(nfa_builder& b, std::uint32_t from, std::uint32_t to, const code_point_ranges& set,
                      bool json_string) {
  for (auto [lo, hi] : set) {
    if (json_string) {
      // Characters JSON escapes get their canonical escape; the rest are raw UTF-8.
      for (std::uint32_t cp = lo; cp <= std::min<std::uint32_t>(hi, 0x5c); ++cp) {
        if (cp >= 0x20 && cp != '"' && cp != '\\') {
          // a run of plain ASCII
          std::uint32_t end = cp;
          while (end + 1 <= std::min<std::uint32_t>(hi, 0x5c) && end + 1 != '"' && end + 1 != '\\') ++end;
          emit_utf8(b, from, to, cp, end);
          cp = end;
          continue;
        }
        static const char* const short_escapes[] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                    "\\b", "\\t", "\\n", nullptr, "\\f", "\\r"};
        if (cp == '"') {
          b.literal(from, to, "\\\"");
        } else if (cp == '\\') {
          b.literal(from, to, "\\\\");
        } else if (cp < 14 && short_escapes[cp]) {
          b.literal(from, to, short_escapes[cp]);
        } else {
          static const char digits[] = "0123456789abcdef";
          const char esc[] = {'\\', 'u', '0', '0', digits[cp >> 4], digits[cp & 15], 0};
          b.literal(from, to, esc);
        }
      }
      if (hi <= 0x5c) continue;
      lo = std::max<std::uint32_t>(lo, 0x5d);
    }
    // Split by UTF-8 length.
    for (const auto& [blo, bhi] : {std::pair<std::uint32_t, std::uint32_t>{0, 0x7f}, {0x80, 0x7ff}, {0x800, 0xffff},
                                  {0x10000, 0x10ffff}}) {
      const auto a = std::max(lo, blo), z = std::min(hi, bhi);
      if (a <= z) emit_utf8(b, from, to, a, z);
    }
  }
}

regex::regex(std::unique_ptr<node> root) : root_(std::move(root)) {}
regex::regex(regex&&) noexcept = default;
regex& regex::operator=(regex&&) noexcept = default;
regex::~regex() = default;

std::variant<regex, regex_error> regex::parse(std::string_view pattern, bool search, const limits& lim) {
  try {
    parser p(pattern, lim);
    auto root = p.parse_all();
    // Each top-level alternative becomes [any*] body [any*] where it is not anchored.
    std::vector<node*> alts;
    if (root->k == node::kind::alt) {
      for (auto& k : root->kids) alts.push_back(k.get());
    } else {
      alts.push_back(root.get());
    }
    for (node* a : alts) {  // each one a concatenation (parser::concatenation)
      check_anchors(*a);
      const bool anchored_start = !a->kids.empty() && a->kids.front()->k == node::kind::start_anchor;
      const bool anchored_end = !a->kids.empty() && a->kids.back()->k == node::kind::end_anchor;
      if (search) {
        auto any_star = [] {
          auto r = std::make_unique<node>();
          r->k = node::kind::repeat;
          r->min = 0;
          r->max = node::unbounded;
          r->kids.push_back(make_set(any_code_point()));
          return r;
        };
        if (!anchored_start) a->kids.insert(a->kids.begin(), any_star());
        if (!anchored_end) a->kids.push_back(any_star());
      }
    }
    return regex(std::move(root));
  } catch (const parse_failure& f) {
    return f.e;
  }
}

std::variant<regex, regex_error> regex::parse_lark(std::string_view pattern, const lark_regex& flags,
                                                   const limits& lim) {
  try {
    parser p(pattern, lim, &flags);
    return regex(p.parse_all());
  } catch (const parse_failure& f) {
    return f.e;
  }
}

void regex::emit(nfa_builder& b, std::uint32_t from, std::uint32_t to, bool json_string) const {
  emit_node(*root_, b, from, to, json_string, static_cast<std::size_t>(b.size()) + 200000);
}

std::variant<grammar, regex_error> compile_regex(std::string_view pattern, const limits& lim) {
  auto parsed = regex::parse(pattern, false, lim);
  if (auto* e = std::get_if<regex_error>(&parsed)) return *e;
  try {
    nfa_builder b;
    const auto start = b.add_state(), accept = b.add_state();
    std::get<regex>(parsed).emit(b, start, accept, false);
    grammar g;
    g.rules.push_back(b.determinize(start, accept, "regex", lim));
    if (!prune(g)) return regex_error{"the pattern matches no string", 0};
    return g;
  } catch (const build_error& e) {
    return regex_error{e.message, 0};
  }
}

}  // namespace troupe::recipe::grammar
