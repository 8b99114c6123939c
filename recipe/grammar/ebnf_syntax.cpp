// The grammar dialects' shared syntax tree, scanner and compiler (ebnf_syntax.hpp).
#include "recipe/grammar/ebnf_syntax.hpp"

#include <map>

namespace troupe::recipe::grammar::syntax {

namespace {

constexpr std::size_t max_nfa_states = 200000;  // per rule
constexpr std::uint64_t max_emit_steps = 2000000;

}  // namespace

std::pair<std::size_t, std::size_t> scanner::line_column(std::size_t at) const {
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

ebnf_error scanner::error_at(std::string message, std::size_t at) const {
  if (at == std::string::npos) return ebnf_error{std::move(message), 0, 0};
  const auto [line, col] = line_column(at);
  return ebnf_error{std::move(message), line, col};
}

std::string scanner::describe(std::size_t at) const {
  if (at >= t_.size()) return "end of the grammar";
  const auto c = static_cast<unsigned char>(t_[at]);
  if (c == '\n') return "end of line";
  if (c < 0x20 || c >= 0x7f) {
    static const char digits[] = "0123456789abcdef";
    return std::string("byte 0x") + digits[c >> 4] + digits[c & 15];
  }
  return std::string("'") + static_cast<char>(c) + "'";
}

// Validated: no overlong forms, surrogates or values past U+10FFFF.
std::uint32_t scanner::code_point() {
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

std::uint32_t scanner::hex(std::size_t digits, std::size_t at) {
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

std::uint32_t scanner::escape(std::string_view more, bool any_punct, std::string_view punct) {
  const std::size_t at = pos_;
  ++pos_;
  if (eof()) fail("the grammar ends inside an escape", at);
  const char c = peek();
  ++pos_;
  std::uint32_t cp = 0;
  const bool extra = more.find(c) != std::string_view::npos;
  switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'f': return '\f';
    case 'v':
      if (extra) return '\v';
      break;
    case '0':
      if (extra) return 0;
      break;
    case 'x': cp = hex(2, at); break;
    case 'u': cp = hex(4, at); break;
    case 'U': cp = hex(8, at); break;
    default: break;
  }
  if (c == 'x' || c == 'u' || c == 'U') {
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) fail("the escape is not a Unicode scalar value", at);
    return cp;
  }
  const auto u = static_cast<unsigned char>(c);
  const bool is_punct = u > 0x20 && u < 0x7f && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'));
  if (is_punct && (any_punct || punct.find(c) != std::string_view::npos)) return u;
  pos_ = at + 1;
  fail("unknown escape '\\" + (u > 0x20 && u < 0x7f ? std::string(1, c) : describe(at + 1)) + "'", at);
}

namespace {

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
      case node::kind::pattern: n.re->emit(b_, from, to, false); return;
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
        const node& body = n.kids[0];
        if (n.kids.size() == 1) {
          repeat([&](std::uint32_t a, std::uint32_t z) { emit(body, a, z); }, n.min, n.max, from, to);
          return;
        }
        // With a separator: nothing, or one repetition and then (separator, repetition) n-1 times.
        if (n.max == 0) {
          b_.epsilon(from, to);
          return;
        }
        if (n.min == 0) b_.epsilon(from, to);
        const std::uint32_t first = b_.add_state();
        emit(body, from, first);
        const node& sep = n.kids[1];
        repeat(
            [&](std::uint32_t a, std::uint32_t z) {
              const std::uint32_t mid = b_.add_state();
              emit(sep, a, mid);
              emit(body, mid, z);
            },
            n.min == 0 ? 0 : n.min - 1, n.max == unbounded ? unbounded : n.max - 1, first, to);
        return;
      }
    }
  }

 private:
  // `one(a, z)` emits one repetition from a to z; this emits min to max of them.
  template <class One>
  void repeat(One&& one, std::uint32_t min, std::uint32_t max, std::uint32_t from, std::uint32_t to) {
    std::uint32_t cur = from;
    for (std::uint32_t i = 0; i < min; ++i) {
      const std::uint32_t nxt = b_.add_state();
      one(cur, nxt);
      cur = nxt;
    }
    if (max == unbounded) {
      const std::uint32_t loop = b_.add_state(), back = b_.add_state();
      b_.epsilon(cur, loop);
      one(loop, back);
      b_.epsilon(back, loop);
      b_.epsilon(loop, to);
      return;
    }
    for (std::uint32_t i = min; i < max; ++i) {
      b_.epsilon(cur, to);
      const std::uint32_t nxt = b_.add_state();
      one(cur, nxt);
      cur = nxt;
    }
    b_.epsilon(cur, to);
  }

  nfa_builder& b_;
  const std::map<std::string, std::uint32_t>& ids_;
  const std::map<std::string, const node*>& inlined_;
  std::uint64_t steps_ = 0;
};

}  // namespace

std::variant<grammar, ebnf_error> compile_rules(const std::vector<rule_def>& defs, std::string_view root,
                                                const scanner& text, const limits& lim, const namer& name_of,
                                                std::string_view left_recursion_hint) {
  if (defs.empty()) return ebnf_error{"the grammar defines no rule", 0, 0};
  std::map<std::string, std::size_t> by_name;
  for (std::size_t i = 0; i < defs.size(); ++i) {
    auto [it, inserted] = by_name.emplace(defs[i].name, i);
    if (!inserted) {
      const auto [line, col] = text.line_column(defs[it->second].at);
      return text.error_at(name_of(defs[i].name) + " is defined twice (first at line " + std::to_string(line) +
                               ", column " + std::to_string(col) + ")",
                           defs[i].at);
    }
  }
  std::vector<std::vector<const node*>> refs(defs.size());
  for (std::size_t i = 0; i < defs.size(); ++i) {
    collect_refs(defs[i].body, refs[i]);
    for (const node* r : refs[i])
      if (!by_name.count(r->text)) return text.error_at("undefined " + name_of(r->text), r->at);
  }
  const auto root_it = by_name.find(std::string(root));
  if (root_it == by_name.end())
    return ebnf_error{"the grammar has no rule named '" + std::string(root) + "' (the start rule)", 0, 0};

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
      return text.error_at(name_of(d.name) + ": " + e.message, d.at);
    }
    total += g.rules[id].size();
    if (total > lim.max_total_states)
      return text.error_at("the grammar needs more than " + std::to_string(lim.max_total_states) +
                               " automaton states (at " + name_of(d.name) + ")",
                           d.at);
  }
  if (const auto r = left_recursive_rule(g); !r.empty())
    return text.error_at(name_of(r) + " is left-recursive: it can reach itself without consuming any output (" +
                             std::string(left_recursion_hint) + ")",
                         defs[by_name.at(r)].at);
  const bool root_ok = prune(g);
  for (std::size_t id = 0; id < order.size(); ++id) {
    const rule& r = g.rules[id];
    if (!r.accepting[0] && !r.has_bytes[0] && r.calls[0].empty())
      return text.error_at(name_of(r.name) + " matches no string (every alternative needs the rule itself, or a "
                                             "rule that matches nothing, again)",
                           defs[order[id]].at);
  }
  if (!root_ok) return text.error_at("the grammar matches no string", defs[root_it->second].at);
  return g;
}

}  // namespace troupe::recipe::grammar::syntax
