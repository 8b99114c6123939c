// history: the plain facts a simulated run records where its actors act, for checkers that
// share no logic with them (cluster/sim/history_checker.hpp).
//
// An invariant read from an actor's own audit counter inherits the actor's mistakes: an index
// whose expiry arithmetic is wrong also audits with it. A history instead records what was
// done, when, with the inputs a checker needs to decide for itself whether it was right, as
// Jepsen's checkers do: a KV shard records each block it wrote (with the write's traffic
// class), committed, served as a hit and refreshed; a request records its admission, each
// token it delivered to the client (output position and token id) and its end; decode_lb
// records each booking it made (the KV it reserved on an instance) and released, and each
// instance that joined or left it; the simulated world records each instance incarnation's
// start and stop (its leader rank's device). Nothing here decides anything: the facts are appended in
// the order the actors act (under a lock: the real world's actors run on several threads), and
// read after the run, once no actor records any more.
//
// Recording is opt-in: an actor given no history (a simulation that does not check one, or
// `troupe serve` without --check-history) records nothing and pays one pointer test per act.
#pragma once

#include "actors/kv/block_key.hpp"
#include "runtime/time.hpp"
#include "schemas/convert.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace troupe::actors {

/// What a KV shard did with one block.
enum class kv_act : std::uint8_t {
  write,   ///< made visible at once (insert), with the write's class
  reserve, ///< placed pending (reserve), with the write's class; not a hit until committed
  commit,  ///< a reserved block made visible (commit)
  hit,     ///< served as a cache hit (part of a lookup's leading run)
  refresh, ///< a hit's refresh with the asking request's class (touch)
};

struct kv_fact {
  runtime::time_point at{};
  block_key key;
  kv_act act = kv_act::write;
  /// The class of a write, reserve or refresh (a commit and a hit carry none: chatbot).
  schemas::traffic_class cls = schemas::traffic_class::chatbot;
};

/// One output token a request delivered to its client: its output position (0 is the token
/// that left with prefill) as the request counted it, and its id.
struct token_fact {
  runtime::time_point at{};
  std::uint64_t request = 0;
  std::uint64_t position = 0;
  std::int32_t token = 0;
};

/// A request's admission (with what it asks for) or its end.
struct request_fact {
  enum kind_t : std::uint8_t { admitted, completed, failed };
  runtime::time_point at{};
  std::uint64_t request = 0;
  kind_t kind = admitted;
  std::uint64_t input_tokens = 0;
  std::uint64_t output_tokens = 0;
  /// Ended by a stop id before its output length (completed only).
  bool stopped = false;
};

/// What decode_lb did: booked a request on an instance (one request, `reserved` KV tokens: its
/// context plus its output budget), released such a booking, or saw an instance join or leave
/// its routing (a leaving instance's bookings end with it).
struct booking_fact {
  enum kind_t : std::uint8_t { book, release, join, leave };
  runtime::time_point at{};
  std::uint32_t instance = 0;
  kind_t kind = book;
  std::uint64_t reserved = 0;
};

/// An instance incarnation came up (its leader rank's device started) or went down (that
/// device stopped). `instance` names it as "pool/id".
struct instance_fact {
  runtime::time_point at{};
  std::string instance;
  bool up = true;
};

/// A run's facts, in the order they happened.
struct run_facts {
  std::vector<kv_fact> kv;
  std::vector<token_fact> tokens;
  std::vector<request_fact> requests;
  std::vector<booking_fact> bookings;
  std::vector<instance_fact> instances;
};

/// The facts as a run records them: actors append with add() from any thread; a reader takes
/// them whole once the run is over, or a snapshot() while some actor may still record (a real
/// server's stop).
struct run_history : run_facts {
  run_facts snapshot() const {
    std::lock_guard lock{mu_};
    return run_facts{*this};
  }

  void add(std::span<const kv_fact> facts) {
    std::lock_guard lock{mu_};
    kv.insert(kv.end(), facts.begin(), facts.end());
  }
  void add(token_fact f) {
    std::lock_guard lock{mu_};
    tokens.push_back(f);
  }
  void add(request_fact f) {
    std::lock_guard lock{mu_};
    requests.push_back(f);
  }
  void add(booking_fact f) {
    std::lock_guard lock{mu_};
    bookings.push_back(f);
  }
  void add(instance_fact f) {
    std::lock_guard lock{mu_};
    instances.push_back(std::move(f));
  }

private:
  mutable std::mutex mu_;
};

using run_history_ptr = std::shared_ptr<run_history>;

} // namespace troupe::actors
