#include "cluster/serve_setup.hpp"

#include "actors/entrypoint/api_keys.hpp"
#include "actors/lb/expert_balancer.hpp"
#include "actors/type_ids.hpp"
#include "cluster/launch/control_directory.hpp"
#include "cluster/sim/history_checker.hpp"
#include "cluster/device_engines.hpp"
#include "kernels/kv_blocks.hpp"
#include "kernels/safetensors.hpp"
#include "ports/cpu_device.hpp"
#include "ports/posix_store.hpp"
#include "ports/store_router.hpp"
#include "runtime/units.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <xxhash.h>

#include <chrono>
#include <deque>
#include <csignal>
#include <ctime>
#include <pthread.h>

namespace troupe::cluster {

namespace fs = std::filesystem;

std::optional<std::pair<std::string, std::uint16_t>> parse_host_port(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon + 1 == s.size())
    return std::nullopt;
  auto host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty())
    return std::nullopt;
  unsigned long port = 0;
  for (char c : s.substr(colon + 1)) {
    if (c < '0' || c > '9')
      return std::nullopt;
    port = port * 10 + static_cast<unsigned long>(c - '0');
    if (port > 65535)
      return std::nullopt;
  }
  return std::pair{host, static_cast<std::uint16_t>(port)};
}

std::optional<serve_inputs> load_serve_inputs(const serve_options& o, const std::string& command,
                                              std::ostream& err, bool devices_here) {
  auto fail = [&](const std::string& msg) -> std::optional<serve_inputs> {
    err << command << ": " << msg << "\n";
    return std::nullopt;
  };
  serve_inputs in;
  // The topology: a prefill and a decode pool on the CPU backend.
  auto loaded = load_topology(o.topology);
  if (!loaded.value) {
    for (const auto& d : loaded.errors)
      err << d.to_string() << "\n";
    return std::nullopt;
  }
  in.topo = *loaded.value;
  // The engine of the GPU ranks: the topology's device.
  const auto& device = in.topo.cluster.device;
  if (device.empty())
    return fail(o.topology + ": hardware '" + in.topo.cluster.hardware
                + "' has no device backend (the topology is for the simulator); add "
                  "device = \"cpu\" to [cluster] to serve it on the CPU backend");
  const device_engine* engine = nullptr;
  if (device != "cpu") {
    engine = find_device_engine(device);
    if (engine == nullptr)
      return fail(o.topology + ": device \"" + device + "\": this troupe was built without the "
                  + (device == "cuda" ? "CUDA engine (CMake found no nvcc, cuBLASLt or NCCL: "
                                        "docs/cuda.md)"
                                      : "engine")
                  + "; device = \"cpu\" runs the CPU backend");
    if (auto why = devices_here ? engine->unusable() : std::string{}; !why.empty())
      return fail(o.topology + ": device \"" + device + "\": " + why
                  + " (device = \"cpu\" runs the CPU backend)");
  }
  if (auto why = check_real_topology(in.topo); !why.empty())
    return fail(why);

  // The model: its config tells the context, the vocabulary and whether it needs an Engram map.
  if (o.model.empty())
    return fail("--model DIR is required (a model directory in the released layout; "
                "`troupe model init --preset small --out DIR` writes a random one)");
  auto cfg = kernels::load_model_config(o.model);
  if (!cfg)
    return fail(cfg.error());
  in.model = *cfg;
  const auto& text = in.model.text;
  if (!text.engram_layer_ids.empty() && o.engram_map.empty())
    return fail("the model has Engram layers: give --engram-map FILE.json (or identity for a "
                "random model directory)");
  const auto model_context = static_cast<std::uint64_t>(text.max_position_embeddings);
  if (o.max_context == 1 || o.max_context > model_context)
    return fail("--max-context " + std::to_string(o.max_context) + ": expected 2 .. "
                + std::to_string(model_context) + " tokens (the model's context)");
  in.max_context = o.max_context > 0 ? o.max_context : model_context;
  if (o.max_context == 0 && engine != nullptr && engine->default_context > 0)
    in.max_context = std::min(model_context, engine->default_context);
  if (o.kv_tokens > 0 && o.kv_tokens < in.max_context)
    return fail("--kv-tokens " + std::to_string(o.kv_tokens) + ": below the longest context (" +
                std::to_string(in.max_context) + " tokens, --max-context): a request that long "
                "could never be booked on a decode instance");

  // Speculative decoding: a known mode, and draft layers to propose with.
  if (!actors::parse_speculation(o.spec))
    return fail("--spec " + o.spec + ": expected off, fixed1 .. fixed5 or dspark");
  if (engine != nullptr && !engine->speculative && o.spec != "off")
    return fail("--spec " + o.spec + ": the engine of device \"" + device
                + "\" does not run speculative decoding; use --spec off, or device = \"cpu\"");
  if (o.overlap != "on" && o.overlap != "off")
    return fail("--overlap " + o.overlap + ": expected on or off");
  if (o.eplb_ranks == 1 || o.eplb_ranks > text.n_routed_experts)
    return fail("--eplb " + std::to_string(o.eplb_ranks) + ": expected 2 .. "
                + std::to_string(text.n_routed_experts)
                + " ranks (the model's routed experts) for each device's EP group");
  for (const auto role : {pool_role::prefill, pool_role::decode}) {
    const auto* pool = find_pool(in.topo, role);
    if (pool->gpus_per_instance > text.n_routed_experts)
      return fail(o.topology + ": pool '" + pool->name + "' has gpus_per_instance = "
                  + std::to_string(pool->gpus_per_instance) + "; the model has "
                  + std::to_string(text.n_routed_experts)
                  + " routed experts, at least one per rank of an instance's EP group");
    if (pool->gpus_per_instance > 1 && o.eplb_ranks > 0)
      return fail("--eplb " + std::to_string(o.eplb_ranks) + ": pool '" + pool->name
                  + "' runs its instances as EP groups of " + std::to_string(pool->gpus_per_instance)
                  + " ranks, which keep the placement they start with; drop --eplb, or set "
                    "gpus_per_instance = 1");
  }
  auto interval = runtime::parse_duration(o.eplb_interval);
  if (!interval || interval.value <= runtime::duration{0})
    return fail("--eplb-interval " + o.eplb_interval + ": expected a duration > 0 (e.g. 30s)");
  in.eplb_interval = interval.value;
  auto window = runtime::parse_size(o.window_memory);
  if (!window)
    return fail("--window-memory: " + window.error);
  in.window_memory = window.value;
  if (o.spec != "off") {
    auto ckpt = kernels::checkpoint::open(o.model);
    if (!ckpt)
      return fail(ckpt.error());
    if (text.num_nextn_predict_layers == 0 || !ckpt->contains("mtp.0.main_proj.weight"))
      err << command << ": warning: --spec " << o.spec << ": " << o.model
          << " has no DSpark draft layers (mtp.*): nothing is proposed, every step decodes one "
             "token\n";
  }

  // The tokenizer, and that its ids fit the model.
  auto codec_or = recipe::codec::load(o.tokenizer);
  if (auto* e = std::get_if<recipe::load_error>(&codec_or))
    return fail(e->message);
  in.codec = std::make_unique<recipe::codec>(std::move(std::get<recipe::codec>(codec_or)));
  if (static_cast<std::int64_t>(in.codec->tokenizer().vocab_size()) > text.vocab_size)
    return fail("the tokenizer has " + std::to_string(in.codec->tokenizer().vocab_size())
                + " ids but the model only " + std::to_string(text.vocab_size)
                + " (a model for another tokenizer; the `small` preset has the full vocabulary)");

  auto dir = store_directory(o, in.topo, command, err);
  if (!dir)
    return std::nullopt;
  in.kv_dir = std::move(*dir);
  return in;
}

std::optional<std::filesystem::path> store_directory(const serve_options& o, const topology& topo,
                                                     const std::string& command,
                                                     std::ostream& err) {
  fs::path dir = o.kv_dir;
  if (dir.empty() && topo.storage.backend == storage_backend::posix)
    dir = topo.storage.path;
  if (dir.empty())
    return dir;
  std::error_code ec;
  auto absolute = fs::absolute(dir, ec);
  if (ec) {
    err << command << ": the KV store directory " << dir.string() << ": " << ec.message() << "\n";
    return std::nullopt;
  }
  return absolute;
}

std::optional<std::set<std::string>> load_api_keys_option(const serve_options& o,
                                                          const std::string& command,
                                                          std::ostream& err) {
  if (o.api_keys_file.empty()) {
    err << command << ": warning: no --api-keys file: the API is open to anyone who can reach "
        << o.listen << "\n";
    return std::set<std::string>{};
  }
  auto k = actors::load_api_keys(o.api_keys_file);
  if (auto* e = std::get_if<actors::api_keys_error>(&k)) {
    err << command << ": " << e->message << "\n";
    return std::nullopt;
  }
  auto keys = std::get<std::set<std::string>>(std::move(k));
  if (keys.empty()) {
    err << command << ": " << o.api_keys_file
        << ": no API key in the file (remove --api-keys to serve without authentication)\n";
    return std::nullopt;
  }
  return keys;
}

runtime::world_options real_world_options(bool network, const runtime::tls_options& tls) {
  runtime::world_options o{
    runtime::world_mode::real, 0, 0, network, [network](caf::actor_system_config& cfg) {
      actors::register_actor_types(cfg);
      if (network)
        register_launch_types(cfg);
      // A shared queue whose idle workers sleep on a condition variable: the devices' compute
      // threads get the cores, where work stealing's polling workers would compete with them.
      cfg.set("scheduler.policy", caf::atom("sharing"));
    }};
  o.tls = tls;
  return o;
}

namespace {

/// The expert balancer of one CPU device (serve --eplb): every `interval` it places the
/// device's experts over `ranks` ranks (their share of the experts and one spare slot each, as
/// the simulator's EPLB) by the router's counts over the last interval, and the device switches
/// at its next step (its weights are all in host memory: nothing to load first). Reports the
/// balancedness of the placement the device ran and of the new one under that load.
actors::expert_balancer_actor spawn_device_balancer(caf::actor_system& sys,
                                                    std::shared_ptr<ports::expert_link> link,
                                                    std::uint32_t experts, std::uint32_t ranks,
                                                    runtime::duration interval,
                                                    runtime::registry& metrics,
                                                    const std::string& device) {
  // Read and written by the balancer's load and publish only: one actor, one at a time.
  struct window {
    std::deque<std::pair<runtime::time_point, std::vector<std::uint64_t>>> snapshots;
    std::optional<actors::expert_placement> running;
  };
  auto w = std::make_shared<window>();
  actors::expert_balancer_params eb;
  eb.ranks = ranks;
  eb.slots_per_rank = (experts + ranks - 1) / ranks + 1;
  eb.interval = interval;
  eb.window = interval;
  eb.load_time = runtime::duration{0};
  // The load over [from, to): the counts now less those of the last snapshot at or before
  // `from` (the oldest one while the window is young).
  eb.load = [w, link](runtime::time_point from, runtime::time_point to) {
    auto now = link->totals();
    w->snapshots.emplace_back(to, now);
    while (w->snapshots.size() > 1 && w->snapshots[1].first <= from)
      w->snapshots.pop_front();
    const auto& base = w->snapshots.front().second;
    std::vector<double> load(now.size());
    for (std::size_t e = 0; e < now.size(); ++e)
      load[e] = static_cast<double>(now[e] - base[e]);
    return load;
  };
  const char* help = "Balancedness (mean / max rank load) of a device's EP ranks under the "
                     "router's load of the expert balancer's last interval (serve --eplb): with "
                     "the placement the device ran, and with the one it switches to.";
  auto before = runtime::gauge_child(&metrics, "troupe_eplb_balancedness", help,
                                     {"device", "placement"}, {device, "previous"});
  auto after = runtime::gauge_child(&metrics, "troupe_eplb_balancedness", help,
                                    {"device", "placement"}, {device, "new"});
  eb.publish = [w, link, ranks, before, after](const std::vector<double>& load,
                                               const actors::expert_placement& p) {
    // Before the first switch the device runs contiguous ranges, one copy each.
    const auto previous = w->running ? actors::balancedness_under(*w->running, load)
                                     : actors::contiguous_placement(load, ranks).balancedness();
    if (before != nullptr)
      before->set(previous);
    if (after != nullptr)
      after->set(p.balancedness());
    w->running = p;
    link->propose(actors::dispatch_placement(p));
  };
  return actors::spawn_expert_balancer(sys, std::move(eb));
}

} // namespace

std::optional<real_graph_params>
make_real_graph_params(caf::actor_system& sys, const serve_options& o, const serve_inputs& in,
                       runtime::registry& metrics,
                       std::shared_ptr<actors::constraint_table> constraints,
                       const std::string& command, std::ostream& err,
                       runtime::store_port cluster_store) {
  real_graph_params gp;
  gp.metrics = &metrics;
  if (o.check_history)
    gp.history = std::make_shared<actors::run_history>();
  // (--spec was checked by load_serve_inputs.)
  const auto spec = actors::parse_speculation(o.spec).value_or(actors::speculation_setting{});
  gp.spec = spec;
  gp.overlap = o.overlap == "on";
  gp.keep_windows = in.window_memory > 0;
  // DSpark's cost curve: the first decode device to load measures its step times.
  std::shared_ptr<ports::step_profile> profile;
  if (spec.spec == actors::speculation::dspark) {
    profile = std::make_shared<ports::step_profile>();
    gp.step_cost = [profile](const runtime::device_step& s) {
      return runtime::from_seconds(profile->seconds(s.tokens));
    };
  }
  const auto experts = static_cast<std::uint32_t>(in.model.text.n_routed_experts);
  const auto* prefill_pool = find_pool(in.topo, pool_role::prefill);
  const auto* decode_pool = find_pool(in.topo, pool_role::decode);
  // Step budgets: the command line, else the topology's pools, else the defaults.
  gp.max_batch = o.max_batch > 0 ? o.max_batch
                 : decode_pool->max_batch > 0 ? decode_pool->max_batch : 64;
  gp.prefill_chunk = o.prefill_chunk > 0 ? o.prefill_chunk
                     : prefill_pool->chunk_tokens > 0 ? prefill_pool->chunk_tokens : 512;
  gp.max_context = in.max_context;
  gp.decode_kv_tokens = o.kv_tokens;
  // The engine of a device other than the CPU one (load_serve_inputs found it registered).
  const device_engine* engine = find_device_engine(in.topo.cluster.device);
  // A device holds a step's sequences at once: a decode batch, or the prefill jobs of one step
  // (each gets at least a 128-token share of the chunk, prefill_engine.hpp).
  const auto per_step = static_cast<std::int64_t>(gp.max_batch);
  const auto prefill_jobs = static_cast<std::int64_t>(
    (gp.prefill_chunk + kernels::kv_block_tokens - 1) / kernels::kv_block_tokens);
  // A pool whose instances' ranks are split over processes: the devices start them (this
  // program, `troupe ep-rank`), and a rank process that dies costs its instance those ranks.
  std::filesystem::path rank_program;
  for (const auto* pool : {prefill_pool, decode_pool})
    if (pool->ranks_per_process > 0 && pool->ranks_per_process < pool->gpus_per_instance) {
      std::error_code ec;
      rank_program = std::filesystem::read_symlink("/proc/self/exe", ec);
      gp.losses = std::make_shared<rank_losses>();
    }
  gp.device = [&o, &metrics, constraints, profile, experts, engine, rank_program,
               losses = gp.losses,
               split = std::pair{prefill_pool->ranks_per_process, decode_pool->ranks_per_process},
               limits = device_limits{.max_sequences = per_step,
                                      .max_context = static_cast<std::int64_t>(gp.max_context),
                                      .kv_tokens = static_cast<std::int64_t>(o.kv_tokens),
                                      .memory_fraction = o.gpu_memory_fraction},
               prefill_limit = std::max(per_step, prefill_jobs),
               prefill_instances = prefill_pool->instances.initial,
               interval = in.eplb_interval,
               window = in.window_memory](caf::actor_system& sys, pool_role role,
                                            std::uint32_t instance, std::uint32_t ranks) {
    ports::cpu_device_params d;
    d.model_dir = o.model;
    d.ep_ranks = ranks;
    d.ranks_per_process = role == pool_role::prefill ? split.first : split.second;
    d.rank_program = rank_program;
    if (losses)
      d.on_ranks_lost = [losses, role, instance](std::uint32_t n) {
        losses->lose(role, instance, n);
      };
    d.threads = o.device_threads;
    d.batch_invariant = true;
    if (engine != nullptr) {
      auto mine = limits;
      mine.index = role == pool_role::prefill ? instance : prefill_instances + instance;
      if (role == pool_role::prefill)
        mine.max_sequences = prefill_limit;
      d.backend = engine->opener(mine);
    }
    d.engram_map = o.engram_map;
    d.keep_bytes = window;
    d.metrics = &metrics;
    d.name = std::string(to_string(role)) + "/" + std::to_string(instance);
    d.constraints = constraints;
    if (role == pool_role::decode)
      d.profile = profile;
    if (o.eplb_ranks == 0)
      return ports::spawn_cpu_device(sys, std::move(d));
    auto link = std::make_shared<ports::expert_link>(experts);
    // The EP group starts from contiguous expert ranges, one copy each (--eplb was checked
    // against the experts), until the balancer's first placement.
    link->propose(*kernels::place_experts(static_cast<std::int32_t>(experts),
                                          static_cast<std::int32_t>(o.eplb_ranks)));
    d.experts = link;
    auto name = d.name;
    auto device = ports::spawn_cpu_device(sys, std::move(d));
    auto balancer = spawn_device_balancer(sys, std::move(link), experts, o.eplb_ranks, interval,
                                          metrics, name);
    // The balancer goes with its device (a restarted device gets a new pair).
    caf::actor_cast<caf::strong_actor_ptr>(device)->get()->attach_functor(
      [balancer](const caf::error&) {
        caf::anon_send_exit(balancer, caf::exit_reason::user_shutdown);
      });
    return device;
  };
  // The cluster KV cache: block files in the topology's directory (or --kv-dir), keyed by
  // chains rooted in the model's fingerprint.
  if (!in.kv_dir.empty() || cluster_store) {
    auto fp = ports::model_fingerprint(o.model);
    if (!fp) {
      err << command << ": " << fp.error() << "\n";
      return std::nullopt;
    }
    if (cluster_store) {
      gp.store = std::move(cluster_store);
    } else {
      ports::posix_store_params sp;
      sp.directory = in.kv_dir;
      sp.capacity = in.topo.storage.capacity_bytes;
      sp.metrics = &metrics;
      gp.store = ports::spawn_sharded_posix_store(sys, std::move(sp),
                                                  in.topo.storage.real_shards(),
                                                  in.topo.storage.real_replicas());
    }
    auto root = XXH3_128bits(fp->data(), fp->size());
    gp.chain_root = actors::block_key{root.high64, root.low64};
  }
  gp.block_bytes = static_cast<std::uint64_t>(kernels::block_kv_bytes(in.model.text));
  return gp;
}

int check_run_history(caf::actor_system& sys, const serve_inputs& in, const real_graph_params& gp,
                      const actors::decode_lb_actor& decode_lb, runtime::time_point origin,
                      bool all_ended, const std::string& command, std::ostream& err) {
  // decode_lb answers after the releases the requests queued before they ended.
  caf::scoped_actor self{sys};
  self->request(decode_lb, std::chrono::seconds(30), actors::lb_stats_atom::value)
    .receive([](const actors::lb_counters&) {}, [](const caf::error&) {});
  sim::history_expectations expect;
  expect.origin = origin;
  expect.ttl = sim::ttl_of_classes(in.topo.storage.ttl);
  expect.decode_kv_tokens = gp.decode_kv_tokens > 0 ? gp.decode_kv_tokens
                                                    : actors::decode_balancer_params{}.max_kv_tokens;
  expect.decode_max_requests = gp.max_batch;
  expect.restart_time = std::chrono::seconds(1);  // the pools' restart delay (real_graph.cpp)
  expect.run_finished = all_ended;
  expect.modelled_tokens = false;
  // Late facts (a KV write still on its way) are left out: nothing recorded before depends on them.
  const auto report = sim::check_history(gp.history->snapshot(), expect);
  err << command << ": history: " << report.request_facts << " request, " << report.token_facts
      << " token, " << report.kv_facts << " KV and " << report.booking_facts << " booking facts: "
      << (report.ok() ? "no violations" : std::to_string(report.violations.size()) + " violation(s)")
      << "\n";
  for (const auto& v : report.violations)
    err << command << ": " << v.to_string() << "\n";
  return report.ok() ? 0 : 1;
}

/// Sends one short request through the whole graph and waits for its end: both devices have
/// loaded the model and every actor on the path answers. Returns an error message, or empty.
std::string warm_up(caf::actor_system& sys, const actors::generation_service& service,
                    caf::timespan timeout, const caf::actor& cluster, int& stopped_by) {
  caf::scoped_actor self{sys};
  if (cluster)
    self->monitor(cluster);
  actors::generation_request g;
  g.id = 0;  // the entrypoint numbers client requests from 1
  g.prompt = {0, 1};
  g.max_tokens = 2;
  g.sampling.temperature = 0;
  g.sink = caf::actor_cast<caf::actor>(self);
  std::string failure;
  caf::actor request;
  self->request(service, timeout, std::move(g))
    .receive([&](const caf::actor& r) { request = r; },
             [&](const caf::error& e) { failure = "warm-up refused: " + sys.render(e); });
  if (!failure.empty())
    return failure;
  // Half-second waits, so that a stop signal or the cluster's end is seen while models load.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool ended = false;
  while (!ended && failure.empty()) {
    self->receive(
      [](const actors::generation_tokens&) {},
      [&](const actors::generation_end& end) {
        ended = true;
        if (end.reason == actors::finish_reason::error)
          failure = "warm-up request failed: " + end.error;
      },
      [&](const caf::down_msg& d) {
        failure = "the cluster stopped while loading: " + sys.render(d.reason);
      },
      caf::after(std::chrono::milliseconds(500)) >> [&] {
        if (int sig = poll_stop_signal(std::chrono::milliseconds(0)); sig != 0) {
          stopped_by = sig;
          failure = std::string(signal_name(sig)) + " while loading";
        } else if (std::chrono::steady_clock::now() > deadline) {
          failure = "warm-up request timed out";
        }
      });
  }
  if (!ended)  // given up: the request must not wait on for instances that will not come
    self->send(request, actors::cancel_atom::value);
  return failure;
}

namespace {

sigset_t stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);
  return signals;
}

/// A stop signal taken by a handler instead of sigtimedwait (one that reached a thread not
/// blocking it: a library's thread started before block_stop_signals).
volatile std::sig_atomic_t caught_signal = 0;

extern "C" void note_stop_signal(int sig) { caught_signal = sig; }

} // namespace

void block_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = note_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
  auto signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int poll_stop_signal(std::chrono::milliseconds timeout) {
  if (int sig = caught_signal; sig != 0) {
    caught_signal = 0;
    return sig;
  }
  auto signals = stop_signals();
  timespec ts{static_cast<time_t>(timeout.count() / 1000),
              static_cast<long>(timeout.count() % 1000) * 1000000L};
  int sig = sigtimedwait(&signals, nullptr, &ts);
  if (sig > 0)
    return sig;
  if (int caught = caught_signal; caught != 0) {
    caught_signal = 0;
    return caught;
  }
  return 0;
}

const char* signal_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "SIGINT";
}

int wait_for_stop_signal() {
  for (;;)
    if (int sig = poll_stop_signal(std::chrono::milliseconds(500)); sig != 0)
      return sig;
}

} // namespace troupe::cluster
