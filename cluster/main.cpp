// troupe: the command-line interface of the troupe serving runtime.
#include "cluster/deploy_cli.hpp"
#if TROUPE_HAVE_CUDA
#include "cluster/cuda_engine.hpp"
#endif
#include "cluster/recipe_cli.hpp"
#include "cluster/launch/launch_command.hpp"
#include "cluster/launch/node_agent.hpp"
#include "cluster/launch/node_command.hpp"
#include "cluster/serve_command.hpp"
#include "cluster/sim/capacity.hpp"
#include "cluster/sim/hardware.hpp"
#include "cluster/sim/model_profile.hpp"
#include "cluster/sim/perf_model.hpp"
#include "cluster/sim/sim_command.hpp"
#include "cluster/sim/swarm.hpp"
#include "cluster/topology.hpp"
#include "cluster/launch/certs.hpp"
#include "kernels/cpu_ops.hpp"
#include "kernels/generate.hpp"
#include "kernels/model_init.hpp"
#include "kernels/npy.hpp"
#include "ports/rank_processes.hpp"
#include "runtime/line_stream.hpp"
#include "runtime/log.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <charconv>
#include <csignal>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

/// stderr for `troupe launch` and the `troupe node` and `troupe agent` processes it starts,
/// which share one stderr: each line in one write, so their lines never cut into each other.
std::ostream& shared_stderr() {
  static troupe::runtime::line_ostream err{2};
  return err;
}

// `troupe topology check FILE...`: prints "FILE: ok" on stdout for each valid file and every
// problem of each invalid one on stderr: its syntax and rules (topology.hpp), then whether its
// instances can hold the model on the hardware (cluster/sim/capacity.hpp). Returns 0 only when
// every file is valid.
int check_topologies(const std::vector<std::string>& files) {
  int rc = 0;
  for (const auto& file : files) {
    auto result = troupe::cluster::load_topology(file);
    if (result.ok()) {
      std::size_t errors = 0;
      for (const auto& p : troupe::cluster::sim::check_capacity(*result.value)) {
        std::cerr << file << ": " << (p.fatal ? "" : "warning: ")
                  << (p.pool.empty() ? "" : "pool " + p.pool + ": ") << p.message << "\n";
        errors += p.fatal ? 1 : 0;
      }
      if (errors == 0) {
        std::cout << file << ": ok\n";
        continue;
      }
      rc = 1;
      std::cerr << file << ": " << errors << (errors == 1 ? " error\n" : " errors\n");
      continue;
    }
    rc = 1;
    for (const auto& d : result.errors)
      std::cerr << d.to_string() << "\n";
    std::cerr << file << ": " << result.errors.size()
              << (result.errors.size() == 1 ? " error\n" : " errors\n");
  }
  return rc;
}

// `troupe topology show FILE`: prints the normalized view of a valid file on stdout, or its
// problems on stderr (returning 1).
int show_topology(const std::string& file) {
  auto result = troupe::cluster::load_topology(file);
  if (!result.ok()) {
    for (const auto& d : result.errors)
      std::cerr << d.to_string() << "\n";
    return 1;
  }
  std::cout << troupe::cluster::describe(*result.value);
  return 0;
}

// Options of `troupe perf-model`.
struct perf_model_args {
  std::string model;
  std::string hardware;
  std::string phase;
  std::uint32_t ep = 0;
  std::uint64_t context = 0;
  std::uint64_t tokens_per_gpu = 0;
  std::uint64_t requests_per_gpu = 0;
  bool json = false;
};

// `troupe perf-model`: prints the modelled step time and tokens/s per node (or one JSON object
// with --json). Returns 0 on success, 1 with a message on stderr for a bad model, hardware or
// batch.
int perf_model(const perf_model_args& a, bool tokens_given, bool requests_given) {
  namespace sim = troupe::cluster::sim;
  auto fail = [](const std::string& msg) {
    std::cerr << "troupe perf-model: " << msg << "\n";
    return 1;
  };
  auto model = sim::resolve_model(a.model, sim::default_models_dir());
  if (!model)
    return fail(model.error());
  auto hw = sim::resolve_hardware(a.hardware);
  if (!hw)
    return fail(hw.error());
  sim::phase p = a.phase == "prefill" ? sim::phase::prefill : sim::phase::decode;
  sim::batch b;
  if (p == sim::phase::prefill) {
    if (requests_given)
      return fail("--requests-per-gpu is for decode; prefill takes --tokens-per-gpu");
    if (!tokens_given)
      return fail("prefill needs --tokens-per-gpu T (tokens per GPU per step)");
    if (a.tokens_per_gpu == 0)
      return fail("--tokens-per-gpu must be at least 1");
    b = sim::prefill_batch(a.tokens_per_gpu, a.context);
  } else {
    if (tokens_given)
      return fail("--tokens-per-gpu is for prefill; decode takes --requests-per-gpu");
    if (!requests_given)
      return fail("decode needs --requests-per-gpu R (sequences per GPU)");
    if (a.requests_per_gpu == 0)
      return fail("--requests-per-gpu must be at least 1");
    b = sim::decode_batch(a.requests_per_gpu, a.context);
  }
  auto r = sim::step_time(*model, *hw, p, a.ep, b);
  if (!r)
    return fail(r.error());
  double step_ms = r->total_s * 1e3;
  if (a.json) {
    nlohmann::json j;
    j["model"] = model->name;
    j["hardware"] = hw->name;
    j["phase"] = sim::to_string(p);
    j["ep"] = a.ep;
    j["context"] = a.context;
    j["tokens_per_gpu"] = b.tokens;
    j["sequences_per_gpu"] = b.sequences;
    j["step_ms"] = step_ms;
    j["tokens_per_s_per_node"] = r->tokens_per_s_per_node;
    j["breakdown_ms"] = {{"attention", r->attention_s * 1e3},
                         {"moe", r->moe_s * 1e3},
                         {"dense", r->dense_s * 1e3},
                         {"engram_read", r->engram_read_s * 1e3},
                         {"engram_wait", r->engram_wait_s * 1e3},
                         {"communication", r->communication_s * 1e3},
                         {"overlap", r->overlap_s * 1e3}};
    std::cout << j.dump() << "\n";
    return 0;
  }
  std::cout << fmt::format("model       {}\nhardware    {}\nphase       {}, EP{}, context {}\n",
                           model->name, hw->name, sim::to_string(p), a.ep, a.context);
  std::cout << fmt::format("batch       {} tokens, {} sequences per GPU\n", b.tokens,
                           b.sequences);
  std::cout << fmt::format("step        {:.3f} ms\n", step_ms);
  std::cout << fmt::format("throughput  {:.0f} {} tokens/s per {}-GPU node\n",
                           r->tokens_per_s_per_node,
                           p == sim::phase::prefill ? "input" : "output", hw->gpus_per_node);
  std::cout << fmt::format("breakdown   attention {:.3f} ms, moe {:.3f} ms, dense {:.3f} ms, "
                           "engram wait {:.3f} ms, communication {:.3f} ms, overlap {:.3f} ms\n",
                           r->attention_s * 1e3, r->moe_s * 1e3, r->dense_s * 1e3,
                           r->engram_wait_s * 1e3, r->communication_s * 1e3,
                           r->overlap_s * 1e3);
  return 0;
}

/// The inputs every real-world server takes (troupe serve, launch and node alike).
void add_server_options(CLI::App* cmd, troupe::cluster::serve_options& o, long& grace_s) {
  cmd->add_option("topology", o.topology,
                  "the topology file (its device: cpu, or cuda on NVIDIA hardware)")
    ->required();
  cmd->add_option("--model", o.model,
                  "the model directory (config.json + safetensors, the released layout)")
    ->required();
  cmd->add_option("--served-model-name", o.served_model_name,
                  "the model name clients use (default: the topology's model)");
  cmd->add_option("--api-keys", o.api_keys_file,
                  "a file of accepted API keys, one per line (default: no authentication)");
  cmd->add_option("--engram-map", o.engram_map,
                  "the Engram compressed-token map: a JSON file, or 'identity' for random models");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json(.gz) (default: the shipped DeepSeek-V4 tokenizer)");
  cmd->add_option("--threads", o.device_threads,
                  "CPU threads per device (default 2; on CUDA, of the CPU engine beside the GPU)");
  cmd->add_option("--max-context", o.max_context,
                  "longest context (prompt + output) of a request, in tokens (default: the "
                  "model's; at most 16384 on CUDA devices, whose KV page pool holds each of a step's "
                  "sequences at it)");
  cmd->add_option("--gpu-memory-utilization", o.gpu_memory_fraction,
                  "CUDA devices: the share of each GPU's memory a device may fill, weights and "
                  "its KV page pool included, as vLLM's option (default 0.9)")
    ->check(CLI::Range(0.01, 1.0));
  cmd->add_option("--kv-tokens", o.kv_tokens,
                  "tokens of KV a decode instance holds: requests wait for room beyond it (each "
                  "books its context and output budget); on CUDA also each device's page pool "
                  "(default: no limit but the batch; on CUDA the pool takes what "
                  "--gpu-memory-utilization leaves, at most a step's sequences at --max-context)");
  cmd->add_option("--max-in-flight", o.max_in_flight,
                  "generation requests in flight at once; more get 429 (default 64)");
  cmd->add_option("--compile-threads", o.compile_threads,
                  "threads compiling structured-output grammars while requests go on to prefill "
                  "(default 2)")
    ->check(CLI::Range(1u, 64u));
  cmd->add_option("--max-batch", o.max_batch,
                  "requests decoded together per decode instance (default: the decode pool's "
                  "max_batch, else 64)");
  cmd->add_option("--prefill-chunk", o.prefill_chunk,
                  "prompt tokens per prefill step (default: the prefill pool's chunk_tokens, "
                  "else 512)");
  cmd->add_option("--spec", o.spec,
                  "speculative decoding: off (default), fixedK (verify K = 1..5 drafts every "
                  "step) or dspark (per-step verify lengths under the device's measured step "
                  "times); drafts come from the model's DSpark layers");
  cmd->add_option("--overlap", o.overlap,
                  "overlapped scheduling: on (default: each decode step is built while the "
                  "previous one runs, speculating or not) or off");
  cmd->add_option("--eplb", o.eplb_ranks,
                  "expert-parallel load balancing: each device runs its MoEs as an EP group of "
                  "this many ranks with one spare slot each for copies of hot experts, re-placed "
                  "by the router's counts every --eplb-interval (default: off)");
  cmd->add_option("--eplb-interval", o.eplb_interval,
                  "with --eplb: re-place the experts by their load over the last interval every "
                  "this long (default 1min)");
  cmd->add_option("--kv-dir", o.kv_dir,
                  "the KV block store's directory (default: the topology's [storage] path)");
  cmd->add_option("--window-memory", o.window_memory,
                  "host memory per device for the window states kept where prompts and replies "
                  "end a block, so that a later request with that prefix restores exactly "
                  "(default 256MiB; 0: none kept, cached prefixes restore by bounded replay)");
  cmd->add_option("--grace", grace_s,
                  "seconds requests in flight get to finish on SIGTERM (default 30)");
  cmd->add_flag("--check-history", o.check_history,
                "record what the requests, the KV index and the decode balancer do, and on "
                "SIGTERM check it (tokens by position, every request ending once, KV TTLs, "
                "decode bookings) as the simulator's history checker does; violations are "
                "printed and the exit status is 1 (launch: in the control process)");
}

/// --tls-ca / --tls-cert / --tls-key: mutual TLS between a launched cluster's processes.
void add_tls_options(CLI::App* cmd, troupe::runtime::tls_options& tls) {
  cmd->add_option("--tls-ca", tls.ca_file, "the cluster CA's certificate (troupe certs): mutual TLS");
  cmd->add_option("--tls-cert", tls.cert_file, "this process's certificate, signed by the CA");
  cmd->add_option("--tls-key", tls.key_file, "this process's private key");
}

/// --kv-stream on|off: a prompt's blocks cross to its decode process while its prefill
/// computes, or in one transfer after it.
void add_kv_stream_option(CLI::App* cmd, bool& on) {
  cmd->add_option_function<std::string>(
        "--kv-stream", [&on](const std::string& v) { on = v == "on"; },
        "on (default): a prompt's full blocks cross to the decode process booked for it as its "
        "prefill chunks compute them; off: its KV crosses in one transfer after the prefill")
    ->check(CLI::IsMember({"on", "off"}));
}

void finish_server_options(troupe::cluster::serve_options& o, long grace_s) {
  o.grace = std::chrono::seconds(grace_s);
  if (o.tokenizer.empty())
    o.tokenizer = troupe::cli::default_tokenizer();
}

} // namespace

int main(int argc, char** argv) {
  // libfabric loads every provider it has; the PSM one (libinfinipath) installs a SIGSEGV
  // handler that prints a backtrace and exits, and can hang instead (seen in CI: a node process
  // printed "terminated with signal 11 ... Backtrace:" and never exited, so troupe launch could
  // not restart it). Without the handler a crash is a crash, which the launcher restarts.
  setenv("IPATH_NO_BACKTRACE", "1", 0);
  // Its constructor also handles SIGINT, SIGTERM, SIGILL, SIGABRT, SIGBUS and SIGSEGV by
  // calling exit() from the handler, which deadlocks when the signal lands in malloc (seen: a
  // `troupe serve` sent SIGTERM while it loaded the tokenizer hung in exit for good). Back to
  // the defaults: a stop signal before the command blocks them ends the process, a crash is a
  // crash.
  for (int sig : {SIGINT, SIGTERM, SIGILL, SIGABRT, SIGBUS, SIGSEGV})
    std::signal(sig, SIG_DFL);
  // The CPU engine's GEMMs on the CPU's vector units even where OpenBLAS does not know the CPU.
  troupe::kernels::reexec_with_blas_kernel_upgrade(argv);
#if TROUPE_HAVE_CUDA
  troupe::cluster::add_cuda_engine();  // device = "cuda" (cluster/device_engines.hpp)
#endif
  CLI::App app{"troupe: an actor-model serving runtime for DeepSeek-V4.1-class MoE models"};
  app.require_subcommand(1);
  int rc = 0;

  auto* version = app.add_subcommand("version", "print the troupe version");
  version->callback([] {
    std::cout << "troupe " << TROUPE_VERSION << " (OpenBLAS kernel "
              << troupe::kernels::blas_kernel_name() << ")\n";
  });

  // troupe certs: the cluster CA and a TLS key + certificate per node (cluster/launch/certs.hpp,
  // docs/tls.md).
  troupe::cluster::certs_options certs_opts;
  auto* certs = app.add_subcommand(
    "certs", "make the cluster CA and a TLS key + certificate per node (mutual TLS between "
             "processes)");
  certs->add_option("--out", certs_opts.out,
                    "the directory of the files (ca.pem, ca.key, NAME.pem, NAME.key); an "
                    "existing CA there is reused")
    ->required();
  certs->add_option("--nodes", certs_opts.nodes, "node names, comma-separated")
    ->required()
    ->delimiter(',');
  certs->add_option("--days", certs_opts.days,
                    "validity of the certificates made now, in days (default 365)");
  certs->callback([&] {
    auto res = troupe::cluster::make_certs(certs_opts);
    auto dir = certs_opts.out;
    if (res.ca_created)
      std::cout << "ca: created " << (dir / "ca.pem").string() << " and "
                << (dir / "ca.key").string() << "\n";
    else if (res.ok() || !res.created.empty() || !res.kept.empty())
      std::cout << "ca: reused " << (dir / "ca.pem").string() << "\n";
    for (const auto& n : res.created)
      std::cout << n << ": created " << (dir / (n + ".pem")).string() << " and "
                << (dir / (n + ".key")).string() << "\n";
    for (const auto& n : res.kept)
      std::cout << n << ": kept " << (dir / (n + ".pem")).string()
                << " (exists, signed by this CA)\n";
    if (!res.ok()) {
      std::cerr << "troupe certs: " << res.error << "\n";
      rc = 1;
    }
  });

  auto* topology = app.add_subcommand("topology", "check and show topology files");
  topology->require_subcommand(1);

  std::vector<std::string> check_files;
  auto* check = topology->add_subcommand(
    "check", "validate topology files; prints FILE: ok or each error as file:line:col");
  check->add_option("FILE", check_files, "topology files (TOML)")->required();
  check->callback([&] { rc = check_topologies(check_files); });

  std::string show_file;
  auto* show = topology->add_subcommand(
    "show", "print the normalized view of a topology: pools, GPUs, storage, autoscaler, nodes");
  show->add_option("FILE", show_file, "a topology file (TOML)")->required();
  show->callback([&] { rc = show_topology(show_file); });

  perf_model_args pm;
  auto* perf = app.add_subcommand(
    "perf-model", "model the step time and tokens/s per node of a model on a hardware");
  perf->add_option("--model", pm.model,
                   "deepseek-v4.1-flash, deepseek-v4-flash, deepseek-v3, or an HF config.json")
    ->required();
  perf->add_option("--hardware", pm.hardware,
                   "H800, H100, H200, B200, Ascend950, or a hardware profile .json")
    ->required();
  perf->add_option("--phase", pm.phase, "prefill or decode")
    ->required()
    ->check(CLI::IsMember({"prefill", "decode"}));
  perf->add_option("--ep", pm.ep, "expert-parallel size (GPUs per instance)")
    ->required()
    ->check(CLI::Range(1u, 1u << 20));
  perf->add_option("--context", pm.context,
                   "prefill: prompt length; decode: KV tokens per sequence")
    ->required()
    ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  auto* tokens_opt =
    perf->add_option("--tokens-per-gpu", pm.tokens_per_gpu, "prefill: tokens per GPU per step");
  auto* requests_opt =
    perf->add_option("--requests-per-gpu", pm.requests_per_gpu, "decode: sequences per GPU");
  tokens_opt->excludes(requests_opt);
  perf->add_flag("--json", pm.json, "print one JSON object (step_ms, tokens_per_s_per_node, ...)");
  perf->callback([&] {
    rc = perf_model(pm, tokens_opt->count() > 0, requests_opt->count() > 0);
  });

  troupe::cluster::sim::sim_command_options sim_opts;
  std::size_t sim_limit = 0;
  auto* sim = app.add_subcommand(
    "sim", "replay a trace or a synthetic workload through a simulated cluster and report");
  sim->add_option("TOPOLOGY", sim_opts.topology, "a topology file (TOML)")->required();
  auto* trace_opt
    = sim->add_option("--trace", sim_opts.trace, "a Mooncake .jsonl or Azure .csv trace");
  auto* workload_opt
    = sim->add_option("--workload", sim_opts.workload, "chat | agent | mixed (default chat)");
  trace_opt->excludes(workload_opt);
  sim->add_option("--rate", sim_opts.rate, "synthetic workload: requests per second (default 1)");
  sim->add_option("--duration", sim_opts.duration,
                  "synthetic workload: how long arrivals go on (default 10min)");
  sim->add_option("--speedup", sim_opts.speedup, "trace: replay K times faster (default 1)");
  sim->add_option("--seed", sim_opts.seed, "seed of every random choice (default 0)");
  sim->add_option("--until", sim_opts.until, "stop at this virtual time (e.g. 1h)");
  sim->add_option("--limit", sim_limit, "use only the first N requests");
  sim->add_option("--report", sim_opts.report_dir,
                  "write report.json, run.json and report.html to this folder");
  sim->add_option("--faults", sim_opts.faults,
                  "a fault plan (TOML, docs/faults.md): validated against the topology, "
                  "injected at its times (fail, recover, slow, partition, drain, surge, "
                  "store_fail, store_slow; docs/faults.md lists each kind's targets) and listed "
                  "in the report's fault timeline");
  std::uint64_t swarm_seed = 0;
  auto* swarm_seed_opt = sim->add_option(
    "--swarm-seed", swarm_seed,
    "replay seed S of `troupe swarm`: its drawn workload, fault plan and bound");
  swarm_seed_opt->excludes(trace_opt)->excludes(workload_opt);
  sim->add_option("--spec", sim_opts.spec,
                  "speculative decoding: off (default), fixedK (verify K = 1..5 drafts every "
                  "step) or dspark (per-step verify lengths for the most tokens per second)");
  sim->add_option("--overlap", sim_opts.overlap,
                  "overlapped decode scheduling: on (default: each step is built while the "
                  "previous one runs) or off (the device waits for the scheduler's time "
                  "between steps), speculating engines alike");
  sim->add_option("--swa-rebuild", sim_opts.swa_rebuild,
                  "how a KV cache hit's sliding-window state is rebuilt: bounded (default: "
                  "recompute the prompt's last window) or exact (layer by layer over the "
                  "window's receptive field)");
  sim->add_option_function<std::string>(
        "--kv-stream", [&](const std::string& v) { sim_opts.kv_stream = v == "on"; },
        "on: a prompt's full blocks move to the decode instance booked as its prefill begins "
        "while its chunks compute, and the hand-off after it moves the rest (troupe launch's "
        "default); off (default): one transfer of the whole KV after the prefill")
    ->check(CLI::IsMember({"on", "off"}));
  sim->add_option("--expert-skew", sim_opts.expert_skew,
                  "the routed experts' load: Zipf exponent over the experts (default 0: every "
                  "expert alike); each EP group waits for its busiest rank");
  sim->add_option("--structured", sim_opts.structured,
                  "the share of requests under a structured-output constraint (0 .. 1, default "
                  "0): each decode step builds their token masks on the host while the "
                  "forward runs, and waits for them when they take longer");
  sim->add_flag("--eplb", sim_opts.eplb,
                "place the experts by load with one spare slot per rank for copies of hot "
                "experts (the expert-parallel load balancer), instead of contiguous ranges");
  sim->add_option("--expert-drift", sim_opts.expert_drift,
                  "the experts' load drifts: the hot ranking moves one expert on every this "
                  "long (e.g. 2min; default: a fixed load)");
  sim->add_option("--eplb-interval", sim_opts.eplb_interval,
                  "with --eplb: re-place the experts by their load over the last interval every "
                  "this long (default 5min; 0: once, at start); the switch follows 10 s later");
  // Test only (docs/faults.md, "Swarm"): a planted bug that drops a request on reroute.
  sim->add_flag("--plant-bug", sim_opts.plant_bug)->group("");
  sim->add_flag("--quiet", sim_opts.quiet, "no progress bar");
  sim->add_flag("--profile", sim_opts.profile,
                "print on stderr the run's events by actor and message type (count, share, "
                "per request, wall time)");
  sim->add_flag("--check-history", sim_opts.check_history,
                "record the run's history (KV writes and hits, tokens delivered, decode "
                "bookings) and check the invariants from it alone (a violation exits 2, as any)");
  sim->add_flag("--json", sim_opts.json, "print report.json instead of the summary");
  sim->add_flag("--strict", sim_opts.strict, "a bad trace line is fatal");
  sim->callback([&] {
    if (sim_limit > 0)
      sim_opts.limit = sim_limit;
    if (swarm_seed_opt->count() > 0)
      sim_opts.swarm_seed = swarm_seed;
    rc = troupe::cluster::sim::run_sim_command(sim_opts, std::cout, std::cerr);
  });

  troupe::cluster::sim::swarm_command_options swarm_opts;
  swarm_opts.program = argv[0];
  auto* swarm = app.add_subcommand(
    "swarm", "run many seeds, each with a fault plan and workload drawn from the seed; check "
             "invariants; print the replay command of every failing seed");
  swarm->add_option("TOPOLOGY", swarm_opts.topology, "a topology file (TOML)")->required();
  swarm->add_option("--seeds", swarm_opts.seeds, "seeds A..B, inclusive (default 0..99)");
  swarm->add_option("--jobs", swarm_opts.jobs, "threads (default 1)")
    ->check(CLI::Range(1u, 1024u));
  swarm->add_flag("--quiet", swarm_opts.quiet, "no progress lines");
  // Test only (docs/faults.md, "Swarm"): a planted bug that drops a request on reroute.
  swarm->add_flag("--plant-bug", swarm_opts.plant_bug)->group("");
  std::string swarm_log_level = "error";
  swarm
    ->add_option("--log-level", swarm_log_level,
                 "the runs' log lines on stderr from this level on (default error: faults make "
                 "supervisors escalate by design, and the coverage counts what happened)")
    ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  swarm->callback([&] {
    troupe::runtime::log::set_level(swarm_log_level);
    rc = troupe::cluster::sim::run_swarm_command(swarm_opts, std::cout, std::cerr);
  });

  auto* model = app.add_subcommand("model", "create and inspect DeepSeek-V4.1 model directories");
  model->require_subcommand(1);
  std::string init_preset, init_out;
  std::uint64_t init_seed = 0;
  auto* init = model->add_subcommand(
    "init", "write a random V4.1 model directory (config.json + safetensors in the released layout)");
  init->add_option("--preset", init_preset, "tiny or small (~107M parameters)")
    ->required()
    ->check(CLI::IsMember({"tiny", "small"}));
  init->add_option("--seed", init_seed, "seed of the random weights (default 0)");
  init->add_option("--out", init_out, "the directory to write")->required();
  init->callback([&] {
    auto written = troupe::kernels::write_random_model(init_out, init_preset, init_seed);
    if (!written) {
      std::cerr << "troupe model init: " << written.error() << "\n";
      rc = 1;
      return;
    }
    std::cout << fmt::format("{}: {} preset, seed {}, {:.1f} M parameters, {} files, {:.1f} MiB\n",
                             init_out, init_preset, init_seed, written->parameters / 1e6,
                             written->files.size(), written->bytes / (1024.0 * 1024.0));
  });

  // troupe generate: one request end to end on the CPU model (token ids in and out).
  std::string gen_model, gen_tokens, gen_engram_map, gen_logits_out;
  troupe::kernels::generate_options gen_opts;
  int gen_threads = 2;
  bool gen_ignore_eos = false;
  bool gen_batch_invariant = false;
  bool gen_timings = false;
  auto* gen = app.add_subcommand("generate", "run a prompt of token ids through a model directory on the CPU");
  gen->add_option("--model", gen_model, "the model directory (config.json + safetensors)")->required();
  gen->add_option("--tokens", gen_tokens, "the prompt: comma-separated token ids")->required();
  gen->add_option("--max-new", gen_opts.max_new, "tokens to generate at most (default 32)");
  gen->add_flag("--greedy", gen_opts.sampling.greedy, "argmax decoding");
  gen->add_option("--temperature", gen_opts.sampling.temperature, "sampling temperature (default 1)");
  gen->add_option("--top-k", gen_opts.sampling.top_k, "keep the k most likely tokens (0: off)");
  gen->add_option("--top-p", gen_opts.sampling.top_p, "nucleus probability (1: off)");
  gen->add_option("--min-p", gen_opts.sampling.min_p, "keep tokens with p >= min_p * p_max (0: off)");
  gen->add_option("--seed", gen_opts.sampling.seed, "the request's sampling seed (default 0)");
  gen->add_flag("--ignore-eos", gen_ignore_eos, "do not stop at an end-of-sequence id");
  gen->add_option("--threads", gen_threads, "CPU threads (default 2)");
  gen->add_flag("--batch-invariant", gen_batch_invariant,
                "row-by-row projections, as troupe serve runs: the same ids as a served request");
  gen->add_option("--engram-map", gen_engram_map,
                  "the Engram compressed-token map: a JSON file, or 'identity' for random models");
  gen->add_flag("--timings", gen_timings,
                "print on stderr, as JSON, the model load time and when each token was drawn "
                "(seconds from the start of the generation)");
  gen->add_option("--logits-out", gen_logits_out,
                  "write the fp32 logits of every position (prompt and generated) as .npy");
  gen->callback([&] {
    auto fail = [&](const std::string& msg) {
      std::cerr << "troupe generate: " << msg << "\n";
      rc = 1;
    };
    std::vector<std::int64_t> prompt;
    std::stringstream in(gen_tokens);
    for (std::string item; std::getline(in, item, ',');) {
      std::int64_t v = -1;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
      if (ec != std::errc{} || end != item.data() + item.size() || item.empty() || v < 0)
        return fail("--tokens: expected comma-separated non-negative ids, found '" + item + "'");
      prompt.push_back(v);
    }
    using clock = std::chrono::steady_clock;
    const auto load_start = clock::now();
    auto m = troupe::kernels::model::load(
      gen_model, {.threads = gen_threads, .batch_invariant = gen_batch_invariant});
    if (!m) return fail(m.error());
    if (!m->text().engram_layer_ids.empty()) {
      if (gen_engram_map.empty())
        return fail("the model has Engram layers: give --engram-map FILE.json (or identity for a "
                    "random model directory)");
      auto map = troupe::kernels::load_engram_token_map(*m, gen_engram_map);
      if (!map) return fail(map.error());
      if (auto ok = m->set_engram_token_map(std::move(*map)); !ok) return fail(ok.error());
    }
    gen_opts.stop_at_eos = !gen_ignore_eos;
    gen_opts.keep_logits = !gen_logits_out.empty();
    const auto gen_start = clock::now();
    auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
    nlohmann::json token_s = nlohmann::json::array();
    if (gen_timings)
      gen_opts.on_token = [&](std::int64_t) {
        token_s.push_back(seconds(clock::now() - gen_start));
      };
    auto out = troupe::kernels::generate(*m, prompt, gen_opts);
    if (!out) return fail(out.error());
    if (gen_timings)
      std::cerr << nlohmann::json{{"load_s", seconds(gen_start - load_start)},
                                  {"token_s", token_s}}
                     .dump()
                << "\n";
    std::string ids;
    for (auto t : out->tokens) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    std::cout << ids << "\n";
    if (!gen_logits_out.empty()) {
      const std::int64_t vocab = m->text().vocab_size;
      const std::vector<std::int64_t> shape = {std::int64_t(out->logits.size()) / vocab, vocab};
      auto written = troupe::kernels::write_npy(gen_logits_out, shape, out->logits);
      if (!written) return fail(written.error());
    }
  });
  // troupe serve: the real world on one machine (cluster/serve_command.hpp, docs/serve.md).
  troupe::cluster::serve_options serve_opts;
  long serve_grace_s = 30;
  auto* serve = app.add_subcommand(
    "serve", "serve the OpenAI and Anthropic APIs from a topology on this machine (CPU backend)");
  add_server_options(serve, serve_opts, serve_grace_s);
  serve->add_option("--listen", serve_opts.listen, "HOST:PORT to listen on (default 127.0.0.1:8000)");
  serve->callback([&] {
    finish_server_options(serve_opts, serve_grace_s);
    rc = troupe::cluster::run_serve_command(serve_opts, std::cerr);
  });

  // troupe launch: the topology as OS processes under one supervisor (docs/launch.md).
  troupe::cluster::launch_options launch_opts;
  long launch_grace_s = 30;
  auto* launch = app.add_subcommand(
    "launch", "run a topology as OS processes (a control process, one per engine instance) "
              "under one supervisor");
  add_server_options(launch, launch_opts.serve, launch_grace_s);
  add_tls_options(launch, launch_opts.tls);
  launch->add_option("--node-tls-ca", launch_opts.node_tls.ca_file,
                     "the CA file of the processes it starts, when not --tls-ca (with the "
                     "agents and the launcher under a CA of their own: docs/tls.md)");
  launch->add_option("--node-tls-cert", launch_opts.node_tls.cert_file,
                     "the certificate of the processes it starts, when not --tls-cert");
  launch->add_option("--node-tls-key", launch_opts.node_tls.key_file,
                     "the key of the processes it starts, when not --tls-key");
  launch->add_option("--listen", launch_opts.serve.listen,
                     "HOST:PORT of the HTTP API (the control process; default 127.0.0.1:8000, with "
                     "--slurm 0.0.0.0:8000)");
  launch->add_option("--control", launch_opts.control,
                     "HOST:PORT the instances reach the control process on (default "
                     "127.0.0.1:0: a free port; with --slurm only the port counts, default "
                     "4242)");
  launch->add_option("--state", launch_opts.state_file,
                     "write the cluster's processes and addresses here (JSON) as they change");
  launch->add_flag("--dry-run", launch_opts.dry_run, "print the processes and their command lines");
  launch->add_option("--max-restarts", launch_opts.max_restarts,
                     "restart intensity: more restarts than this within --restart-period stop "
                     "the cluster (default 10)");
  launch->add_option("--faults", launch_opts.faults_file,
                     "execute a fault plan (troupe sim's format) on the processes, timed from "
                     "when the cluster serves");
  launch->add_option("--seed", launch_opts.seed, "seed of the fault plan's expansion (default 1)");
  launch->add_option("--fabric", launch_opts.fabric,
                     "the libfabric provider KV crosses processes by: tcp (default), shm, or none");
  add_kv_stream_option(launch, launch_opts.kv_stream);
  troupe::cli::add_block_fetchers_option(
    launch, launch_opts.block_fetchers,
    "a block fetcher process beside each prefill instance reads its cached blocks into shared "
    "memory");
  launch->add_option("--hosts", launch_opts.hosts_file,
                     "place the processes on the hosts of this file, each running `troupe agent` "
                     "(docs/launch.md)");
  launch->add_option("--events", launch_opts.events_file,
                     "append a JSON line per process event and fault action to this file");
  long restart_period_s = 60;
  auto* restart_period = launch->add_option("--restart-period", restart_period_s,
                                            "restart intensity period in seconds (default 60)");
  auto* slurm = launch->add_flag(
    "--slurm", launch_opts.slurm,
    "submit the cluster to Slurm as one heterogeneous job (as troupe slurm writes it) and follow "
    "it; SIGTERM or Ctrl-C drains the job (docs/deploy.md)");
  for (const char* local_only :
       {"--hosts", "--faults", "--seed", "--state", "--events", "--max-restarts", "--fabric"})
    slurm->excludes(launch->get_option(local_only));
  slurm->excludes(restart_period);
  troupe::cli::add_slurm_placement_options(launch, launch_opts.slurm_job, slurm);
  launch->callback([&] {
    // On Slurm the control listens on every interface unless told otherwise.
    if (launch_opts.slurm && launch->count("--listen") == 0)
      launch_opts.serve.listen = "0.0.0.0:8000";
    finish_server_options(launch_opts.serve, launch_grace_s);
    launch_opts.restart_period = std::chrono::seconds(restart_period_s);
    rc = troupe::cluster::run_launch_command(launch_opts, std::cout, shared_stderr());
  });

  // troupe agent: starts a launched cluster's processes on its host (cluster/launch/node_agent.hpp).
  std::string agent_listen, agent_name;
  auto* agent = app.add_subcommand(
    "agent", "start and watch a launched cluster's processes on this host, for troupe launch --hosts");
  agent->add_option("--listen", agent_listen, "HOST:PORT to listen on for the launcher")->required();
  agent->add_option("--name", agent_name, "this host's name in exit notices (default: HOST)");
  troupe::runtime::tls_options agent_tls;
  add_tls_options(agent, agent_tls);
  agent->callback([&] {
    rc = troupe::cluster::run_agent_command(agent_listen, agent_name, agent_tls, shared_stderr());
  });

  // troupe node: one process of a launched cluster (cluster/launch/node_command.hpp).
  troupe::cluster::node_options node_opts;
  long node_grace_s = 30;
  auto* node = app.add_subcommand(
    "node", "one process of a launched cluster: the control role, the block store or one "
            "engine instance (troupe launch starts these)");
  add_server_options(node, node_opts.serve, node_grace_s);
  // The store process holds no model; the other roles say so when --model is missing.
  node->get_option("--model")->required(false)->description(
    "the model directory (config.json + safetensors, the released layout); every role but "
    "store and fetcher");
  add_tls_options(node, node_opts.tls);
  node->add_option("--role", node_opts.role, "control, store, fetcher, prefill or decode")
    ->required();
  node->add_flag("--external-store", node_opts.external_store,
                 "control: the block store runs in a store process (--role store) that joins; "
                 "wait for it, and do not open the store directory here");
  node->add_option("--index", node_opts.index,
                   "the instance's number in its pool (prefill, decode), the store's shard "
                   "(store), or the prefill instance whose blocks it fetches (fetcher)");
  node->add_option("--gpus", node_opts.gpus,
                   "prefill, decode: the instance's healthy GPUs, e.g. 0,1,3 (default: all of "
                   "its gpus_per_instance); it runs on the first of them that make a valid EP "
                   "size (docs/faults.md, EP resize)")
    ->delimiter(',');
  node->add_option("--control", node_opts.control,
                   "HOST:PORT of the control process (control: where to publish it)")
    ->required();
  node->add_option("--listen", node_opts.serve.listen,
                   "control: HOST:PORT of the HTTP API (default 127.0.0.1:8000)");
  node->add_option("--fabric", node_opts.fabric,
                   "the libfabric provider KV and block store payloads cross processes by: tcp "
                   "(default), shm, or none (the decode side recomputes; store payloads go in "
                   "CAF messages)");
  add_kv_stream_option(node, node_opts.kv_stream);
  node->add_option("--fabric-host", node_opts.fabric_host,
                   "the address the fabric endpoint binds to (default: 127.0.0.1 for an "
                   "instance, the --control host for the control process; auto: the address "
                   "this machine reaches the control process from)");
  node->add_option("--ready-file", node_opts.ready_file,
                   "control: once serving, write the bound ports here (JSON)");
  long connect_timeout_s = 120;
  node->add_option("--connect-timeout", connect_timeout_s,
                   "instances: seconds to keep trying to reach the control process (default 120)");
  node->callback([&] {
    finish_server_options(node_opts.serve, node_grace_s);
    node_opts.connect_timeout = std::chrono::seconds(connect_timeout_s);
    troupe::cluster::reexec_with_huge_page_heap(node_opts, argv, shared_stderr());
    rc = troupe::cluster::run_node_command(node_opts, shared_stderr());
  });

  // troupe ep-rank: the ranks of an EP group beyond those its device runs as threads, started
  // by the device with its end of a socket as --fd (ports/rank_processes.hpp); not run by hand.
  troupe::ports::ep_rank_options rank_opts;
  int rank_fd = -1;
  bool rank_fast = false;
  auto* ep_rank = app.add_subcommand(
    "ep-rank", "ranks of an instance's EP group in a process of their own (started by the "
               "instance's device: a pool's ranks_per_process)");
  ep_rank->group("");
  ep_rank->add_option("--model", rank_opts.model_dir, "the model directory")->required();
  ep_rank->add_option("--engram-map", rank_opts.engram_map, "the Engram token map");
  ep_rank->add_option("--threads", rank_opts.threads, "threads per rank")->check(CLI::Range(1, 1024));
  ep_rank->add_option("--group", rank_opts.group, "ranks in the group")->required()
    ->check(CLI::Range(2, 1 << 16));
  ep_rank->add_option("--ranks", rank_opts.ranks, "this process's ranks, e.g. 2,3")->required()
    ->delimiter(',');
  ep_rank->add_option("--fd", rank_fd, "the socket to the instance's device")->required();
  ep_rank->add_flag("--fast", rank_fast, "not batch-invariant");
  ep_rank->callback([&] {
    rank_opts.batch_invariant = !rank_fast;
    rc = troupe::ports::run_ep_rank(rank_fd, rank_opts);
  });

  troupe::cli::add_recipe_commands(app, rc);
  troupe::cli::add_deploy_commands(app, rc, TROUPE_VERSION);

  CLI11_PARSE(app, argc, argv);
  return rc;
}
