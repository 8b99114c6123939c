// The real world's serving graph (cluster/real_graph.hpp) on real CPU devices: a tiny random
// model served through the request actors, balancers, separate prefill and decode instances
// and the KV hand-off between their devices, as `troupe serve` runs it (without HTTP).
#include <doctest/doctest.h>

#include "../ports/store_drivers.hpp"
#include "actors/engine/prefill_engine.hpp"
#include "actors/fault_injector.hpp"
#include "tests/cluster/real_graph_fixture.hpp"

#include <caf/after.hpp>
#include <caf/stateful_actor.hpp>

#include <fstream>

using namespace troupe;
using namespace troupe::test;
using namespace std::chrono_literals;

namespace {

/// Six requests decoding together: request i has a prompt of `prompt + i * prompt_step` ids and
/// asks for `tokens + i * tokens_step`; the odd ones sample at `temperature` with seed
/// `seed_step * i`, the others are greedy; request `stopping` ends on `stop` (when >= 0).
struct six_requests {
  std::size_t prompt = 0, prompt_step = 0;
  std::uint32_t salt = 0;  // the prompts' seeds: i + salt
  std::uint64_t tokens = 0, tokens_step = 0;
  double temperature = 0;
  std::uint64_t seed_step = 0;
  std::uint64_t stopping = 0;

  std::vector<actors::generation_request> operator()(fixture& f, std::int32_t stop) const {
    std::vector<actors::generation_request> all;
    for (std::uint64_t id = 1; id <= 6; ++id) {
      auto g = f.request(id, prompt_of(prompt + prompt_step * id,
                                       static_cast<std::uint32_t>(id) + salt, f.vocab),
                         tokens + tokens_step * id, {});
      if (id % 2 == 1) {
        g.sampling.temperature = temperature;
        g.sampling.seed = seed_step * id;
      }
      if (id == stopping && stop >= 0)
        g.stop_ids = {stop};
      all.push_back(std::move(g));
    }
    return all;
  }
};

} // namespace

TEST_CASE("a served request's greedy tokens equal troupe generate's, through the KV hand-off") {
  fixture f;
  check_handoff(f);
}

TEST_CASE("a request served among 63 concurrent others gives the tokens it gives alone") {
  fixture f;
  caf::scoped_actor self{f.w.system()};
  const auto prompt = prompt_of(40, 7, f.vocab);
  const auto alone = generate_greedy(prompt, 8);
  std::vector<actors::generation_request> all;
  all.push_back(f.request(1, prompt, 8, {}));
  for (std::uint64_t id = 2; id <= 64; ++id)
    all.push_back(f.request(id, prompt_of(5 + id % 37, static_cast<std::uint32_t>(id), f.vocab),
                            4 + id % 9, {}));
  auto out = f.run(self, std::move(all));
  REQUIRE(out.size() == 64);
  CHECK(out[1].tokens == alone);
  for (auto& [id, s] : out) {
    CAPTURE(id);
    CHECK(s.end.reason == actors::finish_reason::length);
    CHECK(s.tokens.size() == s.end.completion_tokens);
  }
}

TEST_CASE("with speculative decoding every request gets the tokens it gets without, greedy or "
          "seeded") {
  // Six requests, half sampled with seeds, one with a stop id, all decoding together.
  auto requests = [](fixture& f, const std::vector<std::int32_t>& stop) {
    std::vector<actors::generation_request> all;
    for (std::uint64_t id = 1; id <= 6; ++id) {
      auto g = f.request(id, prompt_of(20 + 17 * id, static_cast<std::uint32_t>(id), f.vocab), 24,
                         {});
      if (id % 2 == 0) {
        g.sampling.temperature = 0.8;
        g.sampling.seed = 100 + id;
      }
      if (id == 3)
        g.stop_ids = stop;
      all.push_back(std::move(g));
    }
    return all;
  };
  std::map<std::uint64_t, served> off;
  {
    fixture f;
    caf::scoped_actor self{f.w.system()};
    off = f.run(self, requests(f, {}));
  }
  // Request 3 stops at its tenth token's first occurrence.
  const auto stop = off[3].tokens.at(9);
  const auto upto = std::find(off[3].tokens.begin(), off[3].tokens.end(), stop);
  const std::vector<std::int32_t> stopped(off[3].tokens.begin(), upto + 1);
  for (const std::string mode : {"fixed5", "fixed2", "dspark"}) {
    CAPTURE(mode);
    // DSpark's cost curve given flat (a step of 64 tokens as fast as one of 1), so that every
    // draft with a chance is worth verifying and the steps verify some; the device, finding
    // the profile set, does not measure it (tests/ports/test_cpu_speculation.cpp does).
    fixture f(false, {}, 1, *actors::parse_speculation(mode), {{1, 1e-3}, {64, 1e-3}});
    caf::scoped_actor self{f.w.system()};
    auto on = f.run(self, requests(f, {stop}));
    for (std::uint64_t id = 1; id <= 6; ++id) {
      CAPTURE(id);
      CHECK(on[id].tokens == (id == 3 ? stopped : off[id].tokens));
      CHECK(on[id].end.reason
            == (id == 3 ? actors::finish_reason::stop : actors::finish_reason::length));
    }
    // The decode device proposed drafts and verified them (whether a random model's drafts
    // are accepted is chance).
    CHECK(f.metric("troupe_device_drafts_total{device=\"decode\",outcome=\"proposed\"}") > 0);
    CHECK(f.metric("troupe_device_drafts_total{device=\"decode\",outcome=\"verified\"}") > 0);
  }
}

TEST_CASE("overlapped speculative steps accept drafts and give every request the tokens it gets "
          "without speculation") {
  // The uniform model (device_fixture.hpp): greedy requests accept every draft, so the steps
  // built ahead start where only the device knows; seeded ones draw uniformly at their
  // positions and rarely accept one, so a wrong position shows in their tokens. One seeded
  // request ends on a stop id.
  const six_requests requests{18, 11, 60, 9, 4, 1.0, 5, 5};
  const auto& model = test::model_dirs::tiny_uniform();
  std::map<std::uint64_t, served> off;
  {
    fixture f(false, {}, 1, {}, {}, false, model);
    caf::scoped_actor self{f.w.system()};
    off = f.run(self, requests(f, -1));
  }
  const auto stop = off[5].tokens.at(6);
  const auto upto = std::find(off[5].tokens.begin(), off[5].tokens.end(), stop);
  const std::vector<std::int32_t> stopped(off[5].tokens.begin(), upto + 1);
  for (const std::string mode : {"fixed5", "dspark"}) {
    for (const bool overlap : {false, true}) {
      CAPTURE(mode);
      CAPTURE(overlap);
      fixture f(false, {}, 1, *actors::parse_speculation(mode), {{1, 1e-3}, {64, 1e-3}},
                overlap, model);
      caf::scoped_actor self{f.w.system()};
      auto on = f.run(self, requests(f, stop));
      for (std::uint64_t id = 1; id <= 6; ++id) {
        CAPTURE(id);
        CHECK(on[id].tokens == (id == 5 ? stopped : off[id].tokens));
        CHECK(on[id].end.reason
              == (id == 5 ? actors::finish_reason::stop : actors::finish_reason::length));
      }
      CHECK(f.metric("troupe_device_drafts_total{device=\"decode\",outcome=\"accepted\"}")
            > 0);
      CHECK((f.log->fed_drawn > 0) == overlap);
    }
  }
}

TEST_CASE("overlapped decode steps give every request the tokens it gets unoverlapped") {
  // Six requests of different lengths joining at different steps, half seeded, one ending on
  // a stop id (the step built ahead computes a token for it that is dropped).
  const six_requests requests{15, 23, 40, 10, 3, 0.7, 7, 4};
  std::map<std::uint64_t, served> off;
  {
    fixture f(false, {}, 1, {}, {}, false);
    caf::scoped_actor self{f.w.system()};
    off = f.run(self, requests(f, -1));
    CHECK(f.log->fed_drawn == 0);
  }
  const auto stop = off[4].tokens.at(5);
  const auto upto = std::find(off[4].tokens.begin(), off[4].tokens.end(), stop);
  const std::vector<std::int32_t> stopped(off[4].tokens.begin(), upto + 1);
  fixture f;
  caf::scoped_actor self{f.w.system()};
  auto on = f.run(self, requests(f, stop));
  CHECK(f.log->fed_drawn > 0);
  for (std::uint64_t id = 1; id <= 6; ++id) {
    CAPTURE(id);
    CHECK(on[id].tokens == (id == 4 ? stopped : off[id].tokens));
    CHECK(on[id].end.reason
          == (id == 4 ? actors::finish_reason::stop : actors::finish_reason::length));
  }
  // Every sequence leaves the decode device (its releases follow the answers).
  for (int i = 0; i < 500 && f.metric("troupe_device_sequences{device=\"decode\"}") != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(f.metric("troupe_device_sequences{device=\"decode\"}") == 0);
}

TEST_CASE("corrupt handed-off KV is refused by the decode device and the context recomputed") {
  fixture f{true};
  caf::scoped_actor self{f.w.system()};
  const auto prompt = prompt_of(150, 3, f.vocab);
  auto out = f.run(self, {f.request(1, prompt, 6, {})});
  CHECK(f.log->exported == 1);
  CHECK(f.log->refused == 1);
  CHECK(f.log->imported == 0);
  CHECK(f.metric("troupe_kv_imports_total{device=\"decode\",outcome=\"refused\"}") == 1);
  CHECK(f.metric("troupe_kv_imports_total{device=\"decode\",outcome=\"imported\"}") == 0);
  // Never decoded from the corrupt KV: the same tokens as the exact engine.
  CHECK(out[1].tokens == generate_greedy(prompt, 6));
}

TEST_CASE("a stop id ends the stream at that token, reported as stop") {
  fixture f;
  caf::scoped_actor self{f.w.system()};
  const auto prompt = prompt_of(30, 5, f.vocab);
  const auto full = generate_greedy(prompt, 10);
  auto g = f.request(1, prompt, 10, {});
  g.stop_ids = {full[3]};
  auto out = f.run(self, {g});
  // Up to and including the first occurrence of that id.
  auto first = std::find(full.begin(), full.end(), full[3]);
  CHECK(out[1].tokens == std::vector<std::int32_t>(full.begin(), first + 1));
  CHECK(out[1].end.reason == actors::finish_reason::stop);
}

/// Cancels `request` (streaming to `self`) and waits for its end, which says cancelled.
void cancel_until_end(caf::scoped_actor& self, const caf::actor& request) {
  self->send(request, actors::cancel_atom::value);
  bool ended = false;
  while (!ended)
    self->receive([](const actors::generation_tokens&) {},
                  [&](const actors::generation_end& e) {
                    ended = true;
                    CHECK(e.reason == actors::finish_reason::cancelled);
                  },
                  caf::after(60s) >> [&] { FAIL("no end"); });
}

TEST_CASE("a cancelled request ends at once and frees its decode booking") {
  fixture f;
  caf::scoped_actor self{f.w.system()};
  auto g = f.request(1, prompt_of(20, 9, f.vocab), 100000, caf::actor_cast<caf::actor>(self));
  caf::actor request;
  self->request(f.graph.service, 30s, std::move(g))
    .receive([&](caf::actor a) { request = std::move(a); },
             [&](const caf::error& e) { FAIL(f.w.system().render(e)); });
  // Wait for a few tokens (decoding has begun), then cancel.
  std::size_t got = 0;
  while (got < 3)
    self->receive([&](const actors::generation_tokens& t) { got += t.tokens.size(); },
                  caf::after(60s) >> [&] { FAIL("no tokens"); });
  cancel_until_end(self, request);
  // The decode balancer holds no booking any more (the request released it as it ended).
  for (int tries = 0; tries < 100; ++tries) {
    actors::pool_load load;
    self->request(f.graph.decode_lb, 10s, actors::pool_load_atom::value)
      .receive([&](const actors::pool_load& l) { load = l; },
               [&](const caf::error& e) { FAIL(f.w.system().render(e)); });
    if (load.in_compute == 0)
      return;
    std::this_thread::sleep_for(10ms);
  }
  FAIL("the decode booking was not released");
}


TEST_CASE("a prompt seen before computes only its uncached tail, with the exact tokens") {
  test::temp_dir dir;
  fixture f{false, dir.path()};
  caf::scoped_actor self{f.w.system()};
  const auto prompt = prompt_of(300, 21, f.vocab);  // 2 full blocks and 44 tokens
  const auto exact = generate_greedy(prompt, 8);
  auto first = f.run(self, {f.request(1, prompt, 8, {})});
  CHECK(first[1].tokens == exact);
  CHECK(first[1].end.cached_tokens == 0);
  // Its two full blocks reach the store (written after the hand-off, asynchronously).
  REQUIRE(f.wait_for_blocks(self, 2) == 2);

  auto second = f.run(self, {f.request(2, prompt, 8, {})});
  CHECK(second[2].end.cached_tokens == 256);
  // The prefill device kept the window state at the boundary: an exact restore, the same
  // tokens as computing everything.
  CHECK(second[2].tokens == exact);
  CHECK(f.metric("troupe_kv_restores_total{device=\"prefill\",outcome=\"exact\"}") == 1);
  CHECK(f.metric("troupe_store_reads_total{outcome=\"hit\"}") == 2);
  // Only the tail was computed: 300 + 44 prompt tokens over both requests.
  CHECK(f.metric("troupe_device_tokens_total{device=\"prefill\",phase=\"prefill\"}") == 344);
}

TEST_CASE("a prompt another prefill instance kept restores there exactly: its window state is "
          "pulled from that instance") {
  test::temp_dir dir;
  fixture f{false, dir.path(), 1, {}, {}, true, {}, 2};
  caf::scoped_actor self{f.w.system()};
  const auto prompt = prompt_of(300, 27, f.vocab);  // 2 full blocks and 44 tokens
  const auto exact = generate_greedy(prompt, 8);
  auto first = f.run(self, {f.request(1, prompt, 8, {})});
  CHECK(first[1].tokens == exact);
  REQUIRE(f.wait_for_blocks(self, 2) == 2);
  // The instance that computed it (and kept the window state at 256) takes no new work, so the
  // prompt's second prefill runs on the other one.
  const std::vector<std::string> devices{"prefill", "prefill-1"};
  auto computed = [&](std::size_t i) {
    return f.metric("troupe_device_tokens_total{device=\"" + devices[i] + "\",phase=\"prefill\"}");
  };
  const std::size_t keeper = computed(0) > 0 ? 0 : 1;
  REQUIRE(computed(keeper) == 300);
  caf::anon_send(f.graph.prefill_lb, actors::drain_instance_atom::value,
                 static_cast<actors::instance_id>(keeper));
  auto second = f.run(self, {f.request(2, prompt, 8, {})});
  CHECK(second[2].end.cached_tokens == 256);
  CHECK(computed(1 - keeper) == 44);
  // Restored from the keeper's copy: exact, the same tokens as computing everything.
  const auto other = devices[1 - keeper];
  CHECK(f.metric("troupe_kv_restores_total{device=\"" + other + "\",outcome=\"pulled\"}") == 1);
  CHECK(f.metric("troupe_kv_restores_total{device=\"" + other + "\",outcome=\"replayed\"}") == 0);
  CHECK(second[2].tokens == exact);
}

TEST_CASE("a prompt sharing only a prefix restores it by bounded replay and computes the rest") {
  test::temp_dir dir;
  fixture f{false, dir.path()};
  caf::scoped_actor self{f.w.system()};
  const auto a = prompt_of(300, 22, f.vocab);
  f.run(self, {f.request(1, a, 4, {})});
  REQUIRE(f.wait_for_blocks(self, 2) == 2);
  // The same first 200 tokens (one full block), then other ones.
  auto b = prompt_of(290, 23, f.vocab);
  std::copy_n(a.begin(), 200, b.begin());
  auto out = f.run(self, {f.request(2, b, 6, {})});
  CHECK(out[2].end.cached_tokens == 128);
  CHECK(out[2].end.completion_tokens == 6);
  CHECK(out[2].tokens.size() == 6);
  // No state was kept at that boundary (the first request kept its own at 256).
  CHECK(f.metric("troupe_kv_restores_total{device=\"prefill\",outcome=\"replayed\"}") == 1);
  CHECK(f.metric("troupe_kv_restores_total{device=\"prefill\",outcome=\"exact\"}") == 0);
}

TEST_CASE("a corrupt block file is never served: the request computes it, exactly") {
  test::temp_dir dir;
  fixture f{false, dir.path()};
  caf::scoped_actor self{f.w.system()};
  const auto prompt = prompt_of(300, 24, f.vocab);
  const auto exact = generate_greedy(prompt, 6);
  f.run(self, {f.request(1, prompt, 6, {})});
  REQUIRE(f.wait_for_blocks(self, 2) == 2);
  // Flip one payload byte of the prompt's first block on disk.
  std::vector<std::uint32_t> ids(prompt.begin(), prompt.end());
  const auto first_key = actors::make_chain(std::span<const std::uint32_t>(ids)).front();
  const auto name = actors::to_string(first_key) + ".blk";
  std::filesystem::path file;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    if (e.path().filename() == name)
      file = e.path();
  REQUIRE_FALSE(file.empty());
  {
    std::fstream fs(file, std::ios::in | std::ios::out | std::ios::binary);
    fs.seekg(200);
    char c = 0;
    fs.read(&c, 1);
    c = static_cast<char>(c ^ 0x20);
    fs.seekp(200);
    fs.write(&c, 1);
  }
  auto out = f.run(self, {f.request(2, prompt, 6, {})});
  CHECK(out[2].end.cached_tokens == 0);
  CHECK(out[2].tokens == exact);
  CHECK(f.metric("troupe_store_reads_total{outcome=\"corrupt\"}") == 1);
  // The store dropped the bad file; the second request wrote the block anew, so a third one
  // hits both blocks again.
  REQUIRE(f.wait_for_blocks(self, 2) == 2);
  auto third = f.run(self, {f.request(3, prompt, 6, {})});
  CHECK(third[3].end.cached_tokens == 256);
  CHECK(third[3].tokens == exact);
}

TEST_CASE("a restarted graph finds the blocks persisted before and restores them by replay") {
  test::temp_dir dir;
  std::vector<std::int32_t> prompt;
  {
    fixture f{false, dir.path()};
    caf::scoped_actor self{f.w.system()};
    prompt = prompt_of(300, 25, f.vocab);
    f.run(self, {f.request(1, prompt, 4, {})});
    REQUIRE(f.wait_for_blocks(self, 2) == 2);
  }
  fixture f{false, dir.path()};
  caf::scoped_actor self{f.w.system()};
  auto out = f.run(self, {f.request(1, prompt, 4, {})});
  CHECK(out[1].end.cached_tokens == 256);
  CHECK(out[1].tokens.size() == 4);
  // The window state kept in memory is gone with the old process: bounded replay.
  CHECK(f.metric("troupe_kv_restores_total{device=\"prefill\",outcome=\"replayed\"}") == 1);
}

/// Two turns of a conversation on `f` (with a store): a 100-token prompt `a` and 200 generated
/// tokens, then, once decode persisted blocks 0 and 1, the next turn `b` (`a` and the reply's
/// first 170 tokens) for `n` tokens. Its cached prefix ends at 256, inside the reply, where
/// the decode device kept the window state: the prefill instance pulls it, no replay.
struct two_turns {
  std::vector<std::int32_t> a, b;
  std::vector<std::int32_t> first, second;
};

/// The keeper the prefill balancer names for a prefix ending with `tokens`' block at 256
/// (invalid: none).
caf::actor keeper_at_256(fixture& f, caf::scoped_actor& self,
                         const std::vector<std::int32_t>& tokens) {
  std::vector<std::uint32_t> ids(tokens.begin(), tokens.begin() + 256);
  const auto key = actors::make_chain(std::span<const std::uint32_t>(ids)).back();
  actors::prefill_assignment a;
  self->request(f.graph.prefill_lb, 30s, actors::prefill_route{999, 50, key})
    .receive([&](actors::prefill_assignment& x) { a = std::move(x); },
             [&](const caf::error& e) { FAIL(f.w.system().render(e)); });
  self->send(f.graph.prefill_lb, actors::prefill_release{a.instance, 50});
  return a.keeper;
}

two_turns next_turn_pulls(fixture& f, caf::scoped_actor& self, std::uint32_t seed, int n) {
  two_turns t;
  t.a = prompt_of(100, seed, f.vocab);  // no full block: prefill persists nothing
  auto first = f.run(self, {f.request(1, t.a, 200, {})});
  t.first = first[1].tokens;
  REQUIRE(t.first.size() == 200);
  REQUIRE(f.wait_for_blocks(self, 2) == 2);
  t.b = t.a;
  t.b.insert(t.b.end(), t.first.begin(), t.first.begin() + 170);
  CHECK(keeper_at_256(f, self, t.b));  // the decode engine, told when the reply ended
  auto out = f.run(self, {f.request(2, t.b, static_cast<std::uint32_t>(n), {})});
  t.second = out[2].tokens;
  CHECK(out[2].end.cached_tokens == 256);
  CHECK(f.metric("troupe_kv_restores_total{device=\"prefill\",outcome=\"pulled\"}") == 1);
  CHECK(f.metric("troupe_kv_restores_total{device=\"prefill\",outcome=\"replayed\"}") == 0);
  return t;
}

TEST_CASE("a later prompt holding a reply's tokens hits the blocks decode filled, and restores "
          "exactly with the window state the decode device kept there") {
  test::temp_dir dir;
  fixture f{false, dir.path()};
  caf::scoped_actor self{f.w.system()};
  const auto t = next_turn_pulls(f, self, 26, 4);
  // The decode device's steps ended on 128, then 256 (that copy replaced the first), and the
  // pulled state gives what computing it all gives.
  CHECK(f.metric("troupe_device_kept_states{device=\"decode\"}") == 1);
  CHECK(t.second == generate_greedy(t.b, 4));
}

TEST_CASE("a conversation that goes on from a reply the client stopped pulls the window state "
          "kept where the part it got last ended a block") {
  test::temp_dir dir;
  fixture f{false, dir.path()};
  caf::scoped_actor self{f.w.system()};
  const auto a = prompt_of(100, 29, f.vocab);
  auto g = f.request(1, a, 100000, caf::actor_cast<caf::actor>(self));
  caf::actor request;
  self->request(f.graph.service, 30s, std::move(g))
    .receive([&](caf::actor x) { request = std::move(x); },
             [&](const caf::error& e) { FAIL(f.w.system().render(e)); });
  // Stop it once 160 tokens came (the cache passed 256; the next boundary is 124 tokens on).
  std::vector<std::int32_t> got;
  while (got.size() < 160)
    self->receive(
      [&](const actors::generation_tokens& t) {
        got.insert(got.end(), t.tokens.begin(), t.tokens.end());
      },
      caf::after(60s) >> [&] { FAIL("no tokens"); });
  cancel_until_end(self, request);
  REQUIRE(f.wait_for_blocks(self, 2) == 2);
  auto b = a;
  b.insert(b.end(), got.begin(), got.begin() + 160);
  auto out = f.run(self, {f.request(2, b, 4, {})});
  CHECK(out[2].end.cached_tokens == 256);
  CHECK(f.metric("troupe_kv_restores_total{device=\"prefill\",outcome=\"pulled\"}") == 1);
  CHECK(f.metric("troupe_kv_restores_total{device=\"prefill\",outcome=\"replayed\"}") == 0);
  CHECK(out[2].tokens == generate_greedy(b, 4));
}

TEST_CASE("with window states off (serve --window-memory 0) no engine reports a keep, so no job "
          "asks for one: the next turn replays") {
  test::temp_dir dir;
  fixture f{false, dir.path(), 1, {}, {}, true, {}, 1, false};
  caf::scoped_actor self{f.w.system()};
  const auto a = prompt_of(100, 30, f.vocab);
  auto first = f.run(self, {f.request(1, a, 200, {})});
  REQUIRE(f.wait_for_blocks(self, 2) == 2);
  auto b = a;
  b.insert(b.end(), first[1].tokens.begin(), first[1].tokens.begin() + 170);
  CHECK_FALSE(keeper_at_256(f, self, b));
  auto out = f.run(self, {f.request(2, b, 4, {})});
  CHECK(out[2].end.cached_tokens == 256);
  CHECK(f.metric("troupe_kv_restores_total{device=\"prefill\",outcome=\"replayed\"}") == 1);
  CHECK(f.metric("troupe_device_kept_states{device=\"decode\"}") == 0);
}

TEST_CASE("with speculative decoding that accepts every draft, the decode device still keeps "
          "the window state at the reply's block boundary, and the next turn pulls it") {
  // The uniform model: greedy requests accept every draft, so each step would take six tokens
  // and step over block boundaries; a keeping device verifies only the drafts up to the next.
  const auto& model = test::model_dirs::tiny_uniform();
  test::temp_dir dir;
  fixture f(false, dir.path(), 1, *actors::parse_speculation("fixed5"), {}, true, model);
  caf::scoped_actor self{f.w.system()};
  const auto t = next_turn_pulls(f, self, 28, 6);
  CHECK(f.metric("troupe_device_drafts_total{device=\"decode\",outcome=\"accepted\"}") > 100);
  // The same tokens as computing the whole prompt, and the first turn's as without drafts.
  fixture plain(false, {}, 1, {}, {}, true, model);
  caf::scoped_actor s2{plain.w.system()};
  auto want = plain.run(s2, {plain.request(1, t.a, 200, {}), plain.request(2, t.b, 6, {})});
  CHECK(t.first == want[1].tokens);
  CHECK(t.second == want[2].tokens);
}

TEST_CASE("a draining decode instance hands its request over with its KV: exact tokens, "
          "nothing recomputed") {
  fixture f(false, {}, 2);
  caf::scoped_actor self{f.w.system()};
  const auto a = prompt_of(40, 71, f.vocab);
  const std::uint32_t n = 160;
  // A short prompt: the decode balancer's short-class instance (0) takes it; the other is its
  // long class, where the request spills once 0 leaves.
  self->request(f.graph.service, 30s, f.request(1, a, n, caf::actor_cast<caf::actor>(self)))
    .receive([](const caf::actor&) {},
             [&](const caf::error& e) { FAIL("refused: " << f.w.system().render(e)); });
  served out;
  bool ended = false;
  auto faults = std::make_shared<std::vector<actors::fault_record>>();
  caf::actor injector;
  while (!ended) {
    bool timed_out = false;
    self->receive(
      [&](actors::generation_tokens& t) {
        out.tokens.insert(out.tokens.end(), t.tokens.begin(), t.tokens.end());
      },
      [&](actors::generation_end& e) {
        out.end = e;
        ended = true;
      },
      caf::after(120s) >> [&] { timed_out = true; });
    REQUIRE_FALSE(timed_out);
    // Decoding: instance 0 leaves (no grace), mid-stream.
    if (!injector && out.tokens.size() >= 4) {
      actors::fault_order drain;
      drain.path = {"decode", "decode/0"};
      drain.drain = runtime::duration{0};
      injector = actors::spawn_fault_injector(f.w.system(), f.graph.cluster, {drain}, faults);
    }
  }
  REQUIRE(injector);
  CHECK(out.tokens == generate_greedy(a, n));
  CHECK(out.end.reason == actors::finish_reason::length);
  // The drain forwarded the request, whose KV the other instance imported: the prefill
  // hand-off and the migration, neither refused (a recomputed context would import nothing).
  REQUIRE(faults->size() == 1);
  CHECK((*faults)[0].injected);
  REQUIRE((*faults)[0].forwarded);
  CHECK((*faults)[0].forwarded->done);
  CHECK((*faults)[0].forwarded->forwarded == 1);
  CHECK(f.log->imported.load() == 2);
  CHECK(f.log->refused.load() == 0);
  caf::anon_send_exit(injector, caf::exit_reason::user_shutdown);
}

TEST_CASE("with the topology's autoscaler on, the decode pool grows under load and shrinks when "
          "idle, every request getting its exact tokens") {
  // Decode instances of two requests each, one to start with and at most two: six requests
  // (two in compute, four waiting for room) want three; none, for 3 s, the minimum again (the
  // delay keeps the pool from shrinking between a batch's end and the next retries).
  std::string text = topology_text;
  const std::string one = "role = \"decode\"\ninstances = 1";
  text.replace(text.find(one), one.size(),
               "role = \"decode\"\ninstances = { min = 1, initial = 1, max = 2 }\ngrace = \"1s\"");
  text += R"(
[autoscaler]
enabled = true
interval = "100ms"
max_step_up = 1
max_step_down = 1
over_provision = 0
quota = 8
scale_down_after = "3s"
)";
  auto topo = cluster::parse_topology(text, "autoscale.toml");
  REQUIRE(topo.value);
  fixture f(false, {}, 1, {}, {}, true, {}, 1, true, {}, *topo.value, 2);
  caf::scoped_actor self{f.w.system()};
  auto decode_instances = [&] {
    std::size_t n = 0;
    self->request(f.graph.cluster, 10s, runtime::which_children_atom::value)
      .receive(
        [&](const std::vector<runtime::child_info>& pools) {
          for (const auto& p : pools)
            if (p.id == "decode")
              self->request(p.handle, 10s, runtime::which_children_atom::value)
                .receive([&](const std::vector<runtime::child_info>& c) { n = c.size(); },
                         [&](const caf::error& e) { FAIL(f.w.system().render(e)); });
        },
        [&](const caf::error& e) { FAIL(f.w.system().render(e)); });
    return n;
  };
  auto online = [&] {
    std::uint32_t n = 0;
    self->request(f.graph.decode_lb, 10s, actors::pool_load_atom::value)
      .receive([&](const actors::pool_load& l) { n = l.online; },
               [&](const caf::error& e) { FAIL(f.w.system().render(e)); });
    return n;
  };
  auto wait_until = [&](auto&& done) {
    for (int i = 0; i < 1000 && !done(); ++i)
      std::this_thread::sleep_for(20ms);
    return done();
  };
  CHECK(decode_instances() == 1);
  std::map<std::uint64_t, served> out;
  // Six long generations, two at a time on decode/0 and the others waiting: the autoscaler
  // orders decode/1, which joins and takes those still waiting.
  std::map<std::uint64_t, std::vector<std::int32_t>> asked;
  for (std::uint64_t id = 1; id <= 6; ++id) {
    asked[id] = prompt_of(20, static_cast<std::uint32_t>(id), f.vocab);
    f.submit(self, f.request(id, asked[id], 900, {}));
  }
  f.collect(self, out, 6);
  CHECK(f.metric("troupe_device_tokens_total{device=\"decode\",phase=\"decode\"}") > 0);
  CHECK(f.metric("troupe_device_tokens_total{device=\"decode-1\",phase=\"decode\"}") > 0);
  for (const auto& [id, prompt] : asked) {
    CAPTURE(id);
    CHECK(out[id].tokens == generate_greedy(prompt, 900));
    CHECK(out[id].end.reason == actors::finish_reason::length);
  }
  // The decisions as metrics: decode/1 ordered.
  CHECK(f.metric("troupe_autoscaler_scaled_total{pool=\"decode\",direction=\"up\"}") >= 1);
  // Idle: the pool drains decode/1 and is back at its minimum, and still serves.
  REQUIRE(wait_until([&] { return decode_instances() == 1 && online() == 1; }));
  CHECK(wait_until([&] {
    return f.metric("troupe_autoscaler_instances{pool=\"decode\",state=\"online\"}") == 1 &&
           f.metric("troupe_autoscaler_target{pool=\"decode\"}") == 1;
  }));
  CHECK(f.metric("troupe_autoscaler_scaled_total{pool=\"decode\",direction=\"down\"}") >= 1);
  CHECK(f.metric("troupe_autoscaler_demand{pool=\"decode\"}") == 0);
  const auto last = prompt_of(25, 9, f.vocab);
  f.submit(self, f.request(7, last, 12, {}));
  f.collect(self, out, 1);
  CHECK(out[7].tokens == generate_greedy(last, 12));
}

TEST_CASE("instances of several ranks run as EP groups, each rank holding its experts: exact "
          "tokens, and a rank's exit re-forms its instance") {
  // The tiny model's 8 routed experts over 2 prefill ranks and 3 decode ranks.
  std::string text = topology_text;
  for (auto [role, n] : {std::pair{"prefill", "2"}, {"decode", "3"}}) {
    const std::string one = "role = \"" + std::string(role) + "\"\ninstances = 1\ngpus_per_instance = 1";
    text.replace(text.find(one), one.size(),
                 "role = \"" + std::string(role) + "\"\ninstances = 1\ngpus_per_instance = " + n);
  }
  auto topo = cluster::parse_topology(text, "ep.toml");
  REQUIRE(topo.value);
  REQUIRE(cluster::check_real_topology(*topo.value).empty());
  fixture f(false, {}, 1, {}, {}, true, {}, 1, true, {}, *topo.value);
  caf::scoped_actor self{f.w.system()};
  auto children = [&](const caf::actor& of) {
    std::vector<runtime::child_info> out;
    self->request(of, 10s, runtime::which_children_atom::value)
      .receive([&](std::vector<runtime::child_info>& c) { out = std::move(c); },
               [&](const caf::error& e) { FAIL(f.w.system().render(e)); });
    return out;
  };
  auto instance = [&](const std::string& pool) {
    for (const auto& p : children(f.graph.cluster))
      if (p.id == pool)
        return caf::actor_cast<caf::actor>(children(caf::actor_cast<caf::actor>(p.handle)).at(0).handle);
    FAIL("no pool " << pool);
    return caf::actor{};
  };
  auto ranks = [&](const caf::actor& inst) {
    std::vector<std::string> ids;
    for (const auto& c : children(inst))
      if (c.id.rfind("rank", 0) == 0)
        ids.push_back(c.id);
    return ids;
  };
  CHECK(ranks(instance("prefill")) == std::vector<std::string>{"rank0", "rank1"});
  const auto decode = instance("decode");
  CHECK(ranks(decode) == std::vector<std::string>{"rank0", "rank1", "rank2"});

  check_handoff(f);
  const auto prompt = prompt_of(60, 3, f.vocab);
  std::vector<actors::generation_request> all;
  for (std::uint64_t id = 2; id <= 6; ++id)
    all.push_back(f.request(id, prompt, 6, {}));
  auto out = f.run(self, std::move(all));
  const auto exact = generate_greedy(prompt, 6);
  for (auto& [id, s] : out) {
    CAPTURE(id);
    CHECK(s.tokens == exact);
  }

  // Rank 2 of the decode instance fails: the instance goes down as a whole and comes back
  // (its pool restarts it), and serves the same tokens.
  for (const auto& c : children(decode))
    if (c.id == "rank2")
      caf::anon_send_exit(c.handle, caf::exit_reason::kill);
  caf::actor again;
  for (int i = 0; i < 200 && (!again || again == decode); ++i) {
    std::this_thread::sleep_for(50ms);
    again = instance("decode");
  }
  REQUIRE(again != decode);
  CHECK(ranks(again).size() == 3);
  out = f.run(self, {f.request(7, prompt, 6, {})});
  CHECK(out[7].tokens == exact);
}

TEST_CASE("a streaming prefill job sends its full blocks as its chunks compute them; joined to "
          "the rest they are the whole KV, byte for byte, and a decode device continues it") {
  device_fixture d;
  auto cpu = [&](const char* name) {
    ports::cpu_device_params p;
    p.model_dir = model_dirs::tiny();
    p.threads = 1;
    p.engram_map = "identity";
    p.name = name;
    return d.cpu(std::move(p));
  };
  auto prefill_dev = cpu("prefill");
  auto decode_dev = cpu("decode");
  auto cfg = kernels::load_model_config(model_dirs::tiny());
  REQUIRE(cfg.ok());
  actors::prefill_engine_params pe;
  pe.step_tokens = 64;  // 300 tokens: chunks end at 64, 128, 192, 256 and 300
  auto engine = actors::spawn_prefill_engine(d.self.ptr(), pe, prefill_dev, runtime::link_port{});
  const auto prompt = prompt_of(300, 5, cfg->text.vocab_size);
  auto prefill = [&](std::uint64_t request, bool stream) {
    actors::prefill_job job{request, prompt.size(), 0, 0, prompt, {}};
    job.sampling.temperature = 0;
    job.stream_kv = stream;
    actors::prefill_done done;
    d.self->request(engine, 60s, std::move(job))
      .receive([&](actors::prefill_done& x) { done = std::move(x); },
               [&](const caf::error& e) { FAIL(d.sys.render(e)); });
    return done;
  };
  auto streamed = prefill(1, true);
  // The runs came before the answer, in order: block 0 after the second chunk, block 1 after
  // the fourth; the answer holds the rest (no full block) and the window state.
  std::vector<actors::prefill_kv_part> runs;
  for (bool more = true; more;)
    d.self->receive([&](actors::prefill_kv_part& p) { runs.push_back(std::move(p)); },
                    caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
  REQUIRE(runs.size() == 2);
  CHECK(runs[0].request == 1);
  CHECK(runs[0].first_block == 0);
  CHECK(runs[1].first_block == 1);
  REQUIRE(streamed.kv);
  CHECK(streamed.kv_first_block == 2);
  CHECK(streamed.kv->blocks.empty());
  CHECK(streamed.kv->length == 300);
  // The same prompt without streaming: one export of everything.
  auto whole = prefill(2, false);
  REQUIRE(whole.kv);
  CHECK(whole.kv_first_block == 0);
  REQUIRE(whole.kv->blocks.size() == 2);
  CHECK(whole.next.token == streamed.next.token);
  auto joined = std::make_shared<runtime::kv_snapshot>(*streamed.kv);
  for (const auto& r : runs) {
    REQUIRE(r.kv);
    CHECK(r.kv->model == whole.kv->model);
    for (const auto& b : r.kv->blocks)
      joined->blocks.push_back(b);
  }
  REQUIRE(joined->blocks.size() == 2);
  for (std::size_t b = 0; b < 2; ++b)
    CHECK(joined->blocks[b].bytes == whole.kv->blocks[b].bytes);
  CHECK(joined->state.bytes == whole.kv->state.bytes);
  CHECK(joined->swa.bytes == whole.kv->swa.bytes);
  // A decode device imports it and continues exactly as the whole prompt's greedy run.
  CHECK(d.ask<caf::ok_atom>(decode_dev, runtime::kv_import{7, joined}));
  const auto next = d.continue_greedy(decode_dev, 7, prompt.size(), streamed.next.token, 4);
  auto alone = generate_greedy(prompt, 5);
  CHECK(streamed.next.token == alone[0]);
  CHECK(next == std::vector<std::int32_t>(alone.begin() + 1, alone.end()));
  d.self->send_exit(engine, caf::exit_reason::user_shutdown);
}
