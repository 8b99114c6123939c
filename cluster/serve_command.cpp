#include "cluster/serve_command.hpp"

#include "actors/entrypoint/entrypoint.hpp"
#include "cluster/autoscaling.hpp"
#include "cluster/serve_setup.hpp"
#include "kernels/cpu_ops.hpp"
#include "runtime/units.hpp"

#include <caf/actor_system.hpp>
#include <caf/send.hpp>

#include <csignal>

#include <limits>
#include <ostream>

namespace troupe::cluster {

int run_serve_command(const serve_options& o, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "troupe serve: " << msg << "\n";
    return 1;
  };
  const std::string command = "troupe serve";
  auto in = load_serve_inputs(o, command, err);
  if (!in)
    return 1;
  auto listen = parse_host_port(o.listen);
  if (!listen)
    return fail("--listen '" + o.listen + "': expected HOST:PORT, e.g. 127.0.0.1:8000");
  auto keys = load_api_keys_option(o, command, err);
  if (!keys)
    return 1;
  const auto* prefill_pool = find_pool(in->topo, pool_role::prefill);
  const auto* decode_pool = find_pool(in->topo, pool_role::decode);

  // SIGTERM / SIGINT are taken by this thread alone (wait_for_stop_signal below): blocked
  // before any other thread starts, so every thread inherits the mask.
  block_stop_signals();
  // Every part reports into one registry, which /metrics serves. It outlives the world: the
  // world's end waits for the actors, and a device still finishing a step counts into it.
  runtime::registry metrics;
  runtime::world w{real_world_options(false)};
  auto& sys = w.system();
  // Structured output: the entrypoint compiles each request's format, the devices mask with it.
  auto constraints = std::make_shared<actors::constraint_table>(in->codec->tokenizer(), o.compile_threads);
  auto gp = make_real_graph_params(sys, o, *in, metrics, constraints, command, err);
  if (!gp)
    return 1;
  const auto origin = sys.clock().now();
  auto graph = spawn_real_graph(sys, in->topo, *gp);
  auto& cluster = graph.cluster;
  auto& service = graph.service;
  err << "troupe serve: loading " << o.model << " on " << prefill_pool->instances.initial
      << " prefill and " << decode_pool->instances.initial << " decode instance(s)"
      << (in->topo.cluster.device == "cpu"
            ? " (CPU devices, OpenBLAS kernel " + std::string(kernels::blas_kernel_name()) + ")"
            : " (" + in->topo.cluster.device + " devices, context "
                + std::to_string(in->max_context) + " tokens)")
      << (in->kv_dir.empty() ? std::string{" (no KV store)"}
                             : ", KV store in " + in->kv_dir.string()
                                 + (in->topo.storage.real_shards() > 1
                                      ? " (" + std::to_string(in->topo.storage.real_shards())
                                          + " shards"
                                          + (in->topo.storage.real_replicas() > 1
                                               ? ", " + std::to_string(
                                                   in->topo.storage.real_replicas())
                                                   + " copies of each block"
                                               : std::string{})
                                          + ")"
                                      : std::string{}))
      << (prefill_or_decode_scales(in->topo)
            ? "; the autoscaler keeps " + std::to_string(prefill_pool->instances.min) + "-"
                + std::to_string(prefill_pool->instances.max) + " prefill and "
                + std::to_string(decode_pool->instances.min) + "-"
                + std::to_string(decode_pool->instances.max) + " decode instances, deciding every "
                + runtime::format_duration(in->topo.autoscaler.interval)
            : std::string{})
      << (o.eplb_ranks > 0 ? "; experts re-placed over " + std::to_string(o.eplb_ranks)
                               + " EP ranks every " + runtime::format_duration(in->eplb_interval)
                           : std::string{})
      << "...\n";
  int stopped_by = 0;
  if (auto why = warm_up(sys, service, std::chrono::minutes(10), cluster, stopped_by);
      !why.empty()) {
    caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
    if (gp->store)
      caf::anon_send_exit(gp->store, caf::exit_reason::user_shutdown);
    if (stopped_by == 0)
      return fail(why);
    err << "troupe serve: " << why << ": stopped\n";
    return 0;
  }

  actors::entrypoint_params ep;
  ep.address = listen->first;
  ep.port = listen->second;
  ep.models = {o.served_model_name.empty() ? in->topo.cluster.model : o.served_model_name};
  ep.api_keys = std::move(*keys);
  ep.max_in_flight = o.max_in_flight;
  ep.max_context_tokens = static_cast<std::uint32_t>(
    std::min<std::uint64_t>(in->max_context, std::numeric_limits<std::uint32_t>::max()));
  ep.grace = o.grace;
  ep.codec = in->codec.get();
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

  int sig = wait_for_stop_signal();
  err << "troupe serve: " << signal_name(sig)
      << ": no new requests; waiting up to " << o.grace.count()
      << " s for those in flight\n";
  server.stop(o.grace);
  const int rc = gp->history ? check_run_history(sys, *in, *gp, graph.decode_lb, origin,
                                                 server.in_flight() == 0, command, err)
                             : 0;
  caf::anon_send_exit(cluster, caf::exit_reason::user_shutdown);
  if (gp->store)
    caf::anon_send_exit(gp->store, caf::exit_reason::user_shutdown);
  err << "troupe serve: stopped\n";
  return rc;
}

} // namespace troupe::cluster
