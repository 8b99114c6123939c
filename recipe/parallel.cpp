#include "recipe/parallel.hpp"

#include <algorithm>
#include <utility>

namespace troupe::recipe {

thread_pool::thread_pool(unsigned threads) {
  for (unsigned i = 1; i < std::max(threads, 1u); ++i)
    workers_.emplace_back([this] {
      std::size_t seen = 0;
      for (;;) {
        std::unique_lock lock(m_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        lock.unlock();
        run_tasks();
      }
    });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void thread_pool::run_tasks() {
  for (;;) {
    std::size_t i = 0;
    const std::function<void(std::size_t)>* fn = nullptr;
    {
      std::lock_guard lock(m_);
      if (fn_ == nullptr || next_ >= n_) return;
      i = next_++;
      fn = fn_;  // stays valid until this task is counted finished
    }
    (*fn)(i);
    std::lock_guard lock(m_);
    if (++finished_ == n_) done_.notify_all();
  }
}

void thread_pool::parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard batch(batch_mutex_);
  {
    std::lock_guard lock(m_);
    fn_ = &fn;
    n_ = n;
    next_ = finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  run_tasks();
  std::unique_lock lock(m_);
  done_.wait(lock, [&] { return finished_ == n_; });
  fn_ = nullptr;
}

namespace {
bool ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Tokenizes text runs on the pool, long raw runs cut at safe points; one id vector per run.
std::vector<std::vector<token_id>> encode_runs(const tokenizer& tok,
                                               const std::vector<std::string_view>& runs,
                                               encode_mode mode, thread_pool& pool,
                                               const parallel_options& options) {
  std::size_t total = 0;
  for (const auto r : runs) total += r.size();
  const std::size_t piece = std::max(options.min_piece_bytes, total / (pool.size() * 4) + 1);
  struct task {
    std::size_t run;
    std::string_view text;
  };
  std::vector<task> tasks;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const std::string_view t = runs[r];
    if (mode != encode_mode::raw || t.size() <= piece) {
      tasks.push_back({r, t});
      continue;
    }
    std::size_t from = 0;
    for (const std::size_t cut : safe_cuts(t, piece)) {
      tasks.push_back({r, t.substr(from, cut - from)});
      from = cut;
    }
    tasks.push_back({r, t.substr(from)});
  }
  std::vector<std::vector<token_id>> task_ids(tasks.size());
  // Longest first, so a long piece does not start last.
  std::vector<std::size_t> order(tasks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return tasks[a].text.size() > tasks[b].text.size(); });
  pool.parallel_for(tasks.size(), [&](std::size_t k) {
    const std::size_t i = order[k];
    tok.encode(tasks[i].text, mode, task_ids[i]);
  });
  std::vector<std::vector<token_id>> out(runs.size());
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    auto& dst = out[tasks[i].run];
    if (dst.empty()) dst = std::move(task_ids[i]);
    else dst.insert(dst.end(), task_ids[i].begin(), task_ids[i].end());
  }
  return out;
}
}  // namespace

bool is_safe_cut(std::string_view t, std::size_t i) {
  if (i == 0 || i >= t.size()) return false;
  if (t[i - 1] == '\n' && ascii_letter(t[i])) return true;
  return ascii_letter(t[i - 1]) && t[i] == ' ' && i + 1 < t.size() && ascii_letter(t[i + 1]);
}

std::vector<std::size_t> safe_cuts(std::string_view text, std::size_t piece_bytes) {
  std::vector<std::size_t> cuts;
  piece_bytes = std::max<std::size_t>(piece_bytes, 1);
  std::size_t from = 0;
  while (text.size() - from > piece_bytes) {
    std::size_t i = from + piece_bytes;
    while (i < text.size() && !is_safe_cut(text, i)) ++i;
    if (i >= text.size()) break;
    cuts.push_back(i);
    from = i;
  }
  return cuts;
}

std::vector<token_id> encode_parallel(const tokenizer& tok, std::string_view text, encode_mode mode,
                                      thread_pool& pool, const parallel_options& options) {
  auto runs = encode_runs(tok, {text}, mode, pool, options);
  return std::move(runs.front());
}

encoded_prompt encode_prompt(const conversation& c, const tokenizer& tok, thread_pool& pool,
                             const parallel_options& options) {
  const auto pieces = prompt_pieces(c, tok);
  std::vector<std::string_view> runs;
  for (const auto& p : pieces)
    if (!p.control) runs.push_back(p.text);
  const auto ids = encode_runs(tok, runs, encode_mode::raw, pool, options);
  return assemble_prompt(pieces, ids);
}

}  // namespace troupe::recipe
