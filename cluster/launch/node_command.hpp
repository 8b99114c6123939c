// node_command: `troupe node`, one role of a launched cluster in one OS process.
//
// `troupe launch` runs a topology as OS processes (launch_command.hpp); each of them is a
// `troupe node` with one role:
// - control: the KV CHECK role, the prefill and decode balancers, the generation service
//   (one request actor per API request) and the HTTP entrypoint. It publishes its directory
//   (control_directory.hpp) on its control address, waits until a prefill and a decode
//   instance have joined, sends a warm-up request through them, then listens for clients.
// - store: the cluster's block store (store_bridge.hpp): it opens the store directory and
//   registers its store with the control process, whose --external-store says to wait for it.
//   The processes reach it through store proxies; it may die and come back while they serve.
// - prefill or decode: one engine instance of that pool (its engine and rank on a CPU device,
//   its block writer): it connects to the control process (retrying until it answers), and
//   its engine announces itself to the pool's balancer there. The balancer and the request
//   actors monitor the engine across the connection, so a dead process is a down message, as
//   a failed instance is in the simulator: requests are rerouted and resume from the tokens
//   already delivered.
// The same actors as `troupe serve`, the same inputs and checks (serve_setup.hpp). The block
// store is the store process's, or without one the control process's; the other processes
// reach it through store proxies, the payloads over the fabric (store_bridge.hpp).
//
// Signals: SIGTERM or SIGINT stops a node. An instance first drains (its balancer excludes
// it; a decode instance serves for the grace period, then forwards the requests left); the
// control process stops taking requests and gives those in flight the grace period. An
// instance process whose control process goes away exits with status 3.
#pragma once

#include "cluster/serve_command.hpp"
#include "runtime/transport.hpp"

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

namespace troupe::cluster {

struct node_options {
  /// The inputs a server takes (topology, model, tokenizer, threads, store, API keys...);
  /// `serve.listen` is the control process's HTTP address.
  serve_options serve;
  /// "control", "store", "prefill" or "decode".
  std::string role;
  /// Control: the cluster's block store runs in a store process of its own (role "store"),
  /// which registers with this one: it is waited for before serving, and the store's
  /// directory is not opened here.
  bool external_store = false;
  /// The instance's number in its pool (prefill and decode roles).
  std::uint32_t index = 0;
  /// Prefill and decode: the instance's healthy GPUs (ranks of its configured
  /// gpus_per_instance, ascending); the instance runs on the first of them that make a valid
  /// EP size (the EP resize rule, docs/faults.md). Empty: all of them. `troupe launch` passes
  /// the GPUs a fault plan has not failed.
  std::vector<std::uint32_t> gpus;
  /// HOST:PORT: where the control process publishes its directory (port 0: any free port),
  /// and where an instance process connects.
  std::string control;
  /// An instance process gives up connecting to the control process after this long.
  std::chrono::seconds connect_timeout{120};
  /// The libfabric provider KV crosses processes by ("tcp", "shm"; "none": not at all, the
  /// decode side recomputes and block store payloads travel in CAF messages), and the
  /// address its endpoint binds to (one the other processes reach).
  std::string fabric = "tcp";
  /// With a fabric: a prompt's full blocks cross to its decode process as its prefill chunks
  /// compute them (kv_bridge.hpp); off: the KV crosses in one transfer after the prefill.
  bool kv_stream = true;
  /// Empty: 127.0.0.1 for an instance; for the control process (whose fabric link serves the
  /// block store's payloads, store_bridge.hpp) the host of `control`.
  std::string fabric_host;
  /// Mutual TLS between the processes (runtime/transport.hpp): every process of a cluster
  /// presents a certificate of the cluster CA (`troupe certs`). Empty: plain TCP.
  runtime::tls_options tls;
  /// Control: once serving, writes {"http": PORT, "control": PORT} to this file (for the
  /// launcher and scripts; written to a temporary name, then renamed). Empty: none.
  std::string ready_file;
};

/// A node moves KV and block payloads through the fabric in buffers malloc gives; the shm
/// provider copies them by process_vm_readv, which pins the pages it copies one by one and
/// runs ~2x as fast on transparent huge pages (docs/benchmarks.md, "Fabric link"). glibc
/// backs its heap with them under the tunable glibc.malloc.hugetlb=1, which it reads only when
/// a process starts. So `troupe node` re-executes itself (`argv`, the same pid) once, with the
/// tunable added to GLIBC_TUNABLES, unless GLIBC_TUNABLES already sets glibc.malloc.hugetlb
/// (an operator's choice: =0 keeps 4 KiB pages). Returns without re-executing for
/// `--fabric none` or when that is set; if exec fails it says so on `err` and returns (the
/// node runs on 4 KiB pages).
void reexec_with_huge_page_heap(const node_options& options, char** argv, std::ostream& err);

/// Runs the node until SIGTERM / SIGINT. Returns the exit status: 0 after a clean stop, 1 on
/// bad input or a failed start, 3 when an instance lost its control process.
int run_node_command(const node_options& options, std::ostream& err);

} // namespace troupe::cluster
