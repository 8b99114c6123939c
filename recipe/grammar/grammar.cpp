// The grammar representation: NFA construction, determinization, pruning (grammar.hpp).
#include "recipe/grammar/grammar.hpp"

#include <algorithm>
#include <bit>
#include <map>
#include <set>
#include <span>
#include <string_view>

namespace troupe::recipe::grammar {

std::uint64_t grammar::fingerprint() const {
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(rules.size());
  mix(root);
  for (const auto& r : rules) {
    mix(r.size());
    mix(r.classes);
    mix((std::uint64_t{r.max_tokens} << 32) | r.max_chars);
    for (const auto c : r.byte_class) mix(c);
    for (const auto n : r.next) mix(static_cast<std::uint32_t>(n));
    for (std::uint32_t s = 0; s < r.size(); ++s) {
      mix(r.accepting[s]);
      for (const auto& c : r.calls[s]) mix((std::uint64_t{c.rule} << 32) | c.target);
    }
  }
  for (const auto& t : symbols) {
    mix((std::uint64_t{t.byte} << 1) | (t.any ? 1 : 0));
    mix(t.ids.size());
    for (const auto id : t.ids) mix(id);
  }
  return h;
}

std::size_t grammar::state_count() const {
  std::size_t n = 0;
  for (const auto& r : rules) n += r.size();
  return n;
}

std::uint32_t nfa_builder::add_state() {
  eps_.emplace_back();
  byte_edges_.emplace_back();
  calls_.emplace_back();
  return static_cast<std::uint32_t>(eps_.size() - 1);
}

void nfa_builder::epsilon(std::uint32_t from, std::uint32_t to) { eps_[from].push_back(to); }

void nfa_builder::bytes(std::uint32_t from, std::uint32_t to, const byte_set& set) {
  if (!set.empty()) byte_edges_[from].push_back({set, to});
}

void nfa_builder::byte(std::uint32_t from, std::uint32_t to, unsigned char b) {
  byte_set s;
  s.set(b);
  bytes(from, to, s);
}

void nfa_builder::call(std::uint32_t from, std::uint32_t to, std::uint32_t rule) {
  calls_[from].push_back({rule, to});
}

void nfa_builder::literal(std::uint32_t from, std::uint32_t to, std::string_view s) {
  if (s.empty()) {
    epsilon(from, to);
    return;
  }
  std::uint32_t cur = from;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const std::uint32_t nxt = i + 1 == s.size() ? to : add_state();
    byte(cur, nxt, static_cast<unsigned char>(s[i]));
    cur = nxt;
  }
}

void nfa_builder::paste(std::uint32_t from, std::uint32_t to, const rule& dfa) {
  const auto base = size();
  eps_.reserve(base + dfa.size());
  byte_edges_.reserve(base + dfa.size());
  calls_.reserve(base + dfa.size());
  for (std::uint32_t s = 0; s < dfa.size(); ++s) add_state();
  epsilon(from, base);
  std::vector<byte_set> class_bytes(dfa.classes);
  for (unsigned b = 0; b < 256; ++b) class_bytes[dfa.byte_class[b]].set(b);
  for (std::uint32_t s = 0; s < dfa.size(); ++s) {
    if (dfa.accepting[s]) epsilon(base + s, to);
    // One edge per target, the union of the classes that lead there.
    auto& edges = byte_edges_[base + s];
    for (std::uint32_t c = 0; c < dfa.classes; ++c) {
      const auto t = dfa.next[s * dfa.classes + c];
      if (t == no_state) continue;
      const auto target = base + static_cast<std::uint32_t>(t);
      auto it = std::find_if(edges.begin(), edges.end(), [&](const byte_edge& x) { return x.to == target; });
      if (it == edges.end()) it = edges.insert(edges.end(), {byte_set{}, target});
      it->set |= class_bytes[c];
    }
  }
}

rule nfa_builder::determinize(std::uint32_t start, std::uint32_t accept, std::string name,
                              const limits& lim) const {
  using set_t = std::vector<std::uint32_t>;
  std::vector<std::uint32_t> mark(eps_.size(), 0);
  std::uint32_t epoch = 0;
  // The epsilon closure of `s` into `out` (sorted); `todo` is scratch.
  set_t todo, out;
  auto closure = [&](const set_t& s) -> const set_t& {
    ++epoch;
    out.clear();
    todo = s;
    for (const auto x : s) mark[x] = epoch;
    while (!todo.empty()) {
      const auto x = todo.back();
      todo.pop_back();
      out.push_back(x);
      for (const auto y : eps_[x])
        if (mark[y] != epoch) {
          mark[y] = epoch;
          todo.push_back(y);
        }
    }
    std::sort(out.begin(), out.end());
    return out;
  };

  rule r;
  r.name = std::move(name);
  std::map<set_t, std::uint32_t> ids;
  std::vector<const set_t*> sets;  // the keys of `ids` (stable), by state
  std::uint64_t work = 0;
  auto id_of = [&](const set_t& s) -> std::uint32_t {
    if (auto it = ids.find(s); it != ids.end()) return it->second;
    if (sets.size() >= lim.max_rule_states)
      throw build_error{"rule " + r.name + " needs more than " + std::to_string(lim.max_rule_states) +
                        " automaton states"};
    const auto it = ids.emplace(s, static_cast<std::uint32_t>(sets.size())).first;
    sets.push_back(&it->first);
    return it->second;
  };
  id_of(closure({start}));
  // Byte classes: bytes that no edge tells apart share a class, so each DFA state computes one
  // target set per class instead of one per byte.
  std::array<std::uint16_t, 256> cls{};
  std::uint16_t classes = 1;
  {
    std::set<std::array<std::uint64_t, 4>> distinct;
    for (const auto& edges : byte_edges_)
      for (const auto& e : edges) distinct.insert(e.set.bits);
    for (const auto& bits : distinct) {
      const byte_set set{bits};
      std::vector<std::int32_t> renum(2u * classes, -1);
      std::uint16_t next_id = 0;
      for (unsigned b = 0; b < 256; ++b) {
        auto& slot = renum[2u * cls[b] + (set.test(b) ? 1 : 0)];
        if (slot < 0) slot = next_id++;
        cls[b] = static_cast<std::uint16_t>(slot);
      }
      classes = next_id;
    }
  }
  std::vector<unsigned> representative(classes, 256);
  for (unsigned b = 256; b-- > 0;) representative[cls[b]] = b;
  std::vector<set_t> per_class(classes);
  // A state's classes whose target sets differ from earlier ones, with a hash of the set.
  std::vector<std::pair<std::uint64_t, std::uint16_t>> distinct;
  // The classes each byte edge covers, listed the first time a subset holds its NFA state rather
  // than tested in every subset.
  std::vector<std::vector<std::vector<std::uint16_t>>> edge_classes(byte_edges_.size());
  std::vector<std::uint8_t> listed(byte_edges_.size(), 0);
  for (unsigned b = 0; b < 256; ++b) r.byte_class[b] = static_cast<std::uint8_t>(cls[b]);
  r.classes = classes;
  for (std::size_t i = 0; i < sets.size(); ++i) {
    const set_t& cur = *sets[i];
    r.calls.emplace_back();
    r.accepting.push_back(std::binary_search(cur.begin(), cur.end(), accept) ? 1 : 0);
    r.has_bytes.push_back(0);
    for (auto& v : per_class) v.clear();
    std::map<std::uint32_t, set_t> per_call;
    for (const auto x : cur) {
      work += 1 + byte_edges_[x].size() * classes;
      if (work > lim.max_subset_work)
        throw build_error{"rule " + r.name + " is too large to determinize (more than " +
                          std::to_string(lim.max_subset_work) + " steps of subset construction)"};
      if (!listed[x]) {
        listed[x] = 1;
        for (const auto& e : byte_edges_[x]) {
          auto& covered = edge_classes[x].emplace_back();
          for (std::uint16_t c = 0; c < classes; ++c)
            if (e.set.test(representative[c])) covered.push_back(c);
        }
      }
      for (std::size_t j = 0; j < byte_edges_[x].size(); ++j)
        for (const auto c : edge_classes[x][j]) per_class[c].push_back(byte_edges_[x][j].to);
      for (const auto& c : calls_[x]) per_call[c.rule].push_back(c.to);
    }
    // Classes with the same target set share one closure.
    r.next.resize(r.next.size() + classes, no_state);
    distinct.clear();
    for (std::uint16_t c = 0; c < classes; ++c) {
      auto& v = per_class[c];
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      std::uint64_t h = 14695981039346656037ull;
      for (const auto x : v) h = (h ^ x) * 1099511628211ull;
      const auto same = std::find_if(distinct.begin(), distinct.end(),
                                     [&](const auto& d) { return d.first == h && per_class[d.second] == v; });
      if (same != distinct.end()) {
        r.next[i * classes + c] = r.next[i * classes + same->second];
      } else {
        r.next[i * classes + c] = static_cast<std::int32_t>(id_of(closure(v)));
        distinct.emplace_back(h, c);
      }
      r.has_bytes[i] = 1;
    }
    for (auto& [callee, targets] : per_call) {
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      const auto t = id_of(closure(targets));
      r.calls[i].push_back({callee, t});
    }
  }
  return r;
}

std::uint32_t append_rules(grammar& into, const grammar& from) {
  const auto offset = static_cast<std::uint32_t>(into.rules.size());
  for (rule r : from.rules) {
    for (auto& calls : r.calls)
      for (auto& c : calls) c.rule += offset;
    into.rules.push_back(std::move(r));
  }
  return offset + from.root;
}

bool prune(grammar& g) {
  // Productive rules: a fixpoint over "some accepting state is reachable from the start".
  const std::size_t n = g.rules.size();
  // Predecessors of each state: by a byte edge (of rule ri, those of state t are
  // byte_from[ri][byte_at[ri][t] .. byte_at[ri][t + 1]), possibly repeated), and by a call edge
  // (with its callee).
  std::vector<std::vector<std::uint32_t>> byte_at(n), byte_from(n);
  std::vector<std::vector<std::vector<call_edge>>> call_preds(n);  // {callee, source state}
  for (std::size_t ri = 0; ri < n; ++ri) {
    const rule& r = g.rules[ri];
    auto& at = byte_at[ri];
    at.assign(r.size() + 1, 0);
    for (const auto t : r.next)
      if (t != no_state) ++at[static_cast<std::uint32_t>(t) + 1];
    for (std::uint32_t t = 0; t < r.size(); ++t) at[t + 1] += at[t];
    auto fill = at;
    byte_from[ri].resize(at.back());
    call_preds[ri].resize(r.size());
    for (std::uint32_t s = 0; s < r.size(); ++s) {
      for (std::uint32_t c = 0; c < r.classes; ++c) {
        const auto t = r.next[s * r.classes + c];
        if (t != no_state) byte_from[ri][fill[static_cast<std::uint32_t>(t)]++] = s;
      }
      for (const auto& c : r.calls[s]) call_preds[ri][c.target].push_back({c.rule, s});
    }
  }
  auto byte_preds = [&](std::size_t ri, std::uint32_t t) {
    return std::span<const std::uint32_t>(byte_from[ri].data() + byte_at[ri][t], byte_at[ri][t + 1] - byte_at[ri][t]);
  };
  std::vector<std::uint8_t> productive(n, 0);
  std::vector<std::vector<std::uint8_t>> live(n);
  // A rule's live states change only when one of its callees becomes productive: `became[ri]`
  // is the step at which rule ri did, `computed[ri]` the step at which its live states were.
  std::uint64_t step = 1;
  std::vector<std::uint64_t> became(n, 0), computed(n, 0);
  std::vector<std::vector<std::uint32_t>> callees(n);
  for (std::size_t ri = 0; ri < n; ++ri) {
    for (const auto& cs : g.rules[ri].calls)
      for (const auto& c : cs) callees[ri].push_back(c.rule);
    std::sort(callees[ri].begin(), callees[ri].end());
    callees[ri].erase(std::unique(callees[ri].begin(), callees[ri].end()), callees[ri].end());
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t ri = 0; ri < n; ++ri) {
      const rule& r = g.rules[ri];
      if (computed[ri] && std::none_of(callees[ri].begin(), callees[ri].end(),
                                       [&](std::uint32_t c) { return became[c] >= computed[ri]; }))
        continue;
      computed[ri] = ++step;
      auto& lv = live[ri];
      lv.assign(r.size(), 0);
      // Backward reachability from the accepting states over byte edges and productive calls.
      std::vector<std::uint32_t> todo;
      for (std::uint32_t s = 0; s < r.size(); ++s)
        if (r.accepting[s]) {
          lv[s] = 1;
          todo.push_back(s);
        }
      while (!todo.empty()) {
        const auto t = todo.back();
        todo.pop_back();
        for (const auto s : byte_preds(ri, t))
          if (!lv[s]) {
            lv[s] = 1;
            todo.push_back(s);
          }
        for (const auto& [callee, s] : call_preds[ri][t])
          if (productive[callee] && !lv[s]) {
            lv[s] = 1;
            todo.push_back(s);
          }
      }
      if (!productive[ri] && r.size() > 0 && lv[0]) {
        productive[ri] = changed = 1;
        became[ri] = ++step;
      }
    }
  }
  for (std::size_t ri = 0; ri < n; ++ri) {
    rule& r = g.rules[ri];
    const auto& lv = live[ri];
    // Only the byte predecessors of dead states have edges to cut.
    std::vector<std::uint8_t> cut(r.size(), 0);
    for (std::uint32_t t = 0; t < r.size(); ++t)
      if (!lv[t])
        for (const auto s : byte_preds(ri, t)) cut[s] = 1;
    for (std::uint32_t s = 0; s < r.size(); ++s) {
      if (cut[s]) {
        r.has_bytes[s] = 0;
        for (std::uint32_t c = 0; c < r.classes; ++c) {
          auto& t = r.next[s * r.classes + c];
          if (t != no_state && !lv[static_cast<std::uint32_t>(t)]) t = no_state;
          if (t != no_state) r.has_bytes[s] = 1;
        }
      }
      auto& cs = r.calls[s];
      cs.erase(std::remove_if(cs.begin(), cs.end(),
                              [&](const call_edge& c) { return !productive[c.rule] || !lv[c.target]; }),
               cs.end());
    }
  }
  return productive[g.root] != 0;
}

std::string left_recursive_rule(const grammar& g) {
  // For each rule, the rules it can call before consuming a byte: calls from states reachable
  // from the start through calls to nullable rules only.
  const std::size_t n = g.rules.size();
  std::vector<std::uint8_t> nullable(n, 0);
  auto reach_without_bytes = [&](std::size_t ri, auto&& on_call) {
    const rule& r = g.rules[ri];
    std::vector<std::uint8_t> seen(r.size(), 0);
    std::vector<std::uint32_t> todo{0};
    if (r.size() == 0) return false;
    seen[0] = 1;
    bool accepts = false;
    while (!todo.empty()) {
      const auto s = todo.back();
      todo.pop_back();
      accepts = accepts || r.accepting[s];
      for (const auto& c : r.calls[s]) {
        on_call(c.rule);
        if (nullable[c.rule] && !seen[c.target]) {
          seen[c.target] = 1;
          todo.push_back(c.target);
        }
      }
    }
    return accepts;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t ri = 0; ri < n; ++ri)
      if (!nullable[ri] && reach_without_bytes(ri, [](std::uint32_t) {})) nullable[ri] = changed = 1;
  }
  std::vector<std::vector<std::uint32_t>> edges(n);
  for (std::size_t ri = 0; ri < n; ++ri)
    reach_without_bytes(ri, [&](std::uint32_t c) { edges[ri].push_back(c); });
  // A cycle in `edges` is left recursion (iterative DFS, colours 0 new, 1 on path, 2 done).
  std::vector<std::uint8_t> colour(n, 0);
  for (std::size_t s0 = 0; s0 < n; ++s0) {
    if (colour[s0]) continue;
    std::vector<std::pair<std::uint32_t, std::size_t>> path{{static_cast<std::uint32_t>(s0), 0}};
    colour[s0] = 1;
    while (!path.empty()) {
      auto& [v, i] = path.back();
      if (i < edges[v].size()) {
        const auto w = edges[v][i++];
        if (colour[w] == 1) return g.rules[w].name;
        if (colour[w] == 0) {
          colour[w] = 1;
          path.push_back({w, 0});
        }
      } else {
        colour[v] = 2;
        path.pop_back();
      }
    }
  }
  return {};
}

namespace {

// Sets `out`'s byte classes to `from`'s with each byte in `own` a class of its own; returns a
// byte of each class.
std::vector<unsigned> refine_classes(rule& out, const rule& from, const std::array<bool, 256>& own) {
  std::map<std::pair<unsigned, int>, std::uint8_t> class_of;
  std::vector<unsigned> representative;
  for (unsigned b = 0; b < 256; ++b) {
    const auto [it, added] = class_of.emplace(std::make_pair(unsigned{from.byte_class[b]}, own[b] ? int(b) : -1),
                                              static_cast<std::uint8_t>(class_of.size()));
    if (added) representative.push_back(b);
    out.byte_class[b] = it->second;
  }
  out.classes = static_cast<std::uint32_t>(representative.size());
  return representative;
}

}  // namespace

rule without_words(const rule& r, const std::vector<std::string>& words, std::uint32_t max_states) {
  // A trie of the words; the product of r with it, where "off the trie" is node -1.
  std::vector<std::array<std::int32_t, 256>> trie(1);
  trie[0].fill(-1);
  std::vector<std::uint8_t> word_end(1, 0);
  for (const auto& w : words) {
    std::int32_t t = 0;
    for (const unsigned char c : w) {
      if (trie[static_cast<std::size_t>(t)][c] < 0) {
        trie[static_cast<std::size_t>(t)][c] = static_cast<std::int32_t>(trie.size());
        trie.emplace_back().fill(-1);
        word_end.push_back(0);
      }
      t = trie[static_cast<std::size_t>(t)][c];
    }
    word_end[static_cast<std::size_t>(t)] = 1;
  }
  rule out;
  out.name = r.name + "-minus-words";
  // A byte of some word is a class of its own; the others keep r's classes.
  std::array<bool, 256> in_words{};
  for (const auto& w : words)
    for (const unsigned char c : w) in_words[c] = true;
  const auto representative = refine_classes(out, r, in_words);
  std::map<std::pair<std::int32_t, std::int32_t>, std::uint32_t> ids;
  std::vector<std::pair<std::int32_t, std::int32_t>> states;
  auto id_of = [&](std::int32_t q, std::int32_t t) {
    auto [it, inserted] = ids.emplace(std::make_pair(q, t), static_cast<std::uint32_t>(states.size()));
    if (inserted) {
      if (states.size() >= max_states)
        throw build_error{"rule " + out.name + " needs more than " + std::to_string(max_states) +
                          " automaton states"};
      states.emplace_back(q, t);
    }
    return it->second;
  };
  id_of(0, 0);
  for (std::size_t i = 0; i < states.size(); ++i) {
    const auto [q, t] = states[i];
    out.next.resize((i + 1) * out.classes, no_state);
    out.calls.emplace_back();
    out.accepting.push_back(
        r.accepting[static_cast<std::uint32_t>(q)] && !(t >= 0 && word_end[static_cast<std::size_t>(t)]));
    out.has_bytes.push_back(0);
    for (std::uint32_t c = 0; c < out.classes; ++c) {
      const unsigned b = representative[c];
      const auto q2 = r.step(static_cast<std::uint32_t>(q), static_cast<unsigned char>(b));
      if (q2 == no_state) continue;
      const std::int32_t t2 = t >= 0 ? trie[static_cast<std::size_t>(t)][b] : -1;
      out.next[i * out.classes + c] = static_cast<std::int32_t>(id_of(q2, t2));
      out.has_bytes[i] = 1;
    }
  }
  return out;
}

rule enclosed(std::string_view open, const rule& a, std::string_view close, std::string name,
              std::uint32_t max_states) {
  if (close.size() > 63) throw build_error{"rule " + name + ": a closing text of more than 63 bytes"};
  rule out;
  out.name = std::move(name);
  // Bytes of `open` and `close` are classes of their own; the others keep a's classes.
  std::array<bool, 256> literal{};
  for (const unsigned char c : open) literal[c] = true;
  for (const unsigned char c : close) literal[c] = true;
  const auto representative = refine_classes(out, a, literal);
  // A product state: a's state (-1: a refused the bytes), the lengths j of the prefixes of
  // `close` just read from an accepting state of a (bit j), and whether `close` was read whole.
  struct key {
    std::int32_t q;
    std::uint64_t matched;
    bool done;
    auto operator<=>(const key&) const = default;
  };
  // Most states are a's state alone (no part of `close` read): those are found by a's state, the
  // others in a map.
  std::vector<std::int32_t> alone(a.size(), -1);
  std::map<key, std::uint32_t> ids;
  std::vector<key> states;
  auto add = [&](const key& k) -> std::uint32_t {
    const bool by_state = k.q >= 0 && !k.done && (k.matched & ~std::uint64_t{1}) == 0;
    if (by_state && alone[static_cast<std::uint32_t>(k.q)] >= 0) return static_cast<std::uint32_t>(alone[static_cast<std::uint32_t>(k.q)]);
    if (!by_state)
      if (auto it = ids.find(k); it != ids.end()) return it->second;
    if (states.size() + open.size() >= max_states)
      throw build_error{"rule " + out.name + " needs more than " + std::to_string(max_states) + " automaton states"};
    const auto id = static_cast<std::uint32_t>(states.size() + open.size());
    states.push_back(k);
    if (by_state) alone[static_cast<std::uint32_t>(k.q)] = static_cast<std::int32_t>(id);
    else ids.emplace(k, id);
    return id;
  };
  const std::uint64_t whole = std::uint64_t{1} << close.size();
  // The start of a, where `close` may begin at once if a accepts the empty text.
  const key start{0, a.accepting[0] ? 1u : 0u, false};
  auto norm = [&](key k) {
    if (k.matched & whole) {
      k.matched &= ~whole;
      k.done = true;
    }
    return k;
  };
  add(norm(start));
  std::vector<std::uint32_t> a_class(out.classes);
  for (std::uint32_t c = 0; c < out.classes; ++c) a_class[c] = a.byte_class[representative[c]];
  // The rows of the states reading `open` first, then the product's.
  const std::size_t width = out.classes;
  out.next.reserve((open.size() + a.size() + close.size() + 1) * width);
  out.next.assign(open.size() * width, no_state);
  for (std::size_t i = 0; i < states.size(); ++i) {
    const key k = states[i];
    out.next.resize(out.next.size() + width, no_state);
    std::int32_t* row = out.next.data() + (open.size() + i) * width;
    const std::int32_t* a_row = k.q >= 0 ? a.next.data() + std::size_t(k.q) * a.classes : nullptr;
    const bool plain = (k.matched & ~std::uint64_t{1}) == 0;
    for (std::uint32_t c = 0; c < out.classes; ++c) {
      const unsigned b = representative[c];
      key n{-1, 0, false};
      if (a_row) n.q = a_row[a_class[c]];
      if (plain && !literal[b]) {
        // Most steps: no part of `close` read before or after, only a's state moves.
        if (n.q < 0) continue;
        const auto q = static_cast<std::uint32_t>(n.q);
        if (alone[q] < 0 || close.empty()) {
          if (a.accepting[q]) n.matched = 1;
          row[c] = static_cast<std::int32_t>(add(norm(n)));
        } else {
          row[c] = alone[q];
        }
        continue;
      }
      for (std::uint64_t bits = k.matched; bits; bits &= bits - 1) {
        const auto j = static_cast<unsigned>(std::countr_zero(bits));
        if (static_cast<unsigned char>(close[j]) == b) n.matched |= std::uint64_t{2} << j;
      }
      if (n.q >= 0 && a.accepting[static_cast<std::uint32_t>(n.q)]) n.matched |= 1;
      n = norm(n);
      if (n.q < 0 && (n.matched & ~std::uint64_t{1}) == 0 && !n.done) continue;
      row[c] = static_cast<std::int32_t>(add(n));  // add() may grow states, not out.next
    }
  }
  const auto n = static_cast<std::uint32_t>(open.size() + states.size());
  for (std::size_t i = 0; i < open.size(); ++i)
    out.next[i * width + out.byte_class[static_cast<unsigned char>(open[i])]] = static_cast<std::int32_t>(i + 1);
  out.calls.resize(n);
  out.accepting.assign(n, 0);
  out.has_bytes.assign(n, 0);
  for (std::uint32_t st = 0; st < n; ++st) {
    if (st >= open.size()) out.accepting[st] = states[st - open.size()].done;
    for (std::uint32_t c = 0; c < out.classes; ++c)
      if (out.next[std::size_t{st} * out.classes + c] != no_state) out.has_bytes[st] = 1;
  }
  return out;
}

}  // namespace troupe::recipe::grammar
