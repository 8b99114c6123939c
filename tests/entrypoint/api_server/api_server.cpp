// troupe_test_api_server: the HTTP entrypoint on 127.0.0.1 over a scripted generation service,
// for the official OpenAI and Anthropic SDKs (tests/python/test_sdk_scripted.py). Tests only.
//
//   troupe_test_api_server --script text|reasoning|tool [--graph] [--port 0] [--api-key K]...
//                          [--thinking] [--delay-ms 1] [--max-in-flight 64]
//                          [--model DeepSeek-V4-Flash] [--tokenizer FILE] [--exit-on-stdin-close]
//
// Without --graph the service is the fake one (fake_service.hpp): one actor per request streams
// the script, a token every --delay-ms. With --graph the script goes through the real serving
// graph (cluster::spawn_real_graph: the generation service, a request actor per request, the
// KV CHECK role, the prefill and decode balancers, one prefill and one decode instance) whose
// devices are script devices (ports/script_device.hpp), each step taking --delay-ms: the prefill
// device samples the script's first token, its KV export records how many tokens the sequence
// sampled, and the decode device that imports it continues the script from there.
//
// Prints "port N tokens M" on stdout once it listens (M: the script's length, which the usage of a
// whole reply must report), serves until SIGTERM / SIGINT (or, with
// --exit-on-stdin-close, until stdin closes: a parent that dies takes it along), then stops
// with a 2 s grace and exits 0.
#include "actors/entrypoint/entrypoint.hpp"
#include "actors/type_ids.hpp"
#include "cluster/real_graph.hpp"
#include "fake_service.hpp"
#include "ports/script_device.hpp"
#include "runtime/world.hpp"

#include <caf/send.hpp>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <poll.h>
#include <string>
#include <thread>
#include <unistd.h>

using namespace troupe;

namespace {

std::atomic<bool> stop_requested{false};

/// --graph: one prefill and one decode instance, one device each.
const char* graph_topology = R"(
[cluster]
name = "api-server-graph"
model = "deepseek-v4.1-flash"
hardware = "cpu"

[storage]
backend = "posix"
path = "troupe-kv"
capacity = "1GiB"

[[pool]]
name = "prefill"
role = "prefill"
instances = 1
gpus_per_instance = 1

[[pool]]
name = "decode"
role = "decode"
instances = 1
gpus_per_instance = 1
)";

void on_signal(int) {
  stop_requested = true;
}

int usage(const std::string& why) {
  std::cerr << "troupe_test_api_server: " << why << "\n"
            << "usage: troupe_test_api_server --script text|reasoning|tool [--graph] [--port N] "
               "[--api-key K]... [--thinking] [--delay-ms N] [--max-in-flight N] "
               "[--model NAME] [--tokenizer FILE] [--exit-on-stdin-close]\n";
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  std::string script = "text";
  std::string model = "DeepSeek-V4-Flash";
  std::string tokenizer = std::string(TROUPE_SOURCE_DIR)
                          + "/recipe/data/deepseek-v4/tokenizer.json.gz";
  std::set<std::string> keys;
  unsigned port = 0, delay_ms = 1, max_in_flight = 64;
  bool thinking = false;
  bool graph = false;
  bool watch_stdin = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc)
        return std::nullopt;
      return std::string(argv[++i]);
    };
    auto number = [&](unsigned& out) {
      auto v = value();
      if (!v)
        return false;
      char* end = nullptr;
      const unsigned long n = std::strtoul(v->c_str(), &end, 10);
      if (*end != '\0' || n > 65535)
        return false;
      out = static_cast<unsigned>(n);
      return true;
    };
    if (a == "--script") {
      auto v = value();
      if (!v)
        return usage("--script needs a value");
      script = *v;
    } else if (a == "--model") {
      auto v = value();
      if (!v)
        return usage("--model needs a value");
      model = *v;
    } else if (a == "--tokenizer") {
      auto v = value();
      if (!v)
        return usage("--tokenizer needs a value");
      tokenizer = *v;
    } else if (a == "--api-key") {
      auto v = value();
      if (!v)
        return usage("--api-key needs a value");
      keys.insert(*v);
    } else if (a == "--exit-on-stdin-close") {
      watch_stdin = true;
    } else if (a == "--thinking") {
      thinking = true;
    } else if (a == "--graph") {
      graph = true;
    } else if (a == "--port") {
      if (!number(port))
        return usage("--port needs a number");
    } else if (a == "--delay-ms") {
      if (!number(delay_ms))
        return usage("--delay-ms needs a number");
    } else if (a == "--max-in-flight") {
      if (!number(max_in_flight) || max_in_flight == 0)
        return usage("--max-in-flight needs a positive number");
    } else {
      return usage("unknown argument " + a);
    }
  }
  if (script != "text" && script != "reasoning" && script != "tool")
    return usage("unknown script " + script);

  recipe::codec_options options;
  options.chat.default_thinking = thinking;
  auto loaded = recipe::codec::load(tokenizer, options);
  if (auto* e = std::get_if<recipe::load_error>(&loaded)) {
    std::cerr << "troupe_test_api_server: " << e->message << "\n";
    return 1;
  }
  const auto& codec = std::get<recipe::codec>(loaded);

  test::fake_script s;
  s.delay = std::chrono::milliseconds(delay_ms);
  if (script == "text")
    s.tokens = test::text_tokens(codec, "Hello from troupe! This is a scripted reply.");
  else if (script == "reasoning")
    s.tokens = test::reasoning_tokens(codec, "The user greets me. I should greet them back.",
                                      "Hello! How can I help you today?");
  else
    s.tokens = test::tool_call_tokens(codec, "",
                                      "San Francisco, California, United States of America");

  constexpr std::uint32_t max_context = 65536;
  // The registry outlives the world, whose end waits for the actors that count into it.
  runtime::registry registry;
  runtime::world world(runtime::world_options{runtime::world_mode::real, 1, 2, false,
                                              actors::register_actor_types});
  actors::generation_service service;
  caf::actor graph_root;
  if (graph) {
    auto topo = cluster::parse_topology(graph_topology, "api-server-graph.toml");
    if (!topo.value) {
      std::cerr << "troupe_test_api_server: the graph's topology does not parse\n";
      return 1;
    }
    cluster::real_graph_params gp;
    gp.device = [s](caf::actor_system& sys, cluster::pool_role, std::uint32_t, std::uint32_t) {
      ports::script_device_params d;
      d.script = s.tokens;
      d.step_delay = s.delay;
      return ports::spawn_script_device(sys, std::move(d));
    };
    gp.block_bytes = 128 * 1024;  // the CHECK role's accounting only
    gp.max_context = max_context;
    auto g = cluster::spawn_real_graph(world.system(), *topo.value, gp);
    service = g.service;
    graph_root = g.cluster;
  } else {
    service = test::spawn_fake_service(
      world.system(), [s](const actors::generation_request&) { return s; },
      std::make_shared<test::fake_log>());
  }
  actors::entrypoint_params p;
  p.address = "127.0.0.1";
  p.port = static_cast<std::uint16_t>(port);
  p.models = {model};
  p.api_keys = keys;
  p.max_in_flight = max_in_flight;
  p.max_context_tokens = max_context;
  p.codec = &codec;
  p.service = service;
  p.metrics = &registry;
  actors::entrypoint server(world.system(), p);
  auto bound = server.start();
  if (!bound) {
    std::cerr << "troupe_test_api_server: " << world.system().render(bound.error()) << "\n";
    return 1;
  }
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::cout << "port " << *bound << " tokens " << s.tokens.size() << std::endl;

  // Serve until a signal, or until stdin closes (the parent went away).
  while (!stop_requested) {
    if (watch_stdin) {
      pollfd fd{STDIN_FILENO, POLLIN, 0};
      if (poll(&fd, 1, 100) > 0) {
        char buf[256];
        if (read(STDIN_FILENO, buf, sizeof(buf)) <= 0)
          break;
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  server.stop(std::chrono::seconds(2));
  if (graph_root)
    caf::anon_send_exit(graph_root, caf::exit_reason::user_shutdown);
  std::cout << "stopped" << std::endl;
  return 0;
}
