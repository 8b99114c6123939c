// serve_command: `troupe serve`, the real world on one machine.
//
// The simulated world proves the serving graph; this runs the same graph for real, in one
// process: the KV CHECK role, the prefill and decode balancers, a pool supervisor per role
// with its instances (engine + rank), one request actor per API request, and the HTTP
// entrypoint in front — with real ports: the wall clock, and a CPU device per instance
// running the exact fp32 engine of kernels/ (ports/cpu_device.hpp). Prefill and decode are
// separate instances even here: a request's KV is exported from the prefill device and
// imported into the decode device in the checksummed block formats of kernels/. The
// prompt's full blocks persist in the KV store (ports/posix_store.hpp) under the topology's
// [storage] path: a later request sharing a prefix computes only its uncached tail, also
// after a restart.
//
// Before it listens, the command checks its inputs (a clear message for each problem: the
// topology, the hardware, the model directory, the Engram map, the tokenizer, the API keys
// file, the listen address) and sends one warm-up request through the whole graph, so that
// the server answers its first client at once and /ready means able to serve. SIGTERM or
// SIGINT stops it: no new requests, those in flight finish within the grace period, exit 0.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

namespace troupe::cluster {

struct serve_options {
  /// The topology file: a prefill and a decode pool, hardware "cpu".
  std::string topology;
  /// A model directory in the released layout (config.json + safetensors), e.g. one written by
  /// `troupe model init`.
  std::string model;
  /// host:port to listen on ("127.0.0.1:8000"; port 0 picks a free one).
  std::string listen = "127.0.0.1:8000";
  /// The model name /v1/models lists and requests must name; empty: the topology's model.
  std::string served_model_name;
  /// One API key per line ('#' comments); empty: no authentication (a warning is printed).
  std::string api_keys_file;
  /// The Engram token map: "identity" (random models, which have no tokenizer of their own)
  /// or a JSON file (kernels/generate.hpp); required when the model has Engram layers.
  std::string engram_map;
  /// The tokenizer (tokenizer.json or .json.gz); empty: the shipped DeepSeek-V4 tokenizer.
  std::string tokenizer;
  /// Threads of each CPU device (BLAS and attention); on CUDA devices, of the CPU engine beside
  /// the GPU (KV imports, bounded replay).
  int device_threads = 2;
  /// The longest context (prompt + output) of a request, in tokens; 0: the model's, at most
  /// 16384 on CUDA devices, whose compressed-KV page pool holds each of a step's sequences at it
  /// (cluster/device_engines.hpp).
  std::uint64_t max_context = 0;
  /// KV tokens a decode instance holds (decode_lb books each request's context and output
  /// budget against it), and a CUDA device's pool of compressed-KV pages (all of the device's
  /// sequences together); 0: no limit but the batch, and a CUDA pool of what the GPU's memory
  /// has room for within gpu_memory_fraction of it (cluster/device_engines.hpp).
  std::uint64_t kv_tokens = 0;
  double gpu_memory_fraction = 0.9;
  /// Generation requests in flight at once (429 beyond).
  std::uint32_t max_in_flight = 64;
  /// Threads that compile structured-output grammars (actors::constraint_table's pool).
  unsigned compile_threads = 2;
  /// Requests decoded together by a decode instance; 0: the decode pool's `max_batch`, else 64.
  std::uint32_t max_batch = 0;
  /// Prompt tokens per prefill step (chunked prefill; a long prompt does not stall others);
  /// 0: the prefill pool's `chunk_tokens`, else 512.
  std::uint64_t prefill_chunk = 0;
  /// The KV block store's directory, instead of the topology's [storage] path.
  std::string kv_dir;
  /// Speculative decoding on the decode instances: off, fixed1 .. fixed5 or dspark (the
  /// model's DSpark draft layers propose; docs/serve.md, "Speculative decoding").
  std::string spec = "off";
  /// Overlapped scheduling on the decode instances: on (default) or off
  /// (decode_engine_params::overlap; docs/serve.md, "Overlapped scheduling").
  std::string overlap = "on";
  /// Expert-parallel load balancing (docs/serve.md, "Expert-parallel load balancing"): each
  /// CPU device runs its MoEs as an EP group of this many ranks, one spare expert slot each,
  /// and an expert balancer per device re-places the experts by the router's counts every
  /// `eplb_interval`. 0: off (the experts run as one group).
  std::uint32_t eplb_ranks = 0;
  std::string eplb_interval = "1min";
  /// Host memory per device for the window states kept at block boundaries, for exact prefix
  /// restores (ports::cpu_device_params::keep_bytes; docs/serve.md, "Window-state pulls"). "0":
  /// none kept, every cached prefix restores by bounded replay.
  std::string window_memory = "256MiB";
  /// SIGTERM: requests in flight get this long to finish.
  std::chrono::seconds grace{30};
  /// Record the run's history and check it after the stop (troupe serve --check-history).
  bool check_history = false;
  /// Called with the bound port once the server is ready (tests); may be empty.
  std::function<void(std::uint16_t)> on_ready;
};

/// Runs the server until SIGTERM / SIGINT. Messages go to `err` (the bound address on
/// start). Returns the process exit status: 0 after a clean stop, 1 on a bad input or a
/// failed start.
int run_serve_command(const serve_options& options, std::ostream& err);

} // namespace troupe::cluster
