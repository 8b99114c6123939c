// The stack matcher (matcher.hpp).
#include "recipe/grammar/matcher.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>

namespace troupe::recipe::grammar {

std::vector<stack> close_stacks(const grammar& g, std::vector<stack> raw, std::size_t max_depth, bool& popped) {
  std::vector<stack> ready, seen;
  while (!raw.empty()) {
    stack s = std::move(raw.back());
    raw.pop_back();
    if (s.size() > max_depth || std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
    seen.push_back(s);
    const frame top = s.back();
    const rule& r = g.rules[top.rule];
    if (r.has_bytes[top.state]) ready.push_back(s);
    for (const call_edge& c : r.calls[top.state]) {
      stack t = s;
      if (r.accepting[c.target] && !r.has_bytes[c.target] && r.calls[c.target].empty()) {
        // A tail call: the caller would only return after it, so the callee takes its frame
        // (right recursion such as `list ::= item list | item` does not deepen the stack).
        t.back() = {c.rule, 0};
      } else {
        t.back().state = c.target;
        t.push_back({c.rule, 0});
      }
      raw.push_back(std::move(t));
    }
    if (r.accepting[top.state]) {
      s.pop_back();
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
  state_.stacks = close_stacks(*g_, {stack{{g_->root, 0}}}, opt_.max_depth, popped);
  state_.complete = popped;
}

std::optional<match_state> matcher::advance(const match_state& from, std::string_view bytes) const {
  match_state cur = from;
  for (const char ch : bytes) {
    const auto b = static_cast<unsigned char>(ch);
    std::vector<stack> raw;
    for (const stack& s : cur.stacks) {
      const auto t = g_->rules[s.back().rule].step(s.back().state, b);
      if (t == no_state) continue;
      stack n = s;
      n.back().state = static_cast<std::uint32_t>(t);
      raw.push_back(std::move(n));
    }
    if (raw.empty()) return std::nullopt;
    bool popped = false;
    cur.stacks = close_stacks(*g_, std::move(raw), opt_.max_depth, popped);
    cur.complete = popped;
    if (cur.stacks.empty() && !cur.complete) return std::nullopt;
  }
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
constexpr char magic[4] = {'T', 'G', 'S', '1'};

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
    if (!g->rules[s.back().rule].has_bytes[s.back().state]) return std::nullopt;
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
