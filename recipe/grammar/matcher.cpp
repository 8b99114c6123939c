// The stack matcher (matcher.hpp).
#include "recipe/grammar/matcher.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>

namespace troupe::recipe::grammar {

bool charge(const rule& r, stack& s, unsigned char b) {
  const bool token = r.max_tokens != no_budget && !s.charged();
  const bool ch = r.max_chars != no_budget && starts_char(b);
  if ((token && s.tokens == 0) || (ch && s.chars == 0)) return false;
  if (token) s.tokens = (s.tokens - 1) | stack::charged_bit;
  if (ch) --s.chars;
  return true;
}

bool can_step(const grammar& g, const stack& s) {
  const frame f = s.back();
  const rule& r = g.rules[f.rule];
  if (!r.has_bytes[f.state]) return false;
  if (!r.budgeted()) return true;
  if (r.max_tokens != no_budget && s.tokens == 0) return false;  // spent, and not by this token
  if (r.max_chars == no_budget || s.chars > 0) return true;
  // No character left: only the rest of one begun.
  for (unsigned b = 0x80; b <= 0xBF; ++b)
    if (r.step(f.state, static_cast<unsigned char>(b)) != no_state) return true;
  return false;
}

bool end_token(const grammar& g, std::vector<stack>& stacks) {
  bool any = false;
  for (const stack& s : stacks) any = any || s.charged();
  if (!any) return false;
  std::vector<stack> kept;
  kept.reserve(stacks.size());
  for (stack& s : stacks) {
    s.tokens &= ~stack::charged_bit;
    if (can_step(g, s)) kept.push_back(std::move(s));
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  stacks = std::move(kept);
  return true;
}

std::vector<stack> close_stacks(const grammar& g, std::vector<stack> raw, std::size_t max_depth, bool& popped) {
  std::vector<stack> ready, seen;
  while (!raw.empty()) {
    stack s = std::move(raw.back());
    raw.pop_back();
    if (s.size() > max_depth || std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
    seen.push_back(s);
    const frame top = s.back();
    const rule& r = g.rules[top.rule];
    if (r.has_bytes[top.state] && (!r.budgeted() || can_step(g, s))) ready.push_back(s);
    for (const call_edge& c : r.calls[top.state]) {
      stack t = s;
      if (r.accepting[c.target] && !r.has_bytes[c.target] && r.calls[c.target].empty()) {
        // A tail call: the caller would only return after it, so the callee takes its frame
        // (right recursion such as `list ::= item list | item` does not deepen the stack).
        enter(g, t, c.rule, true);
      } else {
        t.back().state = c.target;
        enter(g, t, c.rule);
      }
      raw.push_back(std::move(t));
    }
    if (r.accepting[top.state]) {
      s.pop_back();
      s.tokens = s.chars = 0;  // the frame below has no budget (it made a call)
      if (s.empty())
        popped = true;
      else
        raw.push_back(std::move(s));
    }
  }
  std::sort(ready.begin(), ready.end());
  ready.erase(std::unique(ready.begin(), ready.end()), ready.end());
  return ready;
}

matcher::matcher(std::shared_ptr<const grammar> g, matcher_options opt) : g_(std::move(g)), opt_(opt) {
  bool popped = false;
  stack start;
  enter(*g_, start, g_->root);
  state_.stacks = close_stacks(*g_, {start}, opt_.max_depth, popped);
  state_.complete = popped;
}

std::optional<match_state> matcher::advance(const match_state& from, std::string_view bytes) const {
  match_state cur = from;
  for (const char ch : bytes) {
    const auto b = static_cast<unsigned char>(ch);
    std::vector<stack> raw;
    for (const stack& s : cur.stacks) {
      if (g_->rules[s.back().rule].step(s.back().state, b) == no_state) continue;  // before copying
      stack n = s;
      if (step_top(*g_, n, b)) raw.push_back(std::move(n));
    }
    if (raw.empty()) return std::nullopt;
    bool popped = false;
    cur.stacks = close_stacks(*g_, std::move(raw), opt_.max_depth, popped);
    cur.complete = popped;
    if (cur.stacks.empty() && !cur.complete) return std::nullopt;
  }
  if (end_token(*g_, cur.stacks) && cur.stacks.empty() && !cur.complete) return std::nullopt;
  return cur;
}

bool matcher::accept_token(std::string_view bytes) {
  auto next = advance(state_, bytes);
  if (!next) return false;
  history_.push_back(std::move(state_));
  if (history_.size() > opt_.max_rollback) history_.erase(history_.begin());
  state_ = std::move(*next);
  return true;
}

bool matcher::accept_any(std::span<const std::string_view> texts) {
  std::optional<match_state> next;
  for (const auto t : texts) {
    auto n = advance(state_, t);
    if (!n) continue;
    if (!next) {
      next = std::move(n);
      continue;
    }
    next->complete = next->complete || n->complete;
    std::vector<stack> merged;
    std::set_union(next->stacks.begin(), next->stacks.end(), n->stacks.begin(), n->stacks.end(),
                   std::back_inserter(merged));
    next->stacks = std::move(merged);
  }
  if (!next) return false;
  history_.push_back(std::move(state_));
  if (history_.size() > opt_.max_rollback) history_.erase(history_.begin());
  state_ = std::move(*next);
  return true;
}

bool matcher::can_accept(std::string_view bytes) const { return advance(state_, bytes).has_value(); }

matcher matcher::without_history() const {
  matcher m(*this, 0);
  return m;
}

bool matcher::rollback(std::size_t k) {
  if (k > history_.size()) return false;
  if (k == 0) return true;
  state_ = std::move(history_[history_.size() - k]);
  history_.resize(history_.size() - k);
  return true;
}

namespace {
constexpr char magic[4] = {'T', 'G', 'S', '2'};

void put(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

struct reader {
  std::string_view in;
  bool ok = true;
  std::uint64_t get(int bytes) {
    if (in.size() < static_cast<std::size_t>(bytes)) {
      ok = false;
      return 0;
    }
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t{static_cast<unsigned char>(in[static_cast<std::size_t>(i)])} << (8 * i);
    in.remove_prefix(static_cast<std::size_t>(bytes));
    return v;
  }
};
}  // namespace

std::string matcher::serialize() const {
  std::string out(magic, 4);
  put(out, g_->fingerprint(), 8);
  put(out, state_.complete ? 1 : 0, 1);
  put(out, state_.stacks.size(), 4);
  for (const stack& s : state_.stacks) {
    put(out, s.size(), 4);
    for (const frame& f : s) {
      put(out, f.rule, 4);
      put(out, f.state, 4);
    }
    put(out, s.tokens, 4);
    put(out, s.chars, 4);
  }
  return out;
}

std::optional<matcher> matcher::restore(std::shared_ptr<const grammar> g, std::string_view bytes, matcher_options opt) {
  if (bytes.size() < 4 || std::memcmp(bytes.data(), magic, 4) != 0) return std::nullopt;
  reader r{bytes.substr(4)};
  if (r.get(8) != g->fingerprint()) return std::nullopt;
  match_state st;
  st.complete = r.get(1) != 0;
  const auto n = r.get(4);
  if (!r.ok || n > r.in.size() / 4) return std::nullopt;
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto len = r.get(4);
    if (!r.ok || len == 0 || len > opt.max_depth || len > r.in.size() / 8) return std::nullopt;
    stack s;
    for (std::uint64_t j = 0; j < len; ++j) {
      const auto rule = r.get(4), state = r.get(4);
      if (!r.ok || rule >= g->rules.size() || state >= g->rules[rule].size()) return std::nullopt;
      s.push_back({static_cast<std::uint32_t>(rule), static_cast<std::uint32_t>(state)});
    }
    // The budget left of the top frame: at most its rule's, none where it has none (and not
    // counting a token: a state lies between tokens).
    const auto tokens = r.get(4), chars = r.get(4);
    const auto& top = g->rules[s.back().rule];
    const auto within = [](std::uint64_t left, std::uint32_t max) { return max == no_budget ? left == 0 : left <= max; };
    if (!r.ok || !within(tokens, top.max_tokens) || !within(chars, top.max_chars)) return std::nullopt;
    s.tokens = static_cast<std::uint32_t>(tokens);
    s.chars = static_cast<std::uint32_t>(chars);
    if (!can_step(*g, s)) return std::nullopt;
    st.stacks.push_back(std::move(s));
  }
  if (!r.ok || !r.in.empty() || !std::is_sorted(st.stacks.begin(), st.stacks.end()) ||
      std::adjacent_find(st.stacks.begin(), st.stacks.end()) != st.stacks.end())
    return std::nullopt;
  matcher m(std::move(g), opt);
  m.state_ = std::move(st);
  return m;
}

}  // namespace troupe::recipe::grammar
