#pragma once
// Parallel tokenization: a prompt is cut at the control tokens the encoder placed and, inside long
// text runs, at cut points where the pre-tokenizer is known to split anyway; the pieces are
// tokenized on a small thread pool and concatenated. The ids equal the sequential encoding for
// every input (tests/recipe/test_parallel.cpp checks it on the parity corpus).

#include "recipe/prompt.hpp"
#include "recipe/tokenizer.hpp"

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

namespace troupe::recipe {

// A fixed set of worker threads. parallel_for runs a batch of tasks on the workers and the calling
// thread; one batch at a time (calls from several threads are serialized).
class thread_pool {
 public:
  // `threads` counts the caller: 1 runs everything on the caller, 2 adds one worker, ...
  explicit thread_pool(unsigned threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }
  // Calls fn(i) for every i in [0, n); returns when all calls have returned. fn must not throw.
  void parallel_for(std::size_t n, const std::function<void(std::size_t)>& fn);

 private:
  void run_tasks();
  std::vector<std::thread> workers_;
  std::mutex batch_mutex_;  // one batch at a time
  std::mutex m_;
  std::condition_variable wake_, done_;
  std::size_t generation_ = 0;
  bool stop_ = false;
  const std::function<void(std::size_t)>* fn_ = nullptr;
  std::size_t n_ = 0, next_ = 0, finished_ = 0;
};

struct parallel_options {
  // Text runs longer than this are cut into about threads * 4 pieces (never below it).
  std::size_t min_piece_bytes = 64 * 1024;
};

// True when encode(raw) of text equals encode(raw) of text[0, i) followed by text[i, end): a
// newline followed by an ASCII letter, or an ASCII letter followed by a space and an ASCII letter.
// Neither the digit nor the CJK split can act there, and no alternative of the DeepSeek-V4 split
// pattern can match across it (docs/recipe.md, "Parallel tokenization").
bool is_safe_cut(std::string_view text, std::size_t i);
// Cut points (sorted, each is_safe_cut) splitting `text` into pieces of about `piece_bytes`.
std::vector<std::size_t> safe_cuts(std::string_view text, std::size_t piece_bytes);

// encode(text, raw) computed on the pool. Only raw mode cuts long text: in the other modes the
// added-token pass could match across a cut, so the text is encoded in one piece.
std::vector<token_id> encode_parallel(const tokenizer& tok, std::string_view text, encode_mode mode,
                                      thread_pool& pool, const parallel_options& options = {});
// encode_prompt(c, tok) computed on the pool: the same text, ids and control positions.
encoded_prompt encode_prompt(const conversation& c, const tokenizer& tok, thread_pool& pool,
                             const parallel_options& options = {});

}  // namespace troupe::recipe
