// The wire of an EP group spread over processes (kernels/ep_process.hpp): frames on a peer's
// socket, the group's calls as bytes, and the exchange that joins a process's rank threads to
// the other processes' ranks. Internal to kernels/ (ep_group_backend.cpp, ep_process.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/ep_exchange.hpp"
#include "kernels/model.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels::wire {

enum class frame : std::uint32_t {
  call = 1,      // leader -> peer: an encoded call
  segments = 2,  // peer -> leader: its ranks' row segments of one exchange, in rank order
  gathered = 3,  // leader -> peer: the exchange's whole buffer
  abort = 4,     // leader -> peer: the exchange was aborted (payload: why)
  outcome = 5,   // peer -> leader: a call's error per rank of the peer (empty: ok), or the load's
  ready = 6,     // peer -> leader: its ranks loaded
};

/// One process's socket to another of its group. Sends are serialised; a process reads a
/// socket from one thread at a time (the exchange's, or the caller's between calls).
struct link {
  link(int fd, std::vector<std::int32_t> ranks,
       std::chrono::milliseconds answer_within = std::chrono::milliseconds(-1))
      : fd(fd), ranks(std::move(ranks)), answer_within(answer_within) {}
  ~link();
  link(const link&) = delete;
  link& operator=(const link&) = delete;

  /// "the process of ranks 2, 3": how errors name the other end.
  std::string name() const;

  int fd;
  std::vector<std::int32_t> ranks;
  /// How long a receive within a call waits for the other end (negative: for ever).
  std::chrono::milliseconds answer_within;
  std::mutex writing;
  /// Set once the socket failed or ended, or the other end did not answer in time: the other
  /// process is gone. `gone` then says why (set before `dead`, never changed after).
  std::atomic<bool> dead{false};
  std::string gone;
  /// Marks the link dead (the first reason stays) and returns why it is.
  const std::string& lose(const std::string& why);
  /// An outcome the exchange read while it waited for segments (the peer failed its call
  /// before that exchange): the call's end takes it from here.
  std::optional<std::string> outcome;
};

result<bool> send(link& l, frame kind, std::string_view payload);
/// The next frame; `within_call`: within l.answer_within. Errors: the socket ended or failed,
/// or nothing came in time (the link is then dead).
result<std::pair<frame, std::string>> receive(link& l, bool within_call = false);

/// A call of the group that every rank runs (model_backend's calls that change a sequence).
struct call {
  enum class op : std::uint8_t {
    open = 1, close, step, step_tail, rollback, import_block, import_state, import_swa, replay
  };
  op what = op::open;
  sequence_id id = 0;
  std::int64_t k = 0;  // rollback's count, import_block's block
  std::vector<std::pair<sequence_id, std::vector<std::int64_t>>> batch;
  std::vector<std::int64_t> rows;  // step_tail's; replay's tokens
  std::string bytes;               // the imports'

  static call of(op what, sequence_id id = 0, std::int64_t k = 0, std::string_view bytes = {}) {
    call c;
    c.what = what;
    c.id = id;
    c.k = k;
    c.bytes = bytes;
    return c;
  }
  static call of(op what, sequence_id id, std::string_view bytes) { return of(what, id, 0, bytes); }
  static call of_tokens(op what, sequence_id id, std::span<const std::int64_t> tokens) {
    auto c = of(what, id);
    c.rows.assign(tokens.begin(), tokens.end());
    return c;
  }
  static call of_batch(op what, std::span<const step_input> in,
                       std::span<const std::int64_t> rows = {});
};

std::string encode(const call& c);
result<call> decode(std::string_view bytes);
/// Runs a call on one rank's backend: its error, empty when it succeeded.
std::string apply(const call& c, cpu_backend& b);

std::string encode_outcome(const std::vector<std::string>& errors);
/// A peer's outcome of the call in flight: the frames it sent are read (its segments of an
/// exchange that was aborted skipped) until it. Errors: the peer is gone, or sent a malformed
/// outcome.
result<std::vector<std::string>> await_outcome(link& l);

/// Loads the rank models `ranks` of the checkpoint in `dir` (options.ep set per rank, tensors
/// shared through options.tensors, a fresh cache when null) and calls `prepare` on each.
result<std::vector<std::unique_ptr<cpu_backend>>> load_ranks(
  const std::filesystem::path& dir, model_options options, const expert_placement& placement,
  const std::vector<std::int32_t>& ranks, const std::shared_ptr<ep_exchange>& exchange,
  const std::function<result<bool>(model&)>& prepare);

/// Waits for a peer's word that its ranks loaded. Errors: its load error, or it is gone.
result<bool> await_ready(link& l);

/// The exchange of ranks `local` (ascending, this process's threads) of a group of `ranks`,
/// whose other ranks are at the ends of `links`. The leader's (`hub`) gathers every process's
/// segments and sends each peer the whole buffer; a peer's sends its ranks' segments to its one
/// link, the leader's, and waits for the whole buffer. A leader's abort tells its peers.
std::shared_ptr<ep_exchange> process_exchange(std::int32_t ranks,
                                              std::vector<std::int32_t> local,
                                              std::vector<std::shared_ptr<link>> links, bool hub);

}  // namespace troupe::kernels::wire
