#include "cluster/launch/node_command.hpp"

#include "actors/entrypoint/entrypoint.hpp"
#include "actors/lb/lb_protocol.hpp"
#include "cluster/launch/control_directory.hpp"
#include "cluster/autoscaling.hpp"
#include "cluster/launch/block_fetcher.hpp"
#include "cluster/launch/store_bridge.hpp"
#include "cluster/launch/teardown_limit.hpp"
#include "cluster/serve_setup.hpp"
#include "cluster/sim/expert_placement.hpp"
#include "cluster/sim/result.hpp"
#include "ports/fabric_link.hpp"
#include "ports/posix_store.hpp"
#include "ports/store_router.hpp"
#include "kernels/cpu_ops.hpp"
#include "kernels/kv_blocks.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string_view>
#include <thread>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

namespace troupe::cluster {

namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

/// How long the stopping control process waits for an instance process to take note.
constexpr std::chrono::milliseconds stopping_notice_limit{2000};

/// How long a node process's actors may take to end once it said "stopped" (teardown_limit.hpp).
constexpr std::chrono::milliseconds teardown_time{10000};

/// Online members of the balancer `lb` (0 when it does not answer).
std::uint32_t online(caf::scoped_actor& self, const caf::actor& lb) {
  std::uint32_t n = 0;
  self->request(lb, 10s, actors::pool_load_atom::value)
    .receive([&](const actors::pool_load& load) { n = load.online; }, [](const caf::error&) {});
  return n;
}

/// Writes `j` to `path` through a temporary file and a rename (readers never see half of it).
bool write_json_file(const std::string& path, const nlohmann::json& j) {
  auto tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump() << "\n";
    if (!out)
      return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

int run_control(const node_options& o, std::ostream& err) {
  const std::string command = "troupe node[control]";
  auto fail = [&](const std::string& msg) {
    err << command << ": " << msg << "\n";
    return 1;
  };
  const auto& so = o.serve;
  auto in = load_serve_inputs(so, command, err, false);
  if (!in)
    return 1;
  auto listen = parse_host_port(so.listen);
  if (!listen)
    return fail("--listen '" + so.listen + "': expected HOST:PORT, e.g. 127.0.0.1:8000");
  auto control = parse_host_port(o.control);
  if (!control)
    return fail("--control '" + o.control + "': expected HOST:PORT, e.g. 127.0.0.1:7000");
  auto keys = load_api_keys_option(so, command, err);
  if (!keys)
    return 1;

  if (o.tls.enabled())
    if (auto e = runtime::check_tls(o.tls))
      return fail("TLS: " + runtime::error_text(e));
  block_stop_signals();
  // The registry outlives the world, whose end waits for the actors that count into it.
  runtime::registry metrics;
  teardown_limit limit{command, teardown_time};  // outlives the world
  runtime::world w{real_world_options(true, o.tls)};
  auto& sys = w.system();
  auto constraints = std::make_shared<actors::constraint_table>(in->codec->tokenizer(), so.compile_threads);
  // The registry of the cluster's block store (store_bridge.hpp). With --external-store a
  // store process registers there and this process reaches its store through a proxy, as the
  // instances do, and mirrors its figures on /metrics; otherwise the store is this process's.
  caf::actor registry;
  runtime::store_port external;
  // One shard per store process; a store of this process is one, however it is sharded.
  const std::uint32_t store_shards = o.external_store ? in->topo.storage.real_shards() : 1;
  const std::uint32_t store_replicas = o.external_store ? in->topo.storage.real_replicas() : 1;
  if (o.external_store) {
    registry = spawn_store_registry(sys, store_shards, &metrics);
    external = spawn_cluster_store(sys, registry, store_shards, store_replicas, {}, &metrics);
  }
  auto gp = make_real_graph_params(sys, so, *in, metrics, constraints, command, err, external);
  if (!gp) {
    for (auto h : {registry, caf::actor_cast<caf::actor>(external)})
      if (h)
        caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
    return 1;
  }
  // The instances' bridges move KV over their fabric links, the prompt's blocks while the
  // rest of it computes.
  gp->stream_kv = o.fabric != "none" && o.kv_stream;
  const auto origin = sys.clock().now();
  auto graph = spawn_control_graph(sys, in->topo, *gp);
  // A store of this process: the instances reach it through its store front, the payloads
  // over this process's fabric link, which binds to the host the instances reach this process
  // by (the --control host) unless told otherwise.
  caf::actor link, front;
  if (gp->store && !o.external_store && o.fabric != "none") {
    ports::fabric_params fp;
    fp.provider = o.fabric;
    fp.host = o.fabric_host.empty() || o.fabric_host == "auto" ? control->first : o.fabric_host;
    auto opened = ports::spawn_fabric_link(sys, fp);
    if (!opened) {
      caf::anon_send_exit(gp->store, caf::exit_reason::user_shutdown);
      return fail("the fabric link (--fabric " + o.fabric + ", --fabric-host " + fp.host
                  + "): " + sys.render(opened.error()));
    }
    link = caf::actor_cast<caf::actor>(*opened);
    front = spawn_store_front(sys, gp->store, *opened);
  }
  if (gp->store && !o.external_store) {
    registry = spawn_store_registry(sys, store_shards);
    caf::anon_send(registry, caf::put_atom::value,
                   store_binding{caf::actor_cast<caf::actor>(gp->store), front, 0});
  }
  // Where the prefill instances' block fetcher processes register (block_fetcher.hpp).
  auto fetchers = spawn_fetcher_registry(sys);
  // With the topology's autoscaler on, it acts on stand-ins for the pools, which the launcher
  // registers with and turns their orders into processes (launched_pools.hpp).
  caf::actor scaler, autoscaler;
  if (in->topo.autoscaler.enabled) {
    const auto& prefill = find_pool(in->topo, pool_role::prefill)->name;
    const auto& decode = find_pool(in->topo, pool_role::decode)->name;
    scaler = spawn_launched_pools(sys, prefill, decode);
    // The stand-in reads the instance's name; the launcher starts its process.
    auto named = [](const std::string& pool) {
      return [pool](actors::instance_id id) {
        return runtime::child_spec{pool + "/" + std::to_string(id),
                                   [](caf::local_actor*) { return caf::actor{}; }};
      };
    };
    auto ap = real_autoscaler_params(in->topo, *gp, graph.prefill_lb, graph.decode_lb,
                                     named(prefill), named(decode));
    ap.root = scaler;
    autoscaler = actors::spawn_autoscaler(sys, std::move(ap));
  }
  auto directory = spawn_control_directory(sys, graph, registry, store_shards, store_replicas,
                                           fetchers, scaler, stopping_notice_limit, &metrics);
  // Every actor of this process ends with it (the actor system waits for them).
  auto stop_graph = [&] {
    for (auto h : {caf::actor_cast<caf::actor>(graph.kv),
                   caf::actor_cast<caf::actor>(graph.prefill_lb),
                   caf::actor_cast<caf::actor>(graph.decode_lb),
                   caf::actor_cast<caf::actor>(graph.service), front, link, registry,
                   fetchers, directory, autoscaler, scaler})
      if (h)
        caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
    if (gp->store)
      caf::anon_send_exit(gp->store, caf::exit_reason::user_shutdown);
  };
  auto published = runtime::publish_actor(sys, directory, control->second, control->first, true);
  if (!published) {
    stop_graph();
    return fail("cannot publish the control directory on " + o.control + ": "
                + runtime::error_text(published.error()));
  }
  err << command << ": control on " << control->first << ":" << *published
      << (o.tls.enabled() ? " (mutual TLS)" : "") << "; waiting for a prefill and a decode instance"
      << (o.external_store ? store_shards > 1 ? " and the " + std::to_string(store_shards)
                                                    + " store processes"
                                              : std::string(" and the store process")
                           : std::string{})
      << " to join\n";

  // Serve once the cluster can: a prefill and a decode instance (and the store process) have
  // joined, and a warm-up request went through them.
  {
    caf::scoped_actor self{sys};
    auto last_note = clock::now();
    bool store_up = !o.external_store;
    std::uint32_t shards_up = 0;
    for (;;) {
      if (int sig = poll_stop_signal(200ms); sig != 0) {
        err << command << ": " << signal_name(sig) << " before serving; stopped\n";
        stop_graph();
        return 0;
      }
      if (!store_up) {
        shards_up = 0;
        for (std::uint32_t i = 0; i < store_shards; ++i)
          self->request(registry, 10s, caf::get_atom::value, i)
            .receive([&](const store_binding& b) { shards_up += b.store ? 1 : 0; },
                     [](const caf::error&) {});
        store_up = shards_up == store_shards;
        // The CHECK role learns the blocks the store holds (the store's directory outlives
        // the cluster), as a store of this process's would have told it at start.
        if (store_up)
          index_stored_blocks(sys, gp->store, graph.kv, 60s);
      }
      auto p = online(self, caf::actor_cast<caf::actor>(graph.prefill_lb));
      auto d = online(self, caf::actor_cast<caf::actor>(graph.decode_lb));
      if (p > 0 && d > 0 && store_up)
        break;
      if (clock::now() - last_note > 30s) {
        err << command << ": still waiting: " << p << " prefill and " << d
            << " decode instance(s) online";
        if (!store_up)
          err << ", " << shards_up << " of " << store_shards << " store process(es)";
        err << "\n";
        last_note = clock::now();
      }
    }
  }
  int stopped_by = 0;
  if (auto why = warm_up(sys, graph.service, 10min, {}, stopped_by); !why.empty()) {
    stop_graph();
    if (stopped_by == 0)
      return fail(why);
    err << command << ": " << why << ": stopped\n";
    return 0;
  }

  actors::entrypoint_params ep;
  ep.address = listen->first;
  ep.port = listen->second;
  ep.models = {so.served_model_name.empty() ? in->topo.cluster.model : so.served_model_name};
  ep.api_keys = std::move(*keys);
  ep.max_in_flight = so.max_in_flight;
  ep.max_context_tokens = static_cast<std::uint32_t>(
    std::min<std::uint64_t>(in->max_context, std::numeric_limits<std::uint32_t>::max()));
  ep.grace = so.grace;
  ep.codec = in->codec.get();
  ep.service = graph.service;
  ep.metrics = &metrics;
  ep.constraints = constraints;
  actors::entrypoint server(sys, ep);
  auto port = server.start();
  if (!port) {
    stop_graph();
    return fail("cannot listen on " + so.listen + ": " + sys.render(port.error()));
  }
  err << command << ": serving " << ep.models.front() << " on http://" << listen->first << ":"
      << *port << "\n";
  if (!o.ready_file.empty()
      && !write_json_file(o.ready_file, {{"http", *port}, {"control", *published}}))
    err << command << ": warning: cannot write " << o.ready_file << "\n";

  int sig = wait_for_stop_signal();
  err << command << ": " << signal_name(sig) << ": no new requests; waiting up to "
      << so.grace.count() << " s for those in flight\n";
  server.stop(so.grace);
  // The requests release their decode bookings here, in this process: the check needs nothing
  // from the instances (a KV write still on its way is simply not a fact yet).
  const int rc = gp->history ? check_run_history(sys, *in, *gp, graph.decode_lb, origin,
                                                 server.in_flight() == 0, command, err)
                             : 0;
  {
    // Every instance process learns that the cluster stops (not that the control is lost).
    caf::scoped_actor self{sys};
    self->request(directory, stopping_notice_limit + 1s, stopping_atom::value)
      .receive([](caf::ok_atom) {}, [](const caf::error&) {});
  }
  stop_graph();
  err << command << ": stopped\n";
  limit.arm(rc);
  return rc;
}

/// The address of this machine's interface that the route to `control` ("HOST:PORT") leaves
/// by: where peers that reach the control process can reach this one. A UDP socket
/// "connected" there sends nothing; the kernel only picks its source address.
sim::result<std::string> address_towards(const std::string& control) {
  using failure = sim::result<std::string>;
  auto colon = control.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return failure::failure("'" + control + "' is not HOST:PORT");
  std::string host = control.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), control.substr(colon + 1).c_str(), &hints, &found))
    return failure::failure("cannot resolve '" + host + "': " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list{found, freeaddrinfo};
  std::string why = "no address of '" + host + "' is reachable";
  for (auto* a = found; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0)
      continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0
              && ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    ::close(fd);
    if (!ok)
      continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* in = local.ss_family == AF_INET6
                       ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                       : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (inet_ntop(local.ss_family, in, text, sizeof text))
      return std::string(text);
  }
  return failure::failure(why);
}

/// How long a drained decode process waits for its forwarded KV to be pulled.
constexpr std::chrono::seconds handover_limit{30};

/// Waits until the bridge holds no job and makes no offer, and its fabric link holds no offer
/// and sends no answer: the bridge's offers are withdrawn once pulled (the store proxy's, of
/// blocks being written, once written), so the KV handed on has all been pulled; false after
/// `limit` or on a second stop signal. (Not a count of pulls served: the link also serves
/// the store's pulls of this process's blocks.)
bool wait_for_handover(caf::scoped_actor& self, const kv_bridge_params& bridge,
                       std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto& c = *bridge.counters;
    if (c.jobs == 0 && c.offering == 0) {
      bool done = false;
      self->request(bridge.link, 5s, caf::get_atom::value)
        .receive(
          [&](const runtime::fabric_activity& a) {
            done = a.offers == 0 && a.sending == 0;
          },
          [](const caf::error&) {});
      if (done)
        return true;
    }
    if (poll_stop_signal(50ms) != 0)
      return false;
  }
  return false;
}

/// The fabric link of a store or instance process (--fabric, not none): bound to
/// --fabric-host, by default 127.0.0.1, or with `auto` the address this machine reaches the
/// control process from.
sim::result<runtime::fabric_link_port> open_fabric_link(caf::actor_system& sys,
                                                        const node_options& o) {
  using failure = sim::result<runtime::fabric_link_port>;
  ports::fabric_params fp;
  fp.provider = o.fabric;
  fp.host = o.fabric_host.empty() ? "127.0.0.1" : o.fabric_host;
  if (fp.host == "auto") {
    auto local = address_towards(o.control);
    if (!local)
      return failure::failure("--fabric-host auto: " + local.error());
    fp.host = *local;
  }
  auto link = ports::spawn_fabric_link(sys, fp);
  if (!link)
    return failure::failure("the fabric link (--fabric " + o.fabric + ", --fabric-host " + fp.host
                            + "): " + sys.render(link.error()));
  return *link;
}

/// What keeps a store or instance process from joining its control process (a malformed
/// --control, TLS files that do not load), or empty.
std::string joining_problem(const node_options& o) {
  auto control = parse_host_port(o.control);
  if (!control || control->second == 0)
    return "--control '" + o.control + "': expected HOST:PORT of the control process";
  if (o.tls.enabled())
    if (auto e = runtime::check_tls(o.tls))
      return "TLS: " + runtime::error_text(e);
  return {};
}

/// A process of a launched cluster, joined to its control process.
struct joined_control {
  caf::actor directory;
  control_directory dir;
  /// Answers the control process's stopping notice; monitors the directory.
  caf::actor watcher;
  /// The control process went away / said the cluster stops.
  std::shared_ptr<std::atomic<bool>> lost;
  std::shared_ptr<std::atomic<bool>> stopping;
};

/// Connects to the control process at o.control (retried until it answers, up to
/// o.connect_timeout: it may start after this process), asks for its directory and joins it
/// with a watcher, which answers the control process's requests for `metrics` (none: an
/// empty list). Nothing when that fails or a stop signal came first, after a message on
/// `err`, with the exit status in `status` (1, or 0 after a signal).
std::optional<joined_control> join_control(caf::actor_system& sys, const node_options& o,
                                           const std::string& command, std::ostream& err,
                                           int& status, runtime::registry* metrics = nullptr) {
  auto control = parse_host_port(o.control);
  joined_control j;
  auto deadline = clock::now() + o.connect_timeout;
  std::string last_error;
  while (!j.directory) {
    auto h = runtime::connect_actor(sys, control->first, control->second);
    if (h) {
      j.directory = *h;
      break;
    }
    last_error = runtime::error_text(h.error());
    if (clock::now() >= deadline) {
      err << command << ": cannot reach the control process at " << o.control << " within "
          << o.connect_timeout.count() << " s: " << last_error << "\n";
      status = 1;
      return std::nullopt;
    }
    if (int sig = poll_stop_signal(500ms); sig != 0) {
      err << command << ": " << signal_name(sig) << " before joining; stopped\n";
      status = 0;
      return std::nullopt;
    }
  }
  {
    caf::scoped_actor self{sys};
    bool ok = false;
    self->request(j.directory, 60s, directory_atom::value)
      .receive([&](control_directory& d) { j.dir = std::move(d), ok = true; },
               [&](const caf::error& e) { last_error = sys.render(e); });
    if (!ok) {
      err << command << ": the control process at " << o.control
          << " did not answer: " << last_error << "\n";
      status = 1;
      return std::nullopt;
    }
  }
  // The control process going away ends this one: cleanly (status 0) when the control
  // process said beforehand that the cluster stops, with status 3 otherwise (the launcher
  // restarts it).
  j.lost = std::make_shared<std::atomic<bool>>(false);
  j.stopping = std::make_shared<std::atomic<bool>>(false);
  j.watcher = sys.spawn([directory = j.directory, lost = j.lost, stopping = j.stopping,
                         metrics](caf::event_based_actor* self) {
    self->monitor(directory);
    self->set_down_handler([lost](caf::down_msg&) { lost->store(true); });
    return caf::behavior{
      [stopping](stopping_atom) {
        stopping->store(true);
        return caf::ok_atom::value;
      },
      [metrics](metrics_atom) {
        return metrics != nullptr ? metrics->samples() : std::vector<runtime::metric_samples>{};
      }};
  });
  caf::anon_send(j.directory, caf::join_atom::value, j.watcher);
  return j;
}

/// The main loop of a store or fetcher process, on the main thread: until the control process
/// stops the cluster (status 0), is lost (3), or a stop signal comes (0). `last_words` runs
/// before an orderly end.
int until_the_end(const joined_control& j, const node_options& o, const std::string& command,
                  std::ostream& err, const std::function<void()>& last_words) {
  for (;;) {
    if (j.stopping->load()) {
      last_words();
      err << command << ": the control process is stopping the cluster\n";
      err << command << ": stopped\n";
      return 0;
    }
    if (j.lost->load()) {
      err << command << ": lost the control process at " << o.control << "; exiting\n";
      return 3;
    }
    if (int sig = poll_stop_signal(500ms); sig != 0 && !j.stopping->load()) {
      last_words();
      err << command << ": " << signal_name(sig) << "\n";
      err << command << ": stopped\n";
      return 0;
    }
  }
}

/// An actor that ends with its process, named for teardown_limit's message.
using named_actor = std::pair<caf::actor, std::string>;

/// Runs a store or fetcher process: checks the options it joins with, joins the control
/// process and calls `body` with the actor system, the joined control process and the actors
/// that end with the process (the watcher first; `body` adds its own). Returns `body`'s exit
/// status (1 when joining failed, 0 after a signal before joining); the teardown after it is
/// bounded by teardown_time.
int run_joined(const node_options& o, const std::string& command, std::ostream& err,
               const std::function<int(caf::actor_system&, const joined_control&,
                                       std::vector<named_actor>&)>& body) {
  if (auto why = joining_problem(o); !why.empty()) {
    err << command << ": " << why << "\n";
    return 1;
  }
  block_stop_signals();
  teardown_limit limit{command, teardown_time};  // outlives the world
  runtime::world w{real_world_options(true, o.tls)};
  auto& sys = w.system();
  int status = 0;
  auto joined = join_control(sys, o, command, err, status);
  if (!joined)
    return status;
  std::vector<named_actor> actors{{joined->watcher, "the control watcher"}};
  status = body(sys, *joined, actors);
  for (const auto& [a, name] : actors) {
    limit.watch(a, name);
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  limit.arm(status);
  return status;
}

int run_instance(const node_options& o, pool_role role, std::ostream& err) {
  const std::string command = "troupe node[" + o.role + "/" + std::to_string(o.index) + "]";
  auto fail = [&](const std::string& msg) {
    err << command << ": " << msg << "\n";
    return 1;
  };
  const auto& so = o.serve;
  auto in = load_serve_inputs(so, command, err);
  if (!in)
    return 1;
  const auto* pool = find_pool(in->topo, role);
  // The autoscaler numbers the instances it orders on from the initial ones.
  if (o.index >= pool->instances.initial && !autoscaled(in->topo, *pool))
    return fail("--index " + std::to_string(o.index) + ": pool '" + pool->name + "' has "
                + std::to_string(pool->instances.initial) + " instance(s) (0.."
                + std::to_string(pool->instances.initial - 1) + ")");
  if (auto why = joining_problem(o); !why.empty())
    return fail(why);
  // The EP group this process's instance forms: on the first of its healthy GPUs that make a
  // valid size (the simulator's resize rule).
  const auto configured = pool->gpus_per_instance;
  const auto experts = static_cast<std::uint32_t>(in->model.text.n_routed_experts);
  std::uint32_t ep = configured;
  if (!o.gpus.empty()) {
    for (std::size_t i = 0; i < o.gpus.size(); ++i)
      if (o.gpus[i] >= configured || (i > 0 && o.gpus[i] <= o.gpus[i - 1]))
        return fail("--gpus: expected ascending GPUs of the instance's " + std::to_string(configured)
                    + " (0.." + std::to_string(configured - 1) + "), each once");
    ep = sim::resized_ep(configured, static_cast<std::uint32_t>(o.gpus.size()), experts);
    if (ep == 0)
      return fail("--gpus: " + std::to_string(o.gpus.size()) + " healthy GPU(s) of "
                  + std::to_string(configured) + " cannot form an EP group (it needs "
                  + std::to_string((configured + 1) / 2) + ")");
  }
  block_stop_signals();
  // The registry outlives the world, whose end waits for the actors that count into it.
  runtime::registry metrics;
  teardown_limit limit{command, teardown_time};  // outlives the world
  runtime::world w{real_world_options(true, o.tls)};
  auto& sys = w.system();

  int status = 0;
  auto joined = join_control(sys, o, command, err, status, &metrics);
  if (!joined)
    return status;
  const auto& dir = joined->dir;
  const auto& control_lost = joined->lost;
  const auto& cluster_stopping = joined->stopping;
  const auto& watcher = joined->watcher;

  // Structured-output constraints: the bridge rebuilds each job's here (kv_bridge.hpp).
  auto constraints = std::make_shared<actors::constraint_table>(in->codec->tokenizer(), so.compile_threads);
  // The fabric link the KV crosses processes by (kv_bridge.hpp), and the block store's
  // payloads (store_bridge.hpp).
  kv_bridge_params bridge;
  bridge.counters = std::make_shared<kv_bridge_counters>();
  bridge.constraints = constraints;
  bridge.stream = o.kv_stream;
  if (o.role == "decode")
    bridge.runs_pulled_early = runtime::counter_child(
      &metrics, "troupe_kv_runs_pulled_early_total",
      "Runs of a prompt's full blocks this decode process pulled while the prompt's prefill "
      "still computed (troupe launch --kv-stream on).",
      {"instance"}, {o.role + "/" + std::to_string(o.index)});
  // From the bridge's thread while the main thread may write too: one write per line.
  bridge.warn = [command](const std::string& what) {
    const auto line = command + ": " + what + "\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, line.data(), line.size());
  };
  if (o.fabric != "none") {
    auto link = open_fabric_link(sys, o);
    if (!link)
      return fail(link.error());
    bridge.link = *link;
  }
  // The cluster's block store, through a proxy here.
  runtime::store_port store;
  if (dir.store_registry)
    store = spawn_cluster_store(sys, dir.store_registry, dir.store_shards, dir.store_replicas,
                                bridge.link, &metrics);
  else
    in->kv_dir.clear();  // the control process has none: neither has the cluster
  // A prefill instance reads cached blocks through its block fetcher process, when one runs
  // (block_fetcher.hpp); until then, and without one, from the store as before.
  auto fetched = std::make_shared<fetch_counters>();
  const auto name = std::string(to_string(role)) + "/" + std::to_string(o.index);
  if (store && dir.fetchers && role == pool_role::prefill)
    store = spawn_fetching_store(
      sys, store, dir.fetchers, name,
      static_cast<std::uint64_t>(kernels::block_kv_bytes(in->model.text)), 64, fetched);
  auto gp = make_real_graph_params(sys, so, *in, metrics, constraints, command, err, store);
  if (!gp) {
    for (auto h : {caf::actor_cast<caf::actor>(store), caf::actor_cast<caf::actor>(bridge.link)})
      if (h)
        caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
    return 1;
  }
  gp->healthy_gpus = o.gpus;
  gp->experts = experts;
  // An instance that lost rank processes re-forms on the ranks left: the launcher hears it.
  if (gp->losses)
    gp->losses->on_formed([directory = joined->directory, name, pid = ::getpid()](
                            pool_role, std::uint32_t, std::uint32_t ranks) {
      caf::anon_send(directory, reformed_atom::value, name, static_cast<std::int32_t>(pid), ranks);
    });
  auto relay = spawn_balancer_relay(
    sys, role == pool_role::prefill ? dir.prefill_lb : dir.decode_lb, dir.prefill_lb, bridge);
  // The autoscaler's stand-in for this instance finds its engine through the relay.
  if (dir.scaler)
    caf::anon_send(dir.scaler, caf::put_atom::value, name, relay);
  auto pool_sup = runtime::spawn_supervisor(
    sys, pool_supervisor_config(in->topo, role, *gp,
                                caf::actor_cast<actors::kv_check_actor>(dir.kv), relay,
                                {o.index}, relay));
  err << command << ": joined the control process at " << o.control
      << (o.tls.enabled() ? " over mutual TLS" : "") << " (loading " << so.model << ")\n";

  auto stop = [&](int status) {
    const auto& c = *bridge.counters;
    if (bridge.link) {
      err << command << ": KV over the fabric: " << c.offered << " offered ("
          << c.offered_bytes / 1024 << " KiB), " << c.pulled << " pulled (" << c.pulled_bytes / 1024
          << " KiB; " << c.pulled_early << " run(s) of blocks while their prefill computed), "
          << c.pull_failures << " failed pull(s)\n";
      limit.watch(caf::actor_cast<caf::actor>(bridge.link), "the fabric link");
      caf::anon_send_exit(bridge.link, caf::exit_reason::user_shutdown);
    }
    if (fetched->fetched > 0 || fetched->direct > 0)
      err << command << ": cached blocks read: " << fetched->fetched << " through fetcher/"
          << o.index << " in shared memory (" << fetched->bytes / 1024 << " KiB), "
          << fetched->direct << " from the store directly\n";
    limit.watch(pool_sup, "the pool supervisor");
    limit.watch(relay, "the balancer relay");
    limit.watch(watcher, "the control watcher");
    limit.watch(caf::actor_cast<caf::actor>(gp->store), "the cluster store proxy");
    caf::anon_send_exit(pool_sup, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(relay, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
    if (gp->store)
      caf::anon_send_exit(gp->store, caf::exit_reason::user_shutdown);
    limit.arm(status);
    return status;
  };
  bool announced = false;
  for (;;) {
    if (!announced) {
      // The engine announces itself to its balancer once its model is loaded: say so.
      caf::scoped_actor self{sys};
      self->request(relay, 1s, caf::get_atom::value)
        .receive([&](const caf::actor& e) { announced = static_cast<bool>(e); },
                 [](const caf::error&) {});
      if (announced) {
        err << command << ": model loaded; serving in the " << o.role << " pool";
        if (configured > 1 || ep != configured) {
          err << " as an EP group of " << ep << " rank(s) on GPU(s) ";
          for (std::uint32_t r = 0; r < ep; ++r)
            err << (r ? "," : "") << (o.gpus.empty() ? r : o.gpus[r]);
          if (ep != configured)
            err << " (EP " << configured << " -> " << ep << ")";
          if (const auto k = pool->ranks_per_process; k > 0 && k < ep)
            err << ", ranks " << k << "-" << ep - 1 << " in " << (ep - 1) / k
                << " process(es) of their own";
        }
        err << " (OpenBLAS kernel " << kernels::blas_kernel_name() << ")\n";
      }
    }
    if (cluster_stopping->load()) {
      err << command << ": the control process is stopping the cluster\n";
      err << command << ": stopped\n";
      return stop(0);
    }
    if (control_lost->load()) {
      err << command << ": lost the control process at " << o.control << "; exiting\n";
      return stop(3);
    }
    int sig = poll_stop_signal(500ms);
    if (sig == 0 || cluster_stopping->load())
      continue;  // after the notice, a signal (e.g. the launcher stopping the rest) changes nothing
    // Drain: the balancer excludes this instance; a decode engine serves for the grace
    // period, then forwards what it still holds; a prefill engine finishes its jobs.
    // SIGUSR1 is the launcher removing this instance for the autoscaler: the pool's grace, as
    // the autoscaler's drain has under troupe serve; otherwise --grace.
    const auto grace = sig == SIGUSR1 ? pool->grace
                                      : std::chrono::duration_cast<runtime::duration>(so.grace);
    err << command << ": " << signal_name(sig) << ": draining (grace "
        << runtime::to_seconds(grace) << " s)\n";
    caf::scoped_actor self{sys};
    caf::actor engine;
    self->request(relay, 10s, caf::get_atom::value)
      .receive([&](const caf::actor& e) { engine = e; }, [](const caf::error&) {});
    if (engine) {
      self->request(engine, grace + 120s, actors::drain_atom::value, grace)
        .receive(
          [&](std::uint64_t forwarded) {
            err << command << ": drained; " << forwarded << " request(s) forwarded\n";
            // The forwarded requests' KV is offered on this process's fabric link: stay
            // until the next instances have pulled it (they would recompute without it).
            if (forwarded > 0 && bridge.link && !wait_for_handover(self, bridge, handover_limit))
              err << command << ": leaving before the forwarded KV was all pulled (after "
                  << handover_limit.count() << " s, or a second signal)\n";
            // The autoscaler's drain of this instance is answered with it.
            if (dir.scaler)
              self->request(dir.scaler, 5s, left_atom::value, name, forwarded)
                .receive([](caf::ok_atom) {}, [](const caf::error&) {});
          },
          [&](const caf::error& e) {
            err << command << ": drain failed: " << sys.render(e) << "\n";
          });
    }
    err << command << ": stopped\n";
    return stop(0);
  }
}

/// The cluster's block store in a process of its own: it opens the store directory, offers
/// payloads on its fabric link through a store front, and registers both with the control
/// process's store registry (again after each restart: the launcher restarts it like an
/// instance). It reads the topology (the store's capacity and directory), not the model.
int run_store(const node_options& o, std::ostream& err) {
  const std::string command = "troupe node[store]";
  auto fail = [&](const std::string& msg) {
    err << command << ": " << msg << "\n";
    return 1;
  };
  auto topo = load_topology(o.serve.topology);
  if (!topo.value) {
    for (const auto& d : topo.errors)
      err << d.to_string() << "\n";
    return 1;
  }
  auto kv_dir = store_directory(o.serve, *topo.value, command, err);
  if (!kv_dir)
    return 1;
  if (kv_dir->empty())
    return fail("no store directory: give --kv-dir DIR (or a topology with a posix store)");
  if (o.index >= topo.value->storage.real_shards())
    return fail("--index " + std::to_string(o.index) + ": the topology's store has "
                + std::to_string(topo.value->storage.real_shards())
                + " shard(s) (storage.shards), numbered from 0");
  return run_joined(o, command, err, [&](caf::actor_system& sys, const joined_control& joined,
                                         std::vector<named_actor>& actors) {
    if (!joined.dir.store_registry)
      return fail("the control process at " + o.control
                       + " takes no store process (it was started without --external-store)");
    // Shard --index of the topology's store: its own directory and share of the capacity.
    const auto shards = topo.value->storage.real_shards();
    const auto shard_dir = ports::store_shard_directory(*kv_dir, o.index, shards);
    ports::posix_store_params sp;
    sp.directory = shard_dir;
    sp.capacity = topo.value->storage.capacity_bytes / shards;
    auto store = ports::spawn_posix_store(sys, std::move(sp));
    actors.emplace_back(caf::actor_cast<caf::actor>(store), "the block store");
    runtime::store_stats held;
    {
      caf::scoped_actor self{sys};
      std::string why;
      self->request(store, 120s, runtime::store_stats_atom::value)
        .receive([&](const runtime::store_stats& s) { held = s; },
                 [&](const caf::error& e) { why = sys.render(e); });
      if (!why.empty())
        return fail("cannot open the store directory " + shard_dir.string() + ": " + why);
    }
    caf::actor front;
    if (o.fabric != "none") {
      auto link = open_fabric_link(sys, o);
      if (!link)
        return fail(link.error());
      actors.emplace_back(caf::actor_cast<caf::actor>(*link), "the fabric link");
      front = spawn_store_front(sys, store, *link);
      actors.emplace_back(front, "the store front");
    }
    {
      caf::scoped_actor self{sys};
      std::string why;
      self->request(joined.dir.store_registry, 30s, caf::put_atom::value,
                    store_binding{caf::actor_cast<caf::actor>(store), front, o.index})
        .receive([](caf::ok_atom) {}, [&](const caf::error& e) { why = runtime::error_text(e); });
      if (!why.empty())
        return fail("the control process at " + o.control + " refused this store: " + why);
    }
    err << command << ": serving " << (shards > 1 ? "shard " + std::to_string(o.index) + " of "
                                                      + std::to_string(shards) + " of " : "")
        << "the block store in " << shard_dir.string() << " (" << held.objects
        << " block(s)) to the cluster at " << o.control
        << (front ? "; payloads over the fabric" : "; payloads in CAF messages") << "\n";
    // Writes still on their way when it stops are answered as not done (unavailable) by the
    // proxies.
    return until_the_end(joined, o, command, err, [] {});
  });
}

/// The block fetcher of prefill instance --index: it reads the blocks that instance's engine
/// asks for from the cluster's store into shared memory (block_fetcher.hpp), and registers
/// with the control process's fetcher registry. It reads the topology only.
int run_fetcher(const node_options& o, std::ostream& err) {
  const std::string command = "troupe node[fetcher/" + std::to_string(o.index) + "]";
  auto fail = [&](const std::string& msg) {
    err << command << ": " << msg << "\n";
    return 1;
  };
  auto topo = load_topology(o.serve.topology);
  if (!topo.value) {
    for (const auto& d : topo.errors)
      err << d.to_string() << "\n";
    return 1;
  }
  const auto* pool = find_pool(*topo.value, pool_role::prefill);
  if (pool == nullptr || (o.index >= pool->instances.initial && !autoscaled(*topo.value, *pool)))
    return fail("--index " + std::to_string(o.index) + ": the topology has no prefill instance "
                + std::to_string(o.index));
  return run_joined(o, command, err, [&](caf::actor_system& sys, const joined_control& joined,
                                         std::vector<named_actor>& actors) {
    if (!joined.dir.store_registry || !joined.dir.fetchers)
      return fail("the control process at " + o.control + " has no block store to fetch from");
    runtime::fabric_link_port link;
    if (o.fabric != "none") {
      auto opened = open_fabric_link(sys, o);
      if (!opened)
        return fail(opened.error());
      link = *opened;
      actors.emplace_back(caf::actor_cast<caf::actor>(link), "the fabric link");
    }
    auto store = spawn_cluster_store(sys, joined.dir.store_registry, joined.dir.store_shards,
                                     joined.dir.store_replicas, link);
    actors.emplace_back(caf::actor_cast<caf::actor>(store), "the cluster store proxy");
    auto counters = std::make_shared<fetch_counters>();
    auto fetcher = spawn_block_fetcher(sys, store, counters);
    actors.emplace_back(fetcher, "the block fetcher");
    caf::anon_send(joined.dir.fetchers, caf::put_atom::value, "prefill/" + std::to_string(o.index),
                   fetcher);
    err << command << ": fetching blocks for prefill/" << o.index << " from the cluster at "
        << o.control << "\n";
    return until_the_end(joined, o, command, err, [&] {
      err << command << ": " << counters->fetched << " block(s) fetched into shared memory ("
          << counters->bytes / 1024 << " KiB)\n";
    });
  });
}

} // namespace

void reexec_with_huge_page_heap(const node_options& o, char** argv, std::ostream& err) {
  if (o.fabric == "none")
    return;
  constexpr std::string_view tunable = "glibc.malloc.hugetlb";
  const char* before = std::getenv("GLIBC_TUNABLES");
  std::string tunables = before ? before : "";
  if (tunables.find(tunable) != std::string::npos)
    return;
  tunables += (tunables.empty() ? "" : ":") + std::string{tunable} + "=1";
  setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
  execv("/proc/self/exe", argv);
  err << "troupe node: cannot re-execute with huge pages for the heap (" << std::strerror(errno)
      << "); running on 4 KiB pages\n";
  if (before)
    setenv("GLIBC_TUNABLES", before, 1);
  else
    unsetenv("GLIBC_TUNABLES");
}

int run_node_command(const node_options& o, std::ostream& err) {
  if (o.role == "control")
    return run_control(o, err);
  if (o.role == "prefill")
    return run_instance(o, pool_role::prefill, err);
  if (o.role == "decode")
    return run_instance(o, pool_role::decode, err);
  if (o.role == "store")
    return run_store(o, err);
  if (o.role == "fetcher")
    return run_fetcher(o, err);
  err << "troupe node: --role '" << o.role
      << "': expected control, store, fetcher, prefill or decode\n";
  return 1;
}

} // namespace troupe::cluster
