// bench_window_pull: restoring a cached prefix on a prefill instance whose device did not
// compute it, with the window state (SWA rings, unfinished block) another device kept — pulled
// from that device (docs/serve.md, "Window-state pulls") — against bounded replay, the
// alternative when no copy is to be had. Both on the CPU device, on a random model of a preset
// (default small), a prompt of --tokens tokens whose full blocks are what the store serves.
//
// Per round, interleaved, each a fresh sequence on device B (released afterwards):
// - replay:    kv_restore with the blocks alone (B replays the prefix's last window);
// - handle:    kv_kept_export on device A, then kv_restore with that copy (one process:
//              troupe serve's path);
// - tcp:       the same, with the copy encoded (kv_bridge's format), offered on one fabric
//              endpoint and pulled from another over libfabric's tcp provider, then decoded
//              (troupe launch's path between processes; both endpoints in this process).
// Each time covers the request to its answer. And what keeping costs a decode instance: per
// round, two sequences on A with the same tokens each get 127 tokens (not timed), then the
// one-token step that ends on a block boundary is timed, once with step_sequence::keep (the
// device sets the window state aside) and once without, in alternating order.
// Prints min and median over the rounds, the window state's size, and the load average before
// and after.
//
//   build/bench/bench_window_pull [--preset small] [--tokens 1024] [--rounds 7] [--threads 2]
#include "cluster/launch/kv_bridge.hpp"
#include "kernels/model_init.hpp"
#include "ports/cpu_device.hpp"
#include "ports/fabric_link.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

using namespace troupe;
using steady = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "bench_window_pull: %s\n", why.c_str());
  std::exit(1);
}

template <class T, class Msg, class Handle>
T ask(caf::scoped_actor& self, const Handle& h, Msg msg) {
  T out{};
  self->request(h, std::chrono::minutes(10), std::move(msg))
    .receive([&](T& v) { out = std::move(v); },
             [&](caf::error& e) { die(caf::to_string(e)); });
  return out;
}

double ms(steady::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

} // namespace

int main(int argc, char** argv) {
  std::string preset = "small";
  std::size_t tokens = 1024, rounds = 7;
  std::uint32_t threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--preset")
      preset = argv[i + 1];
    else if (a == "--tokens")
      tokens = std::stoul(argv[i + 1]);
    else if (a == "--rounds")
      rounds = std::stoul(argv[i + 1]);
    else if (a == "--threads")
      threads = static_cast<std::uint32_t>(std::stoul(argv[i + 1]));
    else
      die("unknown option " + a);
  }
  if (tokens < 256 || tokens % 128 != 0 || rounds == 0)
    die("--tokens must be a multiple of 128 and at least 256, --rounds at least 1");
  const auto dir = std::filesystem::temp_directory_path()
                   / ("troupe-bench-window-" + std::to_string(::getpid()));
  if (auto ok = kernels::write_random_model(dir, preset, 7); !ok.ok())
    die(ok.error());

  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto device = [&] {
    ports::cpu_device_params p;
    p.model_dir = dir;
    p.engram_map = "identity";
    p.threads = threads;
    return ports::spawn_cpu_device(sys, std::move(p));
  };
  auto a = device();
  auto b = device();
  ports::fabric_params fp;
  fp.provider = "tcp";
  auto link_a = ports::spawn_fabric_link(sys, fp);
  auto link_b = ports::spawn_fabric_link(sys, fp);
  if (!link_a || !link_b)
    die("no tcp fabric endpoint");

  // Device A computes the prompt's full blocks and keeps the window state there.
  std::vector<std::int32_t> prompt(tokens);
  std::uint32_t x = 12345;
  for (auto& t : prompt)
    t = static_cast<std::int32_t>(3 + ((x = x * 1664525u + 1013904223u) >> 8) % 250);
  const runtime::store_key key{0xfeed, 0xbeef};
  runtime::device_step prefill;
  prefill.id = 1;
  prefill.phase = runtime::step_phase::prefill;
  runtime::step_sequence row;
  row.sequence = 1;
  row.count = static_cast<std::uint32_t>(tokens);
  row.tokens = prompt;
  prefill.batch.push_back(row);
  prefill.tokens = tokens;
  prefill.context_tokens = tokens;
  prefill.sequences = 1;
  const auto computed = steady::now();
  ask<runtime::device_result>(self, a, prefill);
  const auto compute_ms = ms(steady::now() - computed);
  self->send(a, runtime::kv_keep{1, key, tokens});
  prefill.batch[0].sequence = 2;  // the decode-keep comparison's second sequence
  ask<runtime::device_result>(self, a, prefill);
  auto blocks = ask<runtime::kv_snapshot_ptr>(self, a, runtime::kv_export{1, 0, true});
  const auto state = ask<runtime::kv_snapshot_ptr>(self, a, runtime::kv_kept_export{key, tokens});
  const auto state_bytes = state->state.bytes.size() + state->swa.bytes.size();

  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::printf("bench_window_pull: preset %s, a %zu-token prefix (%zu blocks, %.1f MiB of "
              "Block KV), window state %.1f KiB; %u device threads; %zu rounds; load average "
              "%.2f\n",
              preset.c_str(), tokens, blocks->blocks.size(),
              static_cast<double>(blocks->blocks.size() * blocks->blocks[0].bytes.size())
                / (1 << 20),
              static_cast<double>(state_bytes) / 1024, threads, rounds, load[0]);
  std::printf("(computing the prefix on A took %.0f ms)\n", compute_ms);

  std::map<std::string, std::vector<double>> times;
  std::uint64_t id = 100;
  auto restore = [&](runtime::kv_snapshot_ptr copy, bool want_pulled) {
    auto r = ask<runtime::kv_restored>(
      self, b, runtime::kv_restore{id, blocks, key, {prompt.begin(), prompt.begin() + tokens},
                                   std::move(copy)});
    if (r.pulled != want_pulled)
      die("a restore did not use the window state it was meant to");
    self->send(b, runtime::device_release{id++});
  };
  std::uint64_t offer = 1;
  for (std::size_t r = 0; r < rounds; ++r) {
    auto t0 = steady::now();
    restore(nullptr, false);
    times["bounded replay"].push_back(ms(steady::now() - t0));

    t0 = steady::now();
    restore(ask<runtime::kv_snapshot_ptr>(self, a, runtime::kv_kept_export{key, tokens}), true);
    times["pulled, by handle"].push_back(ms(steady::now() - t0));

    t0 = steady::now();
    auto kept = ask<runtime::kv_snapshot_ptr>(self, a, runtime::kv_kept_export{key, tokens});
    auto ticket = ask<runtime::fabric_ticket>(
      self, *link_a, runtime::fabric_offer{offer++, cluster::encode_snapshot(*kept), true});
    auto got = ask<runtime::fabric_pulled>(self, *link_b, runtime::fabric_pull{ticket});
    auto decoded = cluster::decode_snapshot(got.bytes);
    if (!decoded)
      die("the pulled bytes are not a snapshot");
    restore(std::make_shared<const runtime::kv_snapshot>(std::move(*decoded)), true);
    times["pulled, over fabric tcp"].push_back(ms(steady::now() - t0));

    // Sequences 1 and 2 on A: 127 more tokens, then the step onto the next block boundary.
    const auto at = tokens + r * 128;
    std::vector<std::int32_t> more(prompt.begin(), prompt.begin() + 128);
    for (std::uint64_t seq : {1u, 2u}) {
      runtime::device_step chunk = prefill;
      chunk.batch[0].sequence = seq;
      chunk.batch[0].position = at;
      chunk.batch[0].count = 127;
      chunk.batch[0].tokens.assign(more.begin(), more.begin() + 127);
      ask<runtime::device_result>(self, a, chunk);
    }
    for (std::uint64_t k = 0; k < 2; ++k) {
      const std::uint64_t seq = (r + k) % 2 == 0 ? 1 : 2;
      runtime::device_step step = prefill;
      step.phase = runtime::step_phase::decode;
      step.batch[0] = runtime::step_sequence{seq, at + 127, 1, {more[127]}, true, {}};
      step.batch[0].params.temperature = 0.0;
      step.batch[0].keep = seq == 1;
      t0 = steady::now();
      ask<runtime::device_result>(self, a, step);
      times[seq == 1 ? "keep: step, set aside" : "keep: step, without"].push_back(
        ms(steady::now() - t0));
    }
  }
  std::printf("%-26s %10s %10s\n", "restore of the prefix /", "min ms", "median ms");
  std::printf("%-26s\n", "a decode step onto a block");
  for (const auto* name : {"bounded replay", "pulled, by handle", "pulled, over fabric tcp",
                           "keep: step, without", "keep: step, set aside"}) {
    auto v = times[name];
    std::sort(v.begin(), v.end());
    std::printf("%-26s %10.2f %10.2f\n", name, v.front(), v[v.size() / 2]);
  }
  getloadavg(load, 3);
  std::printf("load average after: %.2f\n", load[0]);
  for (auto h : {caf::actor_cast<caf::actor>(a), caf::actor_cast<caf::actor>(b),
                 caf::actor_cast<caf::actor>(*link_a), caf::actor_cast<caf::actor>(*link_b)})
    self->send_exit(h, caf::exit_reason::user_shutdown);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
