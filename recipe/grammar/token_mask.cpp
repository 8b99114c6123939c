// Allowed-token masks over a vocabulary trie (token_mask.hpp).
#include "recipe/grammar/token_mask.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "recipe/tokenizer.hpp"

namespace troupe::recipe::grammar {

vocabulary::vocabulary(std::vector<std::string> bytes, const std::vector<bool>& usable, std::vector<std::uint32_t> eos)
    : bytes_(std::move(bytes)), eos_(std::move(eos)) {
  std::vector<std::uint32_t> order;
  for (std::uint32_t id = 0; id < bytes_.size(); ++id)
    if (id < usable.size() && usable[id] && !bytes_[id].empty()) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  trie_.push_back({});
  std::vector<std::uint32_t> path{0};
  const std::string* prev = nullptr;
  for (const auto id : order) {
    const std::string& s = bytes_[id];
    if (s.size() > 0xFFFF) throw std::invalid_argument("vocabulary: a token of more than 65535 bytes");
    max_depth_ = std::max(max_depth_, s.size());
    std::size_t common = 0;
    if (prev)
      while (common < prev->size() && common < s.size() && (*prev)[common] == s[common]) ++common;
    while (path.size() > common + 1) {
      trie_[path.back()].end = static_cast<std::uint32_t>(trie_.size());
      path.pop_back();
    }
    for (std::size_t i = common; i < s.size(); ++i) {
      node n;
      n.byte = static_cast<std::uint8_t>(s[i]);
      n.depth = static_cast<std::uint16_t>(i + 1);
      trie_.push_back(n);
      path.push_back(static_cast<std::uint32_t>(trie_.size() - 1));
    }
    node& n = trie_[path.back()];
    if (n.count == 0) n.first = static_cast<std::uint32_t>(ids_.size());
    ids_.push_back(id);
    ++n.count;
    prev = &s;
  }
  while (!path.empty()) {
    trie_[path.back()].end = static_cast<std::uint32_t>(trie_.size());
    path.pop_back();
  }
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

namespace {

// Walks the trie below a node with a set of stacks. Local mode (returns != nullptr): the stacks
// are rooted at one frame, and a return from it is recorded as a trie node instead of being
// followed. Full mode: a return from the last frame means the output is complete.
struct walker {
  const grammar& g;
  const vocabulary& v;
  std::size_t max_depth;
  const std::vector<std::vector<std::uint8_t>>& plain;  // [rule][state]: no call, not accepting
  std::uint32_t* mask;
  std::vector<std::uint32_t>* returns;

  void mark(std::uint32_t n) const {
    for (const auto id : v.ids_at(n)) mask[id >> 5] |= 1u << (id & 31);
  }

  void walk(std::uint32_t n, std::vector<stack>& ready) const {
    const auto& t = v.trie();
    std::vector<stack> raw;
    if (ready.size() != 1) {
      for (std::uint32_t c = n + 1; c < t[n].end; c = t[c].end) visit(c, ready, raw);
      return;
    }
    // One stack: a plain byte step (to a state with no call, not accepting) leaves the closure
    // the identity, so those are followed here in preorder, keeping only the top frame's state
    // per depth; every other step goes through visit(). Most of a cold walk is this loop.
    frame& top = ready[0].back();
    const std::uint32_t start = top.state;
    const rule& r = g.rules[top.rule];
    const std::int32_t* next = r.next.data();
    const std::uint8_t* byte_class = r.byte_class.data();
    const std::uint32_t classes = r.classes;
    const std::uint8_t* is_plain = plain[top.rule].data();
    // after[d]: the state after the node being walked at depth base + d.
    const std::uint32_t base = t[n].depth;
    std::vector<std::uint32_t> after(v.max_depth() + 1 - base);
    after[0] = start;
    for (std::uint32_t c = n + 1; c < t[n].end;) {
      const vocabulary::node& node = t[c];
      const std::uint32_t d = node.depth - base;
      const std::uint32_t s = after[d - 1];
      const auto nx = next[s * classes + byte_class[node.byte]];
      if (nx == no_state) {
        c = node.end;
      } else if (is_plain[nx]) {
        mark(c);
        after[d] = static_cast<std::uint32_t>(nx);
        ++c;  // the first child, or (a leaf) the next node in preorder
      } else {
        top.state = s;
        visit(c, ready, raw);
        top.state = start;
        c = node.end;
      }
    }
  }

  // Node c's byte after the stacks `ready` (left as they were), then c's subtree; `raw` is
  // scratch.
  void visit(std::uint32_t c, std::vector<stack>& ready, std::vector<stack>& raw) const {
    const auto& t = v.trie();
    const unsigned char b = t[c].byte;
    if (ready.size() == 1) {
      // One stack and a plain byte step (no call, no return): the closure is the identity, so
      // step in place.
      frame& top = ready[0].back();
      const rule& r = g.rules[top.rule];
      const auto nx = r.step(top.state, b);
      if (nx == no_state) return;
      const auto target = static_cast<std::uint32_t>(nx);
      if (plain[top.rule][target]) {
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
      const auto nx = g.rules[s.back().rule].step(s.back().state, b);
      if (nx == no_state) continue;
      stack s2 = s;
      s2.back().state = static_cast<std::uint32_t>(nx);
      raw.push_back(std::move(s2));
    }
    if (raw.empty()) return;
    bool popped = false;
    auto next = close_stacks(g, raw, max_depth, popped);
    if (popped) {
      if (returns)
        returns->push_back(c);
      else
        mark(c);
    }
    if (!next.empty()) {
      mark(c);
      if (t[c].end > c + 1) walk(c, next);
    }
  }
};

}  // namespace

mask_computer::mask_computer(std::shared_ptr<const grammar> g, std::shared_ptr<const vocabulary> v)
    : g_(std::move(g)), v_(std::move(v)) {
  for (const rule& r : g_->rules) {
    auto& p = plain_.emplace_back(r.size());
    auto& f = first_bytes_.emplace_back(r.size());
    std::vector<byte_set> class_bytes(r.classes);
    for (unsigned b = 0; b < 256; ++b) class_bytes[r.byte_class[b]].set(b);
    for (std::uint32_t s = 0; s < r.size(); ++s) {
      p[s] = r.calls[s].empty() && !r.accepting[s];
      for (std::uint32_t c = 0; c < r.classes; ++c)
        if (r.next[s * r.classes + c] != no_state)
          f[s] |= class_bytes[c];
    }
  }
}

std::size_t mask_computer::cached_states() const {
  std::lock_guard lock(mu_);
  return cache_.size();
}

const mask_computer::entry& mask_computer::entry_for(frame f) const {
  const std::uint64_t key = (std::uint64_t{f.rule} << 32) | f.state;
  std::lock_guard lock(mu_);
  auto& slot = cache_[key];
  if (!slot) {
    auto e = std::make_unique<entry>();
    e->accepted.assign(v_->mask_words(), 0);
    std::vector<std::uint32_t> returns;
    walker w{*g_, *v_, matcher_options{}.max_depth, plain_, e->accepted.data(), &returns};
    std::vector<stack> ready{stack{f}};
    w.walk(0, ready);
    // Bucket the children of the return nodes by their byte, so that a mask walks only those
    // whose byte the context takes next (for a number that ends in a return, few of its
    // thousand-odd tokens have a child `+`, `*` or `)`).
    const auto& t = v_->trie();
    std::vector<std::pair<unsigned char, std::uint32_t>> children;
    for (const auto n : returns) {
      const auto ids = v_->ids_at(n);
      e->returned.insert(e->returned.end(), ids.begin(), ids.end());
      for (std::uint32_t c = n + 1; c < t[n].end; c = t[c].end) children.emplace_back(t[c].byte, c);
    }
    std::stable_sort(children.begin(), children.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    e->has_returns = !returns.empty();
    e->after_return.reserve(children.size());
    for (std::size_t i = 0, b = 0; b <= 256; ++b) {
      e->after_return_at[b] = static_cast<std::uint32_t>(i);
      while (b < 256 && i < children.size() && children[i].first == b) e->after_return.push_back(children[i++].second);
    }
    slot = std::move(e);
  }
  return *slot;
}

void mask_computer::fill(const matcher& m, std::span<std::uint32_t> mask) const {
  std::fill(mask.begin(), mask.end(), 0u);
  const auto& st = m.state();
  if (st.complete)
    for (const auto id : v_->eos()) mask[id >> 5] |= 1u << (id & 31);
  for (const stack& s : st.stacks) {
    const entry& e = entry_for(s.back());
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
    walker w{*g_, *v_, m.options().max_depth, plain_, mask.data(), nullptr};
    std::vector<stack> raw;
    for (unsigned b = 0; b < 256; ++b) {
      if (!next.test(b)) continue;
      for (auto i = e.after_return_at[b]; i < e.after_return_at[b + 1]; ++i) w.visit(e.after_return[i], ready, raw);
    }
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
