// Allowed-token masks over a vocabulary trie (token_mask.hpp).
#include "recipe/grammar/token_mask.hpp"

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

#include "recipe/tokenizer.hpp"

namespace troupe::recipe::grammar {

namespace {

// The UTF-8 automaton of text (token_mask.hpp): JSON string text, so no control character, `"`
// or `\` (grammar.hpp's utf8_step otherwise); -1: not text.
constexpr int text_step_of(int u, unsigned b) {
  if (u == 0 && (b < 0x20 || b == '"' || b == '\\')) return -1;
  return utf8_step(u, b);
}

// An ASCII-only class: one state, the class's bytes loop on it.
constexpr int ascii_step_of(unsigned cls, int u, unsigned b) {
  if (u != 0) return -1;
  const bool lower = b >= 'a' && b <= 'z', upper = b >= 'A' && b <= 'Z', digit = b >= '0' && b <= '9';
  switch (cls) {
    case vocabulary::lower: return lower ? 0 : -1;
    case vocabulary::letters: return lower || upper ? 0 : -1;
    case vocabulary::digits: return digit ? 0 : -1;
    case vocabulary::alnum: return lower || upper || digit ? 0 : -1;
    default: return -1;
  }
}

struct class_automaton {
  std::array<std::array<std::int8_t, 256>, 8> next{};
  // Bytes with the same steps from every state share a role: 0 for a byte never in the class.
  std::array<std::uint8_t, 256> role{};
  std::uint8_t roles = 1;
};

constexpr class_automaton make_automaton(unsigned cls) {
  class_automaton t;
  for (int u = 0; u < 8; ++u)
    for (unsigned b = 0; b < 256; ++b)
      t.next[u][b] = static_cast<std::int8_t>(cls == vocabulary::json_text ? text_step_of(u, b) : ascii_step_of(cls, u, b));
  for (unsigned b = 0; b < 256; ++b) {
    bool text = false;
    for (int u = 0; u < 8; ++u) text = text || t.next[u][b] >= 0;
    if (!text) continue;
    for (unsigned a = 0; a < b && t.role[b] == 0; ++a) {
      bool same = t.role[a] != 0;
      for (int u = 0; u < 8 && same; ++u) same = t.next[u][a] == t.next[u][b];
      if (same) t.role[b] = t.role[a];
    }
    if (t.role[b] == 0) t.role[b] = t.roles++;
  }
  return t;
}

constexpr std::array<class_automaton, vocabulary::text_classes> automata{
    make_automaton(vocabulary::json_text), make_automaton(vocabulary::lower), make_automaton(vocabulary::letters),
    make_automaton(vocabulary::digits), make_automaton(vocabulary::alnum)};

constexpr unsigned no_text = ~0u;

// The characters of a token of the class (a trailing partial one counts), or no_text.
unsigned text_chars(unsigned cls, const std::string& s) {
  unsigned chars = 0;
  int u = 0;
  for (const char c : s) {
    if (u == 0) ++chars;
    u = automata[cls].next[u][static_cast<unsigned char>(c)];
    if (u < 0) return no_text;
  }
  return chars;
}

}  // namespace


vocabulary::vocabulary(std::vector<std::string> bytes, const std::vector<bool>& usable, std::vector<std::uint32_t> eos)
    : bytes_(std::move(bytes)), eos_(std::move(eos)) {
  std::vector<std::uint32_t> order;
  usable_.assign(mask_words(), 0);
  text_tokens_.assign(mask_words(), 0);
  for (std::uint32_t id = 0; id < bytes_.size(); ++id) {
    const std::string& s = bytes_[id];
    if (id >= usable.size() || !usable[id] || s.empty() ||
        std::any_of(s.begin(), s.end(), [](char c) { return is_symbol_byte(static_cast<unsigned char>(c)); }))
      continue;
    order.push_back(id);
    usable_[id >> 5] |= 1u << (id & 31);
    if (s.find(static_cast<char>(dsml_byte)) == std::string::npos) text_tokens_[id >> 5] |= 1u << (id & 31);
  }
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  for (auto& c : classes_) {
    c.masks.assign((text_mask_chars + 2) * mask_words(), 0);
    c.counts.assign(text_mask_chars + 2, 0);
    c.cover.push_back(0);  // the root
  }
  trie_.push_back({});
  std::vector<std::uint32_t> path{0};
  // A node's subtree is complete when it leaves the path: its covers then go to its parent.
  const auto pop = [&] {
    const std::uint32_t done = path.back();
    trie_[done].end = static_cast<std::uint32_t>(trie_.size());
    path.pop_back();
    if (!path.empty())
      for (auto& c : classes_) c.cover[path.back()] = std::max(c.cover[path.back()], c.cover[done]);
  };
  const std::string* prev = nullptr;
  for (const auto id : order) {
    const std::string& s = bytes_[id];
    if (s.size() > 0xFFFF) throw std::invalid_argument("vocabulary: a token of more than 65535 bytes");
    max_depth_ = std::max(max_depth_, s.size());
    std::size_t common = 0;
    if (prev)
      while (common < prev->size() && common < s.size() && (*prev)[common] == s[common]) ++common;
    while (path.size() > common + 1) pop();
    for (std::size_t i = common; i < s.size(); ++i) {
      node n;
      n.byte = static_cast<std::uint8_t>(s[i]);
      n.depth = static_cast<std::uint16_t>(i + 1);
      trie_.push_back(n);
      for (auto& c : classes_) c.cover.push_back(0);
      path.push_back(static_cast<std::uint32_t>(trie_.size() - 1));
    }
    node& n = trie_[path.back()];
    if (n.count == 0) n.first = static_cast<std::uint32_t>(ids_.size());
    ids_.push_back(id);
    ++n.count;
    prev = &s;
    for (unsigned cls = 0; cls < text_classes; ++cls) {
      auto& c = classes_[cls];
      const unsigned chars = text_chars(cls, s);
      auto& cover = c.cover[path.back()];
      cover = std::max(cover, chars == no_text ? not_text : static_cast<std::uint8_t>(std::min<unsigned>(chars, any_text)));
      if (chars == no_text) continue;
      c.max_chars = std::max(c.max_chars, chars);
      // In mask `chars` when that one is kept (accumulated below), and in the mask of all.
      const auto put = [&](unsigned k) {
        c.masks[k * mask_words() + (id >> 5)] |= 1u << (id & 31);
        ++c.counts[k];
      };
      if (chars <= text_mask_chars) put(chars);
      put(text_mask_chars + 1);
    }
  }
  while (!path.empty()) pop();
  // Mask k holds the tokens of at most k characters.
  for (auto& c : classes_)
    for (unsigned k = 1; k <= text_mask_chars; ++k) {
      for (std::size_t i = 0; i < mask_words(); ++i) c.masks[k * mask_words() + i] |= c.masks[(k - 1) * mask_words() + i];
      c.counts[k] += c.counts[k - 1];
    }
}

std::span<const std::uint32_t> vocabulary::find(std::string_view text) const {
  std::uint32_t n = 0;
  for (const char ch : text) {
    const auto b = static_cast<std::uint8_t>(ch);
    std::uint32_t c = n + 1;
    while (c < trie_[n].end && trie_[c].byte != b) c = trie_[c].end;
    if (c >= trie_[n].end) return {};
    n = c;
  }
  return n == 0 ? std::span<const std::uint32_t>{} : ids_at(n);
}

vocabulary vocabulary::from_tokenizer(const tokenizer& tok) {
  const std::size_t n = tok.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<bool> usable(n);
  for (std::uint32_t id = 0; id < n; ++id) {
    const token_id one[] = {id};
    bytes[id] = tok.decode_bytes(one);
    usable[id] = !tok.is_added(id) && bytes[id].find(static_cast<char>(dsml_byte)) == std::string::npos;
  }
  if (auto dsml = tok.token_to_id("｜DSML｜")) {
    bytes[*dsml] = std::string(1, static_cast<char>(dsml_byte));
    usable[*dsml] = true;
  }
  std::vector<std::uint32_t> eos;
  if (auto id = tok.token_to_id("<｜end▁of▁sentence｜>")) eos.push_back(*id);
  return vocabulary(std::move(bytes), usable, std::move(eos));
}

token_names names_of(std::shared_ptr<const vocabulary> v, std::map<std::string, std::uint32_t, std::less<>> added) {
  token_names n;
  n.vocab_size = static_cast<std::uint32_t>(v->size());
  n.eos = v->eos();
  n.id_of = [added = std::move(added), v](std::string_view s) -> std::optional<std::uint32_t> {
    if (auto it = added.find(s); it != added.end()) return it->second;
    if (const auto ids = v->find(s); !ids.empty()) return ids.front();
    return std::nullopt;
  };
  return n;
}

token_names names_of(std::shared_ptr<const vocabulary> v, const tokenizer& tok) {
  std::map<std::string, std::uint32_t, std::less<>> added;
  for (std::uint32_t id = 0; id < tok.vocab_size(); ++id)
    if (tok.is_added(id)) {
      const token_id one[] = {id};
      added.emplace(tok.decode(one), id);
    }
  return names_of(std::move(v), std::move(added));
}

namespace {

// What a step to a state leaves to do (mask_computer::kind_): nothing (no call edge, not
// accepting), a return (accepting, no call edge), or calls.
constexpr std::uint8_t step_calls = 0, step_plain = 1, step_return = 2;

// Whether a budget of the top frame of `s` can refuse a byte of the token being read or leave
// the frame unable to go on after it: a last token, or no more characters left than a token's
// bytes (`longest`). Otherwise the walks may step it as a frame without budgets.
inline bool budget_bites(const grammar& g, std::size_t longest, const stack& s) {
  const rule& r = g.rules[s.back().rule];
  return r.budgeted() &&
         ((r.max_tokens != no_budget && s.tokens_left() <= 1) || (r.max_chars != no_budget && s.chars <= longest));
}

// Whether a stack the closure kept (it may take a byte now, within a token) may still take one
// after the token ends: a top frame that spent its last token in it may not.
bool rests(const grammar& g, const stack& s) {
  if (!s.charged()) return true;
  stack after = s;
  after.tokens &= ~stack::charged_bit;
  return can_step(g, after);
}

// Walks the trie below a node with a set of stacks. Local mode (returns != nullptr): the stacks
// are rooted at one frame, and a return from it is recorded as a trie node instead of being
// followed. Full mode: a return from the last frame means the output is complete.
struct walker {
  const grammar& g;
  const vocabulary& v;
  std::size_t max_depth;
  const std::vector<std::vector<std::uint8_t>>& kinds;  // [rule][state]: step_plain, ...
  std::uint32_t* mask;
  std::vector<std::uint32_t>* returns;
  // The closures of the stacks stepped so far in this walk: (stacks waiting, popped).
  std::map<std::vector<stack>, std::pair<std::vector<stack>, bool>>& closures;
  // Subtrees of the tokens of a text class of at most `budget` characters (`cover`: the class's
  // per node) are skipped: their ids are in the mask already or refused
  // (mask_computer::text_budget_of). 0 in the walks below a return.
  std::uint8_t budget = 0;
  const std::uint8_t* cover = nullptr;

  void mark(std::uint32_t n) const {
    for (const auto id : v.ids_at(n)) mask[id >> 5] |= 1u << (id & 31);
  }

  bool bites(const stack& s) const { return budget_bites(g, v.max_depth(), s); }

  void walk(std::uint32_t n, std::vector<stack>& ready) const {
    const auto& t = v.trie();
    std::vector<stack> raw;
    if (ready.size() != 1 || bites(ready[0])) {
      for (std::uint32_t c = n + 1; c < t[n].end; c = t[c].end) visit(c, ready, raw);
      return;
    }
    // One stack: a plain byte step (to a state with no call, not accepting) leaves the closure
    // the identity, so those are followed here in preorder, keeping only the top frame's state
    // per depth; so is a step that can return when the frame is the stack's only one (a number
    // of the frame's rule, say). Every other step goes through visit(). Most of a cold walk is
    // this loop.
    if (budget)
      walk_one<true>(n, ready, raw);
    else
      walk_one<false>(n, ready, raw);
  }

  // walk() with one stack; Skip: subtrees of short text tokens are skipped (`budget`), a test
  // per node that costs a sixth of the loop where nothing is skipped.
  template <bool Skip>
  void walk_one(std::uint32_t n, std::vector<stack>& ready, std::vector<stack>& raw) const {
    const auto& t = v.trie();
    frame& top = ready[0].back();
    const rule& r = g.rules[top.rule];
    const std::int32_t* next = r.next.data();
    const std::uint8_t* byte_class = r.byte_class.data();
    const std::uint32_t classes = r.classes;
    const std::uint8_t* kind = kinds[top.rule].data();
    const std::uint8_t skip = budget;
    // after[d]: the state after the node being walked at depth base + d.
    const std::uint32_t base = t[n].depth;
    std::vector<std::uint32_t> after(v.max_depth() + 1 - base);
    after[0] = top.state;
    for (std::uint32_t c = n + 1; c < t[n].end;) {
      const vocabulary::node& node = t[c];
      if (Skip && cover[c] <= skip) {
        c = node.end;
        continue;
      }
      const std::uint32_t d = node.depth - base;
      const auto nx = next[after[d - 1] * classes + byte_class[node.byte]];
      if (nx == no_state) {
        c = node.end;
      } else if (kind[nx] == step_plain) {
        mark(c);
        after[d] = static_cast<std::uint32_t>(nx);
        ++c;  // the first child, or (a leaf) the next node in preorder
      } else {
        c = other_step(c, static_cast<std::uint32_t>(nx), after.data() + d, ready, raw);
      }
    }
  }

  // walk()'s step at node c to state nx of its one stack's top frame that is not plain (after[-1]
  // the state before it, after[0] set when the walk goes below c); the next node to walk. Out of
  // walk()'s loop, which keeps its registers for the plain steps.
  [[gnu::noinline]] std::uint32_t other_step(std::uint32_t c, std::uint32_t nx, std::uint32_t* after,
                                             std::vector<stack>& ready, std::vector<stack>& raw) const {
    frame& top = ready[0].back();
    if (kinds[top.rule][nx] == step_return && ready[0].size() == 1) {
      // The only frame returns: the output is complete, or (local mode) the return is
      // recorded; the frame also goes on where bytes leave the state.
      if (returns)
        returns->push_back(c);
      else
        mark(c);
      if (!g.rules[top.rule].has_bytes[nx]) return v.trie()[c].end;
      mark(c);
      after[0] = nx;
      return c + 1;
    }
    const std::uint32_t start = top.state;
    top.state = after[-1];
    visit(c, ready, raw);
    top.state = start;
    return v.trie()[c].end;
  }

  // Node c's byte after the stacks `ready` (left as they were), then c's subtree; `raw` is
  // scratch.
  void visit(std::uint32_t c, std::vector<stack>& ready, std::vector<stack>& raw) const {
    const auto& t = v.trie();
    const unsigned char b = t[c].byte;
    if (ready.size() == 1 && !bites(ready[0])) {
      // One stack and a plain byte step (no call, no return): the closure is the identity, so
      // step in place.
      frame& top = ready[0].back();
      const rule& r = g.rules[top.rule];
      const auto nx = r.step(top.state, b);
      if (nx == no_state) return;
      const auto target = static_cast<std::uint32_t>(nx);
      if (kinds[top.rule][target] == step_plain) {
        const std::uint32_t saved = top.state;
        top.state = target;
        mark(c);
        if (t[c].end > c + 1) walk(c, ready);
        ready[0].back().state = saved;
        return;
      }
    }
    raw.clear();
    for (const stack& s : ready) {
      if (g.rules[s.back().rule].step(s.back().state, b) == no_state) continue;  // before copying
      stack s2 = s;
      if (step_top(g, s2, b)) raw.push_back(std::move(s2));
    }
    if (raw.empty()) return;
    if (raw.size() == 1 && !bites(raw[0])) {
      // Of several stacks one took the byte; to a plain state, its closure is itself, and the
      // walk below goes on with one stack (raw is the caller's scratch, free until this returns).
      const frame top = raw[0].back();
      if (kinds[top.rule][top.state] == step_plain && g.rules[top.rule].has_bytes[top.state]) {
        mark(c);
        if (t[c].end > c + 1) walk(c, raw);
        return;
      }
    }
    // The same stacks are closed again and again below one state (after each whitespace byte
    // before a value, say), so the closures are kept for the walk.
    auto it = closures.find(raw);
    if (it == closures.end()) {
      bool popped = false;
      auto closed = close_stacks(g, raw, max_depth, popped);
      it = closures.emplace(std::move(raw), std::pair{std::move(closed), popped}).first;
    }
    const bool popped = it->second.second;
    // A copy: the walk below changes its stacks' states for a while.
    std::vector<stack> next = it->second.first;
    if (popped) {
      if (returns)
        returns->push_back(c);
      else
        mark(c);
    }
    if (!next.empty()) {
      // A token ending here leaves some stack that goes on (not one whose last token it was).
      if (std::any_of(next.begin(), next.end(), [&](const stack& s) { return rests(g, s); })) mark(c);
      if (t[c].end > c + 1) walk(c, next);
    }
  }

  // Local mode, the one frame of `s`, of a rule with a budget that bites: the trie below node n,
  // stepping it as the matcher does (a leaf rule: its steps are plain or may return).
  void walk_budgeted(std::uint32_t n, const stack& s) const {
    const auto& t = v.trie();
    for (std::uint32_t c = n + 1; c < t[n].end; c = t[c].end) {
      if (g.rules[s.back().rule].step(s.back().state, t[c].byte) == no_state) continue;  // before copying
      stack h = s;
      if (!step_top(g, h, t[c].byte)) continue;
      const frame f = h.back();
      if (g.rules[f.rule].accepting[f.state]) returns->push_back(c);
      stack after = h;  // once a token ends here: may the frame go on?
      after.tokens &= ~stack::charged_bit;
      if (can_step(g, after)) mark(c);
      if (t[c].end > c + 1 && g.rules[f.rule].has_bytes[f.state]) walk_budgeted(c, h);
    }
  }
};

}  // namespace

mask_computer::mask_computer(std::shared_ptr<const grammar> g, std::shared_ptr<const vocabulary> v)
    : g_(std::move(g)), v_(std::move(v)) {
  for (const rule& r : g_->rules) {
    // Bytes the rule and the UTF-8 automaton of text both tell apart: one of each kind.
    auto& tbs = text_bytes_.emplace_back();
    for (unsigned cls = 0; cls < vocabulary::text_classes; ++cls) {
      const auto& a = automata[cls];
      auto& tb = tbs[cls];
      std::vector<std::uint8_t> seen(std::size_t{r.classes} * a.roles);
      for (unsigned b = 0; b < 256; ++b) {
        if (a.role[b] == 0) continue;
        auto& s = seen[std::size_t{r.byte_class[b]} * a.roles + a.role[b]];
        if (s) continue;
        s = 1;
        (a.next[0][b] >= 0 ? tb.first : tb.inner).push_back(static_cast<unsigned char>(b));
      }
    }
    auto& k = kind_.emplace_back(r.size());
    auto& f = first_bytes_.emplace_back(r.size());
    std::vector<byte_set> class_bytes(r.classes);
    for (unsigned b = 0; b < 256; ++b) class_bytes[r.byte_class[b]].set(b);
    for (std::uint32_t s = 0; s < r.size(); ++s) {
      k[s] = !r.calls[s].empty() ? step_calls : r.accepting[s] ? step_return : step_plain;
      for (std::uint32_t c = 0; c < r.classes; ++c)
        if (r.next[s * r.classes + c] != no_state)
          f[s] |= class_bytes[c];
    }
  }
  for (const token_symbol& t : g_->symbols) {
    auto& mask = symbol_masks_.emplace_back(v_->mask_words(), 0u);
    if (t.any) mask = v_->text_tokens();
    for (const auto id : t.ids) {
      if (id >= v_->size()) continue;
      if (t.any) mask[id >> 5] &= ~(1u << (id & 31));
      else mask[id >> 5] |= 1u << (id & 31);
    }
  }
}

void mask_computer::readings(std::uint32_t id, std::vector<std::string_view>& out) const {
  out.clear();
  if (v_->usable(id)) out.push_back(v_->bytes(id));
  for (std::size_t i = 0; i < g_->symbols.size(); ++i)
    if ((symbol_masks_[i][id >> 5] >> (id & 31)) & 1)
      out.emplace_back(reinterpret_cast<const char*>(&g_->symbols[i].byte), 1);
}

bool mask_computer::accept(matcher& m, std::uint32_t id) const {
  if (id >= v_->size()) return false;
  if (g_->symbols.empty()) return v_->usable(id) && m.accept_token(v_->bytes(id));
  std::vector<std::string_view> texts;
  readings(id, texts);
  return m.accept_any(texts);
}

bool mask_computer::can_accept(const matcher& m, std::uint32_t id) const {
  if (id >= v_->size()) return false;
  if (g_->symbols.empty()) return v_->usable(id) && m.can_accept(v_->bytes(id));
  std::vector<std::string_view> texts;
  readings(id, texts);
  return std::any_of(texts.begin(), texts.end(), [&](std::string_view t) { return m.can_accept(t); });
}

mask_computer::entry_key mask_computer::key_of(const stack& s) const {
  const frame f = s.back();
  const rule& r = g_->rules[f.rule];
  const auto longest = static_cast<std::uint32_t>(v_->max_depth());
  return {f.rule, f.state, r.max_tokens == no_budget ? 0 : std::min(s.tokens_left(), 2u),
          r.max_chars == no_budget ? 0 : std::min(s.chars, longest + 1)};
}

bool mask_computer::is_warm(const matcher& m) const {
  std::lock_guard lock(mu_);
  return std::all_of(m.state().stacks.begin(), m.state().stacks.end(),
                     [&](const stack& s) { return cache_.contains(key_of(s)); });
}

std::size_t mask_computer::warm_all(std::size_t max_frames) const {
  std::vector<stack> frames;
  for (std::uint32_t r = 0; r < g_->rules.size(); ++r)
    for (std::uint32_t s = 0; s < g_->rules[r].size(); ++s)
      if (g_->rules[r].has_bytes[s]) {
        stack one;
        enter(*g_, one, r);
        one.back().state = s;
        frames.push_back(std::move(one));
      }
  if (frames.size() > max_frames) return 0;
  for (const stack& f : frames) entry_for(f);
  return frames.size();
}

bool mask_computer::warm(const matcher& m) const {
  if (is_warm(m)) return false;
  for (const stack& s : m.state().stacks) entry_for(s);
  return true;
}

std::size_t mask_computer::cached_states() const {
  std::lock_guard lock(mu_);
  return cache_.size();
}

mask_computer::text_budget mask_computer::text_budget_of(frame f) const {
  // JSON text holds the others: when it spares anything beyond one character, it spares the
  // most; otherwise (a pattern's characters, a format's) the class whose skipped tokens are the
  // most.
  text_budget best = class_budget(f, vocabulary::json_text);
  if (best.skipped == vocabulary::any_text || best.accepted >= 2) return best;
  std::uint32_t spared = v_->text_count(best.cls, best.skipped);
  for (unsigned cls = 1; cls < vocabulary::text_classes; ++cls) {
    const text_budget b = class_budget(f, cls);
    if (const auto n = v_->text_count(cls, b.skipped); n > spared) {
      best = b;
      spared = n;
    }
  }
  return best;
}

mask_computer::text_budget mask_computer::class_budget(frame f, unsigned cls) const {
  // The (rule state, class automaton state) pairs after exactly c characters, level by level: a
  // byte of the class that leads nowhere or to a state that is not plain fails the texts of its
  // character count.
  const rule& r = g_->rules[f.rule];
  const auto& kind = kind_[f.rule];
  const auto capped = [](unsigned k) {
    return static_cast<std::uint8_t>(std::min(k, vocabulary::text_mask_chars));
  };
  constexpr unsigned unseen = ~0u;
  std::vector<unsigned> level_of(std::size_t{r.size()} * 8, unseen);
  std::vector<std::uint32_t> seeds{f.state * 8}, level, next;
  // Past text_mask_chars the answer is only whether every text passes: the levels repeat by
  // then, or the rule counts characters and {text_mask_chars, text_mask_chars} is as good.
  const unsigned max_chars = v_->max_text_chars(cls);
  const auto& bytes = text_bytes_[f.rule][cls];
  for (unsigned c = 0; c <= std::min(max_chars, vocabulary::text_mask_chars); ++c) {
    level = seeds;
    for (const auto p : level) level_of[p] = c;
    next.clear();
    bool fail_here = false, fail_next = false, lead_taken = false;
    for (std::size_t i = 0; i < level.size(); ++i) {  // grows with the steps inside a character
      const std::uint32_t q = level[i] / 8;
      const int u = static_cast<int>(level[i] % 8);
      for (const unsigned char b : u == 0 ? bytes.first : bytes.inner) {
        const int u2 = automata[cls].next[u][b];
        if (u2 < 0) continue;
        const auto q2 = r.step(q, b);
        if (u == 0 && q2 != no_state) lead_taken = true;
        if (q2 == no_state || kind[static_cast<std::uint32_t>(q2)] != step_plain) {
          (u == 0 ? fail_next : fail_here) = true;
          continue;
        }
        const std::uint32_t to = static_cast<std::uint32_t>(q2) * 8 + static_cast<std::uint32_t>(u2);
        if (u != 0) {
          if (level_of[to] != c) {
            level_of[to] = c;
            level.push_back(to);
          }
        } else if (level_of[to] != c + 1) {
          level_of[to] = c + 1;
          next.push_back(to);
        }
      }
    }
    // Every text of up to c - 1 characters passed; one of c characters failed.
    if (fail_here) return {cls, capped(c - 1), capped(c - 1)};
    if (fail_next) {
      // Every text of up to c characters passes, and none of more when no state took a
      // character's first byte: then no text-only subtree needs walking.
      if (!lead_taken && c <= vocabulary::text_mask_chars) return {cls, capped(c), vocabulary::any_text};
      return {cls, capped(c), capped(c)};
    }
    // The same pairs again: the levels repeat, every text passes.
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    if (next == seeds) break;
    seeds.swap(next);
    if (c == vocabulary::text_mask_chars && c < max_chars) return {cls, capped(c), capped(c)};
  }
  return {cls, vocabulary::any_text, vocabulary::any_text};
}

const mask_computer::entry& mask_computer::entry_for(const stack& s) const {
  const entry_key key = key_of(s);
  {
    std::lock_guard lock(mu_);
    if (const auto it = cache_.find(key); it != cache_.end()) return *it->second;
  }
  // The walks start from the top frame alone (with its budget).
  stack top{s.back()};
  top.tokens = s.tokens;
  top.chars = s.chars;
  const frame f = top.back();
  // Built without the lock: a first mask takes up to a few hundred µs, and meanwhile other
  // threads' masks of this grammar (the device's, the constraint table's warming thread's) go
  // on. Two threads may build the same entry; the first one kept wins.
  {
    auto e = std::make_unique<entry>();
    e->accepted.assign(v_->mask_words(), 0);
    std::vector<std::uint32_t> returns;
    const bool bites = budget_bites(*g_, v_->max_depth(), top);
    const text_budget budget = bites ? text_budget{} : text_budget_of(f);
    if (budget.accepted > 0) {
      const std::uint32_t* text = v_->text_mask(budget.cls, budget.accepted);
      for (std::size_t i = 0; i < e->accepted.size(); ++i) e->accepted[i] |= text[i];
    }
    std::map<std::vector<stack>, std::pair<std::vector<stack>, bool>> closures;
    walker w{*g_, *v_, matcher_options{}.max_depth, kind_, e->accepted.data(), &returns, closures, budget.skipped,
             v_->cover(budget.cls)};
    if (bites) {
      w.walk_budgeted(0, top);
    } else {
      std::vector<stack> ready{top};
      w.walk(0, ready);
    }
    // Bucket the children of the return nodes by their byte, so that a mask walks only those
    // whose byte the context takes next (for a number that ends in a return, few of its
    // thousand-odd tokens have a child `+`, `*` or `)`).
    // Eight words at a time: most of a sparse entry's are zero.
    const std::uint32_t* acc = e->accepted.data();
    const auto words = static_cast<std::uint32_t>(e->accepted.size());
    for (std::uint32_t i = 0; i < words && e->nonzero.size() * 4 < words; i += 8) {
      const std::uint32_t end = std::min(i + 8, words);
      std::uint32_t any = 0;
      for (std::uint32_t j = i; j < end; ++j) any |= acc[j];
      if (any)
        for (std::uint32_t j = i; j < end; ++j)
          if (acc[j]) e->nonzero.push_back(j);
    }
    e->sparse = e->nonzero.size() * 4 < words;
    if (e->sparse) {  // kept as the non-zero words only: 16 KiB less for most states
      std::vector<std::uint32_t> values;
      values.reserve(e->nonzero.size());
      for (const auto i : e->nonzero) values.push_back(acc[i]);
      e->accepted = std::move(values);
    } else {
      e->nonzero = {};
    }
    // A counting sort: children counted by byte, then placed in return order.
    const auto& t = v_->trie();
    std::array<std::uint32_t, 257> at{};
    for (const auto n : returns) {
      const auto ids = v_->ids_at(n);
      e->returned.insert(e->returned.end(), ids.begin(), ids.end());
      for (std::uint32_t c = n + 1; c < t[n].end; c = t[c].end) ++at[t[c].byte + 1];
    }
    for (unsigned b = 0; b < 256; ++b) at[b + 1] += at[b];
    e->after_return_at = at;
    e->after_return.resize(at[256]);
    for (const auto n : returns)
      for (std::uint32_t c = n + 1; c < t[n].end; c = t[c].end) e->after_return[at[t[c].byte]++] = c;
    e->has_returns = !returns.empty();
    std::lock_guard lock(mu_);
    auto& slot = cache_[key];
    if (!slot) slot = std::move(e);
    return *slot;
  }
}

void mask_computer::fill(const matcher& m, std::span<std::uint32_t> mask) const {
  std::fill(mask.begin(), mask.end(), 0u);
  const auto& st = m.state();
  if (st.complete)
    for (const auto id : v_->eos()) mask[id >> 5] |= 1u << (id & 31);
  for (const stack& s : st.stacks) {
    const entry& e = entry_for(s);
    if (e.sparse)
      for (std::size_t k = 0; k < e.nonzero.size(); ++k) mask[e.nonzero[k]] |= e.accepted[k];
    else
      for (std::size_t i = 0; i < mask.size(); ++i) mask[i] |= e.accepted[i];
    if (!e.has_returns) continue;
    // What follows a return from the top frame depends on the frames below it.
    stack parent(s.begin(), s.end() - 1);
    bool popped = parent.empty();
    std::vector<stack> ready;
    if (!parent.empty()) ready = close_stacks(*g_, {parent}, m.options().max_depth, popped);
    if (ready.empty() && !popped) continue;
    // A token that ends where the frame returns leaves the context's stacks (or a complete
    // output) behind.
    for (const auto id : e.returned) mask[id >> 5] |= 1u << (id & 31);
    if (ready.empty()) continue;
    byte_set next;
    for (const stack& r : ready)
      next |= first_bytes_[r.back().rule][r.back().state];
    std::map<std::vector<stack>, std::pair<std::vector<stack>, bool>> closures;
    walker w{*g_, *v_, m.options().max_depth, kind_, mask.data(), nullptr, closures};
    std::vector<stack> raw;
    for (unsigned b = 0; b < 256; ++b) {
      if (!next.test(b)) continue;
      for (auto i = e.after_return_at[b]; i < e.after_return_at[b + 1]; ++i) w.visit(e.after_return[i], ready, raw);
    }
  }
  // The tokens the state takes whole, as a symbol.
  for (std::size_t i = 0; i < g_->symbols.size(); ++i) {
    if (!m.can_accept(std::string_view(reinterpret_cast<const char*>(&g_->symbols[i].byte), 1))) continue;
    const auto& sm = symbol_masks_[i];
    for (std::size_t w = 0; w < mask.size() && w < sm.size(); ++w) mask[w] |= sm[w];
  }
}

std::vector<std::uint32_t> mask_computer::allowed(const matcher& m) const {
  std::vector<std::uint32_t> mask(v_->mask_words());
  fill(m, mask);
  std::vector<std::uint32_t> ids;
  for (std::uint32_t id = 0; id < v_->size(); ++id)
    if ((mask[id >> 5] >> (id & 31)) & 1) ids.push_back(id);
  return ids;
}

}  // namespace troupe::recipe::grammar
