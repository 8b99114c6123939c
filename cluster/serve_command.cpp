#include "cluster/serve_command.hpp"

#include "actors/entrypoint/api_keys.hpp"
#include "actors/entrypoint/entrypoint.hpp"
#include "actors/type_ids.hpp"
#include "cluster/real_graph.hpp"
#include "cluster/topology.hpp"
#include "kernels/kv_blocks.hpp"
#include "kernels/model_config.hpp"
#include "ports/cpu_device.hpp"
#include "ports/posix_store.hpp"
#include "recipe/recipe.hpp"
#include "runtime/metrics.hpp"
#include "runtime/world.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include <xxhash.h>

#include <csignal>
#include <filesystem>
#include <limits>
#include <set>
#include <ostream>
#include <pthread.h>

namespace troupe::cluster {

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;


/// "host:port" → (host, port); IPv6 as "[::1]:8000".
std::optional<std::pair<std::string, std::uint16_t>> parse_listen(const std::string& s) {
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

/// Sends one short request through the whole graph and waits for its end: both devices have
/// loaded the model and every actor on the path answers. Returns an error message, or empty.
std::string warm_up(caf::actor_system& sys, const actors::generation_service& service) {
  caf::scoped_actor self{sys};
  actors::generation_request g;
  g.id = 0;  // the entrypoint numbers client requests from 1
  g.prompt = {0, 1};
  g.max_tokens = 2;
  g.sampling.temperature = 0;
  g.sink = caf::actor_cast<caf::actor>(self);
  std::string failure;
  self->request(service, 10min, std::move(g))
    .receive([](const caf::actor&) {},
             [&](const caf::error& e) { failure = "warm-up refused: " + sys.render(e); });
  if (!failure.empty())
    return failure;
  bool ended = false;
  while (!ended && failure.empty()) {
    self->receive([](const actors::generation_tokens&) {},
                  [&](const actors::generation_end& end) {
                    ended = true;
                    if (end.reason == actors::finish_reason::error)
                      failure = "warm-up request failed: " + end.error;
                  },
                  caf::after(10min) >> [&] { failure = "warm-up request timed out (10 min)"; });
  }
  return failure;
}

} // namespace

int run_serve_command(const serve_options& o, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "troupe serve: " << msg << "\n";
    return 1;
  };

  // The topology: a prefill and a decode pool on the CPU backend.
  auto loaded = load_topology(o.topology);
  if (!loaded.value) {
    for (const auto& d : loaded.errors)
      err << d.to_string() << "\n";
    return 1;
  }
  const auto& topo = *loaded.value;
  if (topo.cluster.hardware != "cpu")
    return fail(o.topology + ": hardware '" + topo.cluster.hardware
                + "' needs the CUDA backend, which is not built yet; troupe serve runs the CPU "
                  "backend (hardware = \"cpu\"; examples/topologies/local-cpu.toml)");
  if (auto why = check_real_topology(topo); !why.empty())
    return fail(why);
  const auto* prefill_pool = find_pool(topo, pool_role::prefill);
  const auto* decode_pool = find_pool(topo, pool_role::decode);

  // The model: its config tells the context, the vocabulary and whether it needs an Engram map.
  if (o.model.empty())
    return fail("--model DIR is required (a model directory in the released layout; "
                "`troupe model init --preset small --out DIR` writes a random one)");
  auto cfg = kernels::load_model_config(o.model);
  if (!cfg)
    return fail(cfg.error());
  const auto& text = cfg->text;
  if (!text.engram_layer_ids.empty() && o.engram_map.empty())
    return fail("the model has Engram layers: give --engram-map FILE.json (or identity for a "
                "random model directory)");

  // The tokenizer, and that its ids fit the model.
  auto codec_or = recipe::codec::load(o.tokenizer);
  if (auto* e = std::get_if<recipe::load_error>(&codec_or))
    return fail(e->message);
  auto& codec = std::get<recipe::codec>(codec_or);
  if (static_cast<std::int64_t>(codec.tokenizer().vocab_size()) > text.vocab_size)
    return fail("the tokenizer has " + std::to_string(codec.tokenizer().vocab_size())
                + " ids but the model only " + std::to_string(text.vocab_size)
                + " (a model for another tokenizer; the `small` preset has the full vocabulary)");

  // The KV store's directory: --kv-dir, else the topology's posix path (relative paths
  // from the working directory); none for a topology with the simulated store.
  fs::path kv_dir = o.kv_dir;
  if (kv_dir.empty() && topo.storage.backend == storage_backend::posix)
    kv_dir = topo.storage.path;
  if (!kv_dir.empty()) {
    std::error_code ec;
    kv_dir = fs::absolute(kv_dir, ec);
    if (ec)
      return fail("the KV store directory " + kv_dir.string() + ": " + ec.message());
  }

  auto listen = parse_listen(o.listen);
  if (!listen)
    return fail("--listen '" + o.listen + "': expected HOST:PORT, e.g. 127.0.0.1:8000");
  std::set<std::string> keys;
  if (!o.api_keys_file.empty()) {
    auto k = actors::load_api_keys(o.api_keys_file);
    if (auto* e = std::get_if<actors::api_keys_error>(&k))
      return fail(e->message);
    keys = std::get<std::set<std::string>>(std::move(k));
    if (keys.empty())
      return fail(o.api_keys_file + ": no API key in the file (remove --api-keys to serve "
                                    "without authentication)");
  } else {
    err << "troupe serve: warning: no --api-keys file: the API is open to anyone who can "
           "reach "
        << o.listen << "\n";
  }

  // SIGTERM / SIGINT are taken by this thread alone (sigwait below): blocked before any other
  // thread starts, so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  runtime::world w{runtime::world_options{
    runtime::world_mode::real, 0, 0, false, [](caf::actor_system_config& cfg) {
      actors::register_actor_types(cfg);
      // A shared queue whose idle workers sleep on a condition variable: the devices' compute
      // threads get the cores, where work stealing's polling workers would compete with them.
      cfg.set("scheduler.policy", caf::atom("sharing"));
    }}};
  auto& sys = w.system();

  // Every part reports into one registry, which /metrics serves.
  runtime::registry metrics;
  real_graph_params gp;
  // Structured output: the entrypoint compiles each request's format, the devices mask with it.
  auto constraints = std::make_shared<actors::constraint_table>(codec.tokenizer());
  gp.device = [&o, &metrics, constraints](caf::actor_system& sys, pool_role role, std::uint32_t instance) {
    ports::cpu_device_params d;
    d.model_dir = o.model;
    d.threads = o.device_threads;
    d.batch_invariant = true;
    d.engram_map = o.engram_map;
    d.metrics = &metrics;
    d.name = std::string(to_string(role)) + "/" + std::to_string(instance);
    d.constraints = constraints;
    return ports::spawn_cpu_device(sys, std::move(d));
  };
  // The cluster KV cache: block files in the topology's directory (or --kv-dir), keyed by
  // chains rooted in the model's fingerprint.
  if (!kv_dir.empty()) {
    ports::posix_store_params sp;
    sp.directory = kv_dir;
    sp.capacity = topo.storage.capacity_bytes;
    sp.metrics = &metrics;
    gp.store = ports::spawn_posix_store(sys, std::move(sp));
    auto fp = ports::model_fingerprint(o.model);
    if (!fp)
      return fail(fp.error());
    auto root = XXH3_128bits(fp->data(), fp->size());
    gp.chain_root = actors::block_key{root.high64, root.low64};
  }
  gp.block_bytes = static_cast<std::uint64_t>(kernels::block_kv_bytes(text));
  gp.max_context = static_cast<std::uint64_t>(text.max_position_embeddings);
  // Step budgets: the command line, else the topology's pools, else the defaults.
  gp.max_batch = o.max_batch > 0 ? o.max_batch
                 : decode_pool->max_batch > 0 ? decode_pool->max_batch : 64;
  gp.prefill_chunk = o.prefill_chunk > 0 ? o.prefill_chunk
                     : prefill_pool->chunk_tokens > 0 ? prefill_pool->chunk_tokens : 512;
  auto graph = spawn_real_graph(sys, topo, gp);
  auto& cluster = graph.cluster;
  auto& service = graph.service;
  err << "troupe serve: loading " << o.model << " on " << prefill_pool->instances.initial
      << " prefill and " << decode_pool->instances.initial << " decode instance(s)"
      << (kv_dir.empty() ? std::string{" (no KV store)"} : ", KV store in " + kv_dir.string())
      << "...\n";
  if (auto why = warm_up(sys, service); !why.empty()) {
    caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
    return fail(why);
  }

  actors::entrypoint_params ep;
  ep.address = listen->first;
  ep.port = listen->second;
  ep.models = {o.served_model_name.empty() ? topo.cluster.model : o.served_model_name};
  ep.api_keys = std::move(keys);
  ep.max_in_flight = o.max_in_flight;
  ep.max_context_tokens = static_cast<std::uint32_t>(
    std::min<std::int64_t>(text.max_position_embeddings, std::numeric_limits<std::uint32_t>::max()));
  ep.grace = o.grace;
  ep.codec = &codec;
  ep.service = service;
  ep.metrics = &metrics;
  ep.constraints = constraints;
  actors::entrypoint server(sys, ep);
  auto port = server.start();
  if (!port) {
    caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
    return fail("cannot listen on " + o.listen + ": " + sys.render(port.error()));
  }
  err << "troupe serve: serving " << ep.models.front() << " on http://" << o.listen.substr(
    0, o.listen.rfind(':')) << ":" << *port << " (SIGTERM or Ctrl-C stops)\n";
  if (o.on_ready)
    o.on_ready(*port);

  int sig = 0;
  sigwait(&signals, &sig);
  err << "troupe serve: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
      << ": no new requests; waiting up to " << o.grace.count()
      << " s for those in flight\n";
  server.stop(o.grace);
  caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
  if (gp.store)
    caf::anon_send_exit(gp.store, caf::exit_reason::user_shutdown);
  err << "troupe serve: stopped\n";
  return 0;
}

} // namespace troupe::cluster
