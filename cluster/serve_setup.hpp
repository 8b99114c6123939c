// serve_setup: what `troupe serve` and the processes of `troupe launch` prepare alike.
//
// A server of the real world — one process with the whole graph (`troupe serve`) or one role
// of a launched cluster (`troupe node`) — first checks its inputs and turns each problem into
// a message the operator can act on (the topology, its hardware, the model directory, the
// Engram map, the tokenizer, the store directory, the API keys file, the listen address), then
// builds its actor system, its devices and its store the same way. These are those steps,
// shared so that a launched cluster and `troupe serve` cannot drift apart.
#pragma once

#include "actors/entrypoint/structured_output.hpp"
#include "actors/kv/block_key.hpp"
#include "cluster/real_graph.hpp"
#include "cluster/serve_command.hpp"
#include "cluster/topology.hpp"
#include "kernels/model_config.hpp"
#include "recipe/recipe.hpp"
#include "runtime/metrics.hpp"
#include "runtime/transport.hpp"
#include "runtime/world.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>

namespace troupe::cluster {

/// The checked inputs of a real-world server.
struct serve_inputs {
  topology topo;
  kernels::model_config model;
  std::unique_ptr<recipe::codec> codec;
  /// The KV store's directory (absolute), or empty: no store.
  std::filesystem::path kv_dir;
  /// serve_options::eplb_interval, parsed.
  runtime::duration eplb_interval{};
  /// serve_options::window_memory, parsed.
  std::uint64_t window_memory = 0;
  /// The longest context (prompt + output) a request may reach: serve_options::max_context,
  /// else the model's max_position_embeddings, at most the device engine's default_context.
  std::uint64_t max_context = 0;
};

/// "host:port" → (host, port); IPv6 as "[::1]:8000". Nothing on a malformed address.
std::optional<std::pair<std::string, std::uint16_t>> parse_host_port(const std::string& s);

/// Loads and checks the topology, the model directory, the Engram map and the tokenizer of
/// `o` (the API keys and the listen address are the entrypoint's: see load_api_keys_option),
/// and that the topology's device engine is built in (cluster/device_engines.hpp) and, when
/// `devices_here` (a process that runs devices, or a launcher that starts them on this host;
/// not a control process), usable on this machine. On a problem, writes "<command>: <message>"
/// lines to `err` and returns nothing.
std::optional<serve_inputs> load_serve_inputs(const serve_options& o, const std::string& command,
                                              std::ostream& err, bool devices_here = true);

/// The KV store's directory of a server: --kv-dir, else the topology's posix path (relative
/// paths from the working directory), made absolute; empty for a topology with the simulated
/// store. Nothing after an error written to `err`.
std::optional<std::filesystem::path> store_directory(const serve_options& o, const topology& topo,
                                                     const std::string& command,
                                                     std::ostream& err);

/// The API keys of `o.api_keys_file` (empty set: none, after a warning on `err` that the API
/// at `listen` is open). Nothing after an error written to `err`.
std::optional<std::set<std::string>> load_api_keys_option(const serve_options& o,
                                                          const std::string& command,
                                                          std::ostream& err);

/// The real world's actor system options: troupe's message types, CAF's sharing scheduler
/// (idle workers sleep, so the devices' compute threads get the cores), and with `network`
/// the middleman for actors in other processes (over mutual TLS with `tls`: runtime/transport.hpp).
runtime::world_options real_world_options(bool network, const runtime::tls_options& tls = {});

/// The graph parameters every real-world server shares: a CPU device per instance (batch-
/// invariant, reporting into `metrics`, masking with `constraints`), the posix block store of
/// `in.kv_dir` (when set) with chains rooted in the model's fingerprint, the model's block
/// size and context, and the step budgets of `o` or the topology. With `cluster_store` valid
/// (an instance process of `troupe launch`: the control process's store, through its store
/// proxy) that store is used and the directory is not opened here. Nothing after an error on
/// `err`. The returned device factory refers to `o` and `metrics`: both must outlive it.
std::optional<real_graph_params>
make_real_graph_params(caf::actor_system& sys, const serve_options& o, const serve_inputs& in,
                       runtime::registry& metrics,
                       std::shared_ptr<actors::constraint_table> constraints,
                       const std::string& command, std::ostream& err,
                       runtime::store_port cluster_store = {});

/// `--check-history`: checks what the run's actors recorded in `gp.history` (set by
/// make_real_graph_params), by the rules of the simulator's history checker
/// (cluster/sim/history_checker.hpp) with the limits this server gave its actors; token ids
/// are the model's, so only their positions are checked. Call once the HTTP server stopped
/// (`all_ended`: no request was left in flight): it first lets `decode_lb` handle the releases
/// queued before. Writes "<command>: history: ..." and each violation to `err`; returns the
/// exit status, 1 when something is violated.
int check_run_history(caf::actor_system& sys, const serve_inputs& in, const real_graph_params& gp,
                      const actors::decode_lb_actor& decode_lb, runtime::time_point origin,
                      bool all_ended, const std::string& command, std::ostream& err);

/// Sends one short greedy request through `service` and waits for its end, up to `timeout`
/// in all: every device on the path has loaded the model and every actor answers.
/// Returns an error message, or empty. It gives up at once when `cluster` (when valid: the
/// pools' root supervisor) goes down meanwhile ("the cluster stopped while loading: ...") and
/// when a stop signal arrives (block_stop_signals first): the signal is then in *stopped_by.
std::string warm_up(caf::actor_system& sys, const actors::generation_service& service,
                    caf::timespan timeout, const caf::actor& cluster, int& stopped_by);

/// Blocks SIGTERM, SIGINT and SIGUSR1 in this thread and every thread it starts later (call
/// before the actor system starts), so that poll_stop_signal / wait_for_stop_signal take them
/// (SIGUSR1 stops as SIGTERM does, except that an instance process of `troupe launch` drains
/// with its pool's grace instead of --grace: the launcher's removal for the autoscaler); and
/// installs a handler that notes one reaching a thread that does not block it (a library's
/// thread started earlier), instead of the default action ending the process.
void block_stop_signals();

/// Waits up to `timeout` for a stop signal (block_stop_signals first); returns the signal, or
/// 0 when none came.
int poll_stop_signal(std::chrono::milliseconds timeout);

/// Waits for a stop signal (block_stop_signals first); returns it.
int wait_for_stop_signal();

/// "SIGTERM", "SIGINT" or "SIGUSR1", for messages about a stop signal.
const char* signal_name(int sig);

} // namespace troupe::cluster
