// Tests of cluster/launch/kv_bridge: a KV snapshot as one byte string for the fabric link, the
// bridge rebuilding a job's structured-output constraint in its process, and a kept window
// state pulled from another process's bridge.
#include "cluster/launch/control_directory.hpp"
#include "cluster/launch/kv_bridge.hpp"

#include "ports/fabric_link.hpp"
#include "recipe/tokenizer.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace troupe;
using namespace troupe::cluster;

namespace {

runtime::kv_snapshot sample() {
  runtime::kv_snapshot s;
  s.model = "small-1";
  s.length = 300;
  for (int i = 0; i < 2; ++i)
    s.blocks.push_back(runtime::kv_bytes{std::string(1000 + i, static_cast<char>('a' + i)),
                                         0x1111u * static_cast<unsigned>(i + 1)});
  s.state = runtime::kv_bytes{std::string("state\0bytes", 11), 42};
  s.swa = runtime::kv_bytes{std::string(777, '\xff'), 7};
  s.draft = runtime::kv_bytes{std::string(333, 'd'), 9};
  return s;
}

bool same(const runtime::kv_snapshot& a, const runtime::kv_snapshot& b) {
  if (a.model != b.model || a.length != b.length || a.blocks.size() != b.blocks.size()
      || a.state.bytes != b.state.bytes || a.state.checksum != b.state.checksum
      || a.swa.bytes != b.swa.bytes || a.swa.checksum != b.swa.checksum
      || a.draft.bytes != b.draft.bytes || a.draft.checksum != b.draft.checksum)
    return false;
  for (std::size_t i = 0; i < a.blocks.size(); ++i)
    if (a.blocks[i].bytes != b.blocks[i].bytes || a.blocks[i].checksum != b.blocks[i].checksum)
      return false;
  return true;
}

} // namespace

TEST_CASE("a snapshot survives encoding byte for byte") {
  auto s = sample();
  auto back = decode_snapshot(encode_snapshot(s));
  REQUIRE(back.has_value());
  CHECK(same(s, *back));
  runtime::kv_snapshot empty;
  auto e = decode_snapshot(encode_snapshot(empty));
  REQUIRE(e.has_value());
  CHECK(same(empty, *e));
}

TEST_CASE("a truncated, extended or foreign byte string is not a snapshot") {
  auto bytes = encode_snapshot(sample());
  for (std::size_t cut : {std::size_t{0}, std::size_t{3}, std::size_t{20}, bytes.size() / 2,
                          bytes.size() - 1})
    CHECK_FALSE(decode_snapshot(std::string_view(bytes).substr(0, cut)).has_value());
  CHECK_FALSE(decode_snapshot(bytes + "x").has_value());
  auto foreign = bytes;
  foreign[0] ^= 1;
  CHECK_FALSE(decode_snapshot(foreign).has_value());
}

namespace {

const recipe::tokenizer& v4() {
  static const auto t = recipe::tokenizer::from_file(std::string(TROUPE_SOURCE_DIR)
                                                     + "/recipe/data/deepseek-v4/tokenizer.json.gz");
  return t;
}

std::int32_t id_of(const std::string& text) {
  const auto ids = v4().encode(text, recipe::encode_mode::raw);
  REQUIRE(ids.size() == 1);
  return static_cast<std::int32_t>(ids[0]);
}

/// What the stand-in engine saw of the constraint when its job ran.
struct seen {
  bool constrained = false;
  std::vector<std::uint32_t> allowed;
  std::size_t jobs = 0;
};

/// An engine's answer to kept_state_get when its device keeps `kept` (none when null).
auto answer_kept(runtime::kv_snapshot_ptr kept) {
  return [kept](const actors::kept_state_get& g) -> caf::result<actors::kept_state> {
    if (!kept || g.length != kept->length)
      return caf::make_error(caf::sec::runtime_error, "no window state kept there");
    return actors::kept_state{kept};
  };
}

/// A decode engine that, for each job, asks the table what the first token it samples (at
/// context_tokens + 1) may be, and answers done; it keeps the window state `kept`.
actors::decode_engine_actor::behavior_type
engine_fn(actors::decode_engine_actor::pointer self, std::shared_ptr<actors::constraint_table> table,
          std::shared_ptr<seen> out, runtime::kv_snapshot_ptr kept) {
  return {
    [self, table, out](actors::decode_job& job) {
      ++out->jobs;
      std::vector<std::uint32_t> mask((v4().vocab_size() + 31) / 32);
      out->constrained = table->allowed(job.request, job.context_tokens + 1, mask);
      out->allowed.clear();
      for (std::uint32_t id = 0; id < mask.size() * 32; ++id)
        if ((mask[id / 32] >> (id % 32)) & 1u)
          out->allowed.push_back(id);
      actors::decode_done d;
      d.request = job.request;
      return d;
    },
    [](actors::engine_stats_atom) { return actors::engine_stats{}; },
    [](actors::drain_atom, runtime::duration) { return std::uint64_t{0}; },
    [](actors::drain_end_atom) {},
    [](actors::cancel_atom, std::uint64_t) {},
    answer_kept(std::move(kept)),
    [](const actors::kv_part_streamed&) {},
  };
}

} // namespace

TEST_CASE("a decode job's constraint is rebuilt in the bridge's process while the job runs") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto table = std::make_shared<actors::constraint_table>(v4());
  auto out = std::make_shared<seen>();
  auto engine = sys.spawn(engine_fn, table, out, runtime::kv_snapshot_ptr{});
  kv_bridge_params params;  // no fabric link: KV is not moved, constraints are
  params.counters = std::make_shared<kv_bridge_counters>();
  params.constraints = table;
  auto bridge = spawn_decode_bridge(sys, engine, params);
  caf::scoped_actor self{sys};

  recipe::response_format f;
  f.type = recipe::response_format::kind::regex;
  f.regex = "(yes|no), (yes|no)!";
  actors::decode_job job;
  job.request = 41;
  job.context.assign(100, id_of("!"));  // the prompt
  job.context.push_back(id_of("yes"));  // drawn by the prefill instance, position 100
  job.context.push_back(id_of(","));    // drawn by an earlier decode instance
  job.next = id_of(" no");              // position 102, fed by this job's first step
  job.context_tokens = job.context.size();
  job.output_tokens = 10;
  job.constraint = {actors::constraint_table::format_key(f), false, 100};
  bool answered = false;
  self->request(bridge, std::chrono::seconds(30), job)
    .receive([&](const actors::decode_done& d) { answered = d.request == 41; },
             [&](const caf::error& e) { FAIL(sys.render(e)); });
  CHECK(answered);
  CHECK(out->constrained);
  CHECK(out->allowed == std::vector<std::uint32_t>{static_cast<std::uint32_t>(id_of("!"))});
  CHECK(table->size() == 0);  // forgotten when the job ended
  CHECK(params.counters->jobs == 0);

  // Without a constraint the engine samples freely.
  job.request = 42;
  job.constraint = {};
  self->request(bridge, std::chrono::seconds(30), job)
    .receive([](const actors::decode_done&) {}, [&](const caf::error& e) { FAIL(sys.render(e)); });
  CHECK_FALSE(out->constrained);

  // Output the format refuses fails the job before the engine sees it: never unconstrained.
  job.request = 43;
  job.constraint = {actors::constraint_table::format_key(f), false, 100};
  job.context[101] = id_of("!");
  const auto jobs_before = out->jobs;
  std::string error;
  self->request(bridge, std::chrono::seconds(30), job)
    .receive([](const actors::decode_done&) { FAIL("a job with a broken constraint ran"); },
             [&](const caf::error& e) { error = sys.render(e); });
  CHECK(error.find("structured output") != std::string::npos);
  CHECK(error.find("position 101") != std::string::npos);
  CHECK(out->jobs == jobs_before);
  CHECK(params.counters->jobs == 0);

  // A format new to this process is compiled while the job runs: the engine gets the job at
  // once, and its device waits for the compile at the first constrained token. When the output
  // so far turns out not to follow the format (found on the compile thread), the device may
  // only end the output, and the job answers with the refusal — never unconstrained.
  job.request = 44;
  recipe::response_format slow;
  slow.type = recipe::response_format::kind::json_schema;
  slow.schema_json = R"({"anyOf": [{"type": "string", "maxLength": 150}, {"type": "string", "minLength": 2, "maxLength": 149},
                                   {"type": "string", "minLength": 3, "maxLength": 148}]})";
  job.constraint = {actors::constraint_table::format_key(slow), false, 100};
  job.context.resize(100);
  job.next = id_of("!");  // position 100: not how a JSON string starts
  job.context_tokens = job.context.size();
  error.clear();
  self->request(bridge, std::chrono::seconds(30), job)
    .receive([](const actors::decode_done&) { FAIL("a refused constraint's job succeeded"); },
             [&](const caf::error& e) { error = sys.render(e); });
  CHECK_MESSAGE(error.find("structured output") != std::string::npos, error);
  CHECK_MESSAGE(error.find("position 100") != std::string::npos, error);
  CHECK(out->jobs == jobs_before + 1);  // it ran, overlapping the compile
  CHECK(out->constrained);
  CHECK(out->allowed == std::vector<std::uint32_t>{*v4().token_to_id("<｜end▁of▁sentence｜>")});
  CHECK(table->size() == 0);
  CHECK(params.counters->jobs == 0);

  // The same format, now compiled here, with a good start: the engine may draw a string's text.
  job.request = 45;
  job.next = id_of("\"");
  self->request(bridge, std::chrono::seconds(30), job)
    .receive([](const actors::decode_done&) {}, [&](const caf::error& e) { FAIL(sys.render(e)); });
  CHECK(out->constrained);
  CHECK(out->allowed.size() > 1000);
  CHECK(std::find(out->allowed.begin(), out->allowed.end(), static_cast<std::uint32_t>(id_of("!")))
        != out->allowed.end());
  self->send_exit(bridge, caf::exit_reason::user_shutdown);
  self->send_exit(engine, caf::exit_reason::user_shutdown);
}

namespace {

/// What a stand-in prefill engine's jobs got from their keepers (null: an error).
struct asked {
  std::vector<runtime::kv_snapshot_ptr> got;
};

/// A prefill engine that keeps `kept` (none when null) and answers kept_state_get with it, and
/// whose jobs, when they name a keeper, ask it for the state at block {1, 2} and note the
/// answer before they are done.
actors::prefill_engine_actor::behavior_type
keeper_engine_fn(actors::prefill_engine_actor::pointer self, runtime::kv_snapshot_ptr kept,
                 std::shared_ptr<asked> out) {
  return {
    [self, out](actors::prefill_job& job) {
      auto rp = self->make_response_promise<actors::prefill_done>();
      actors::prefill_done done;
      done.request = job.request;
      self->request(caf::actor_cast<caf::actor>(job.keeper), std::chrono::seconds(30),
                    actors::kept_state_get{job.request, {1, 2}, 256})
        .then(
          [rp, out, done](actors::kept_state& k) mutable {
            out->got.push_back(std::move(k.kv));
            rp.deliver(done);
          },
          [rp, out, done](const caf::error&) mutable {
            out->got.push_back(nullptr);
            rp.deliver(done);
          });
      return rp;
    },
    [](actors::engine_stats_atom) { return actors::engine_stats{}; },
    [](actors::drain_atom, runtime::duration) { return std::uint64_t{0}; },
    [](actors::cancel_atom, std::uint64_t) {},
    answer_kept(std::move(kept)),
  };
}

} // namespace

TEST_CASE("a kept window state crosses from the keeper's process (prefill or decode) to the "
          "asking job's engine over the fabric, and a keeper that has none leaves the job "
          "without") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  ports::fabric_params fp;
  fp.provider = "tcp";
  auto link_a = ports::spawn_fabric_link(sys, fp);
  auto link_b = ports::spawn_fabric_link(sys, fp);
  REQUIRE(link_a);
  REQUIRE(link_b);
  auto state = sample();
  state.length = 256;
  state.blocks.clear();
  state.draft = {};
  const auto kept = std::make_shared<const runtime::kv_snapshot>(state);
  auto seen_a = std::make_shared<asked>();
  auto seen_b = std::make_shared<asked>();
  auto engine_a = sys.spawn(keeper_engine_fn, kept, seen_a);
  auto engine_b = sys.spawn(keeper_engine_fn, runtime::kv_snapshot_ptr{}, seen_b);
  // Two processes' bridges, each with its own fabric endpoint.
  auto bridge = [&](actors::prefill_engine_actor e, runtime::fabric_link_port link) {
    kv_bridge_params p;
    p.link = std::move(link);
    p.counters = std::make_shared<kv_bridge_counters>();
    return std::pair{spawn_prefill_bridge(sys, std::move(e), p), p.counters};
  };
  auto [bridge_a, counters_a] = bridge(engine_a, *link_a);
  auto [bridge_b, counters_b] = bridge(engine_b, *link_b);
  caf::scoped_actor self{sys};
  auto run = [&](const actors::prefill_engine_actor& at, std::uint64_t request,
                 const actors::prefill_engine_actor& keeper) {
    actors::prefill_job job;
    job.request = request;
    job.keeper = caf::actor_cast<caf::strong_actor_ptr>(keeper);
    self->request(at, std::chrono::seconds(60), std::move(job))
      .receive([&](const actors::prefill_done& d) { CHECK(d.request == request); },
               [&](const caf::error& e) { FAIL(sys.render(e)); });
  };
  // B's job asks A (as the balancer names A's bridge): A's bridge offers the copy, B's pulls it
  // and its engine gets it by handle, byte for byte.
  run(bridge_b, 7, bridge_a);
  REQUIRE(seen_b->got.size() == 1);
  REQUIRE(seen_b->got[0] != nullptr);
  CHECK(seen_b->got[0] != kept);  // rebuilt from the bytes pulled, not the keeper's handle
  CHECK(same(*seen_b->got[0], *kept));
  CHECK(counters_a->offered == 1);
  CHECK(counters_b->pulled == 1);
  CHECK(counters_b->pull_failures == 0);
  // A's job asks B, which keeps nothing: the job goes on without (it replays).
  run(bridge_a, 8, bridge_b);
  REQUIRE(seen_a->got.size() == 1);
  CHECK(seen_a->got[0] == nullptr);
  CHECK(counters_b->offered == 0);
  CHECK(counters_a->pulled == 0);
  // A decode process's bridge answers like a prefill one: B's next job pulls the state the
  // decode engine's device kept where a reply's block ended.
  auto link_c = ports::spawn_fabric_link(sys, fp);
  REQUIRE(link_c);
  auto decode_engine = sys.spawn(engine_fn, std::make_shared<actors::constraint_table>(v4()),
                                 std::make_shared<seen>(), kept);
  kv_bridge_params pc;
  pc.link = *link_c;
  pc.counters = std::make_shared<kv_bridge_counters>();
  auto bridge_c = spawn_decode_bridge(sys, decode_engine, pc);
  run(bridge_b, 9, caf::actor_cast<actors::prefill_engine_actor>(bridge_c));
  REQUIRE(seen_b->got.size() == 2);
  REQUIRE(seen_b->got[1] != nullptr);
  CHECK(same(*seen_b->got[1], *kept));
  CHECK(pc.counters->offered == 1);
  CHECK(counters_b->pulled == 2);
  for (auto h : {caf::actor_cast<caf::actor>(bridge_a), caf::actor_cast<caf::actor>(bridge_b),
                 caf::actor_cast<caf::actor>(engine_a), caf::actor_cast<caf::actor>(engine_b),
                 caf::actor_cast<caf::actor>(bridge_c), caf::actor_cast<caf::actor>(decode_engine),
                 caf::actor_cast<caf::actor>(*link_a), caf::actor_cast<caf::actor>(*link_b),
                 caf::actor_cast<caf::actor>(*link_c)})
    self->send_exit(h, caf::exit_reason::user_shutdown);
}

TEST_CASE("an instance process's relay reports a decode engine's kept window states to the "
          "prefill balancer naming the engine's bridge, and a prefill engine's unchanged") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor lb{sys};        // the decode balancer
  caf::scoped_actor kept_to{sys};   // the prefill balancer
  auto engine = sys.spawn(engine_fn, std::make_shared<actors::constraint_table>(v4()),
                          std::make_shared<seen>(), runtime::kv_snapshot_ptr{});
  auto relay = spawn_balancer_relay(sys, caf::actor_cast<caf::actor>(lb),
                                    caf::actor_cast<caf::actor>(kept_to), kv_bridge_params{});
  caf::anon_send(relay, actors::add_instance_atom::value, actors::instance_id{3}, engine);
  caf::actor bridge;
  lb->receive([&](actors::add_instance_atom, actors::instance_id id,
                  const actors::decode_engine_actor& b) {
    CHECK(id == 3);
    bridge = caf::actor_cast<caf::actor>(b);
  });
  REQUIRE(bridge);
  CHECK(bridge != caf::actor_cast<caf::actor>(engine));
  auto reported = [&](actors::prefill_kept k) {
    caf::anon_send(relay, std::move(k));
    actors::prefill_kept got;
    kept_to->receive([&](actors::prefill_kept& x) { got = std::move(x); });
    return got;
  };
  const actors::block_key key{7, 9};
  auto d = reported({3, key, caf::actor_cast<caf::strong_actor_ptr>(engine)});
  CHECK(d.instance == 3);
  CHECK(d.key == key);
  CHECK(caf::actor_cast<caf::actor>(d.keeper) == bridge);
  auto p = reported({0, key, nullptr});  // a prefill engine's: its balancer knows the engine
  CHECK(p.instance == 0);
  CHECK_FALSE(p.keeper);
  for (auto h : {relay, bridge, caf::actor_cast<caf::actor>(engine)})
    caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
}

namespace {

using go_atom = caf::atom_constant<caf::atom("go")>;

/// Blocks [first, first + n) of `whole` as a run (a blocks-only snapshot).
runtime::kv_snapshot_ptr run_of(const runtime::kv_snapshot& whole, std::size_t first,
                                std::size_t n) {
  auto r = std::make_shared<runtime::kv_snapshot>();
  r->model = whole.model;
  r->length = (first + n) * 128;
  r->blocks.assign(whole.blocks.begin() + static_cast<std::ptrdiff_t>(first),
                   whole.blocks.begin() + static_cast<std::ptrdiff_t>(first + n));
  return r;
}

/// A prefill engine whose streaming jobs send blocks 0-1 and 2-3 of `whole` as runs to their
/// sender at once, and answer with the rest (block 4 on, State and SWA KV) only when told `go`:
/// the runs cross while it "computes".
caf::behavior streaming_engine_fn(caf::event_based_actor* self, runtime::kv_snapshot whole,
                                  std::shared_ptr<std::vector<bool>> streamed) {
  auto held = std::make_shared<std::vector<std::pair<caf::response_promise, actors::prefill_done>>>();
  return {
    [self, whole, streamed, held](actors::prefill_job& job) {
      streamed->push_back(job.stream_kv);
      auto to = caf::actor_cast<caf::actor>(self->current_sender());
      auto rp = self->make_response_promise();
      actors::prefill_done done;
      done.request = job.request;
      done.kv_first_block = 4;
      auto rest = std::make_shared<runtime::kv_snapshot>(whole);
      rest->blocks.erase(rest->blocks.begin(), rest->blocks.begin() + 4);
      done.kv = rest;
      self->send(to, actors::prefill_kv_part{job.request, 0, run_of(whole, 0, 2)});
      self->send(to, actors::prefill_kv_part{job.request, 2, run_of(whole, 2, 2)});
      held->emplace_back(rp, std::move(done));
      return rp;
    },
    [held](go_atom) {
      for (auto& [rp, done] : *held)
        rp.deliver(std::move(done));
      held->clear();
    },
    [](actors::engine_stats_atom) { return actors::engine_stats{}; },
    [](actors::drain_atom, runtime::duration) { return std::uint64_t{0}; },
    [](actors::cancel_atom, std::uint64_t) {},
  };
}

/// A decode engine that keeps each job's KV.
caf::behavior kv_keeping_engine_fn(caf::event_based_actor*,
                                   std::shared_ptr<std::vector<runtime::kv_snapshot_ptr>> got) {
  return {
    [got](actors::decode_job& job) {
      got->push_back(job.kv);
      actors::decode_done d;
      d.request = job.request;
      return d;
    },
    [](actors::engine_stats_atom) { return actors::engine_stats{}; },
    [](actors::drain_atom, runtime::duration) { return std::uint64_t{0}; },
    [](actors::drain_end_atom) {},
    [](actors::cancel_atom, std::uint64_t) {},
  };
}

} // namespace

TEST_CASE("a prompt's blocks cross to the decode process booked for it while its prefill "
          "computes, and its decode job gets them joined to the rest") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  ports::fabric_params fp;
  fp.provider = "tcp";
  auto link_p = ports::spawn_fabric_link(sys, fp);
  auto link_d = ports::spawn_fabric_link(sys, fp);
  auto link_o = ports::spawn_fabric_link(sys, fp);
  REQUIRE(link_p);
  REQUIRE(link_d);
  REQUIRE(link_o);
  auto whole = sample();
  whole.length = 5 * 128 + 7;
  whole.blocks.clear();
  for (int i = 0; i < 5; ++i)
    whole.blocks.push_back(runtime::kv_bytes{std::string(900 + 10 * i, static_cast<char>('k' + i)),
                                             0x2222u * static_cast<unsigned>(i + 1)});
  auto streamed = std::make_shared<std::vector<bool>>();
  auto prefill = sys.spawn(streaming_engine_fn, whole, streamed);
  auto got_d = std::make_shared<std::vector<runtime::kv_snapshot_ptr>>();
  auto got_o = std::make_shared<std::vector<runtime::kv_snapshot_ptr>>();
  auto decode_d = sys.spawn(kv_keeping_engine_fn, got_d);
  auto decode_o = sys.spawn(kv_keeping_engine_fn, got_o);
  auto params = [](runtime::fabric_link_port link) {
    kv_bridge_params p;
    p.link = std::move(link);
    p.counters = std::make_shared<kv_bridge_counters>();
    return p;
  };
  auto pp = params(*link_p);
  auto pd = params(*link_d);
  auto po = params(*link_o);
  auto bridge_p = spawn_prefill_bridge(sys, caf::actor_cast<actors::prefill_engine_actor>(prefill), pp);
  auto bridge_d = spawn_decode_bridge(sys, caf::actor_cast<actors::decode_engine_actor>(decode_d), pd);
  auto bridge_o = spawn_decode_bridge(sys, caf::actor_cast<actors::decode_engine_actor>(decode_o), po);
  caf::scoped_actor self{sys};
  // Prefills `request`, naming `kv_to` as the decode side booked (or none); `ready()` is
  // awaited (bounded) before the engine answers.
  auto prefill_job = [&](std::uint64_t request, caf::strong_actor_ptr kv_to, auto ready) {
    actors::prefill_job job;
    job.request = request;
    job.input_tokens = 647;
    job.tokens.assign(647, 1);
    job.kv_to = std::move(kv_to);
    auto answer = self->request(bridge_p, std::chrono::seconds(60), std::move(job));
    for (int i = 0; i < 1000 && !ready(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(ready());
    self->send(prefill, go_atom::value);
    actors::prefill_done done;
    std::move(answer).receive([&](actors::prefill_done& d) { done = std::move(d); },
                              [&](const caf::error& e) { FAIL(sys.render(e)); });
    return done;
  };
  auto decode_job = [&](const actors::decode_engine_actor& at, const actors::prefill_done& d) {
    actors::decode_job job;
    job.request = d.request;
    job.kv_ticket = d.kv_ticket;
    job.kv_parts = d.kv_parts;
    self->request(at, std::chrono::seconds(60), std::move(job))
      .receive([](const actors::decode_done&) {}, [&](const caf::error& e) { FAIL(sys.render(e)); });
  };

  // Booked decode process: it pulls both runs while the prefill is still computing.
  auto d1 = prefill_job(1, caf::actor_cast<caf::strong_actor_ptr>(bridge_d),
                        [&] { return pd.counters->pulled_early == 2; });
  REQUIRE(streamed->size() == 1);
  CHECK(streamed->front());  // the bridge asked its engine to stream the job's blocks
  CHECK(d1.kv_first_block == 4);
  REQUIRE(d1.kv_parts.size() == 2);
  CHECK(d1.kv_parts[0].first_block == 0);
  CHECK(d1.kv_parts[1].first_block == 2);
  CHECK(d1.kv_parts[1].blocks == 2);
  CHECK(d1.kv_ticket.id != 0);
  CHECK(pp.counters->offered == 3);
  decode_job(bridge_d, d1);
  REQUIRE(got_d->size() == 1);
  REQUIRE(got_d->front() != nullptr);
  CHECK(same(*got_d->front(), whole));  // blocks 0..4 in order, then State and SWA KV
  CHECK(pd.counters->pulled == 3);
  CHECK(pd.counters->pulled_early == 2);
  CHECK(pd.counters->pull_failures == 0);

  // No decode side booked: its decode process pulls the runs and the rest together.
  auto d2 = prefill_job(2, nullptr, [&] { return pp.counters->offered == 5; });
  REQUIRE(d2.kv_parts.size() == 2);
  decode_job(bridge_o, d2);
  REQUIRE(got_o->size() == 1);
  REQUIRE(got_o->front() != nullptr);
  CHECK(same(*got_o->front(), whole));
  CHECK(po.counters->pulled == 3);
  CHECK(po.counters->pulled_early == 0);

  // Runs that do not join up (one left out) are no KV: the engine recomputes, and it is said.
  auto d3 = prefill_job(3, nullptr, [&] { return pp.counters->offered == 8; });
  REQUIRE(d3.kv_parts.size() == 2);
  d3.kv_parts.erase(d3.kv_parts.begin());
  decode_job(bridge_o, d3);
  REQUIRE(got_o->size() == 2);
  CHECK(got_o->back() == nullptr);
  CHECK(po.counters->pull_failures == 1);
  for (auto h : {caf::actor_cast<caf::actor>(bridge_p), caf::actor_cast<caf::actor>(bridge_d),
                 caf::actor_cast<caf::actor>(bridge_o), prefill, decode_d, decode_o,
                 caf::actor_cast<caf::actor>(*link_p), caf::actor_cast<caf::actor>(*link_d),
                 caf::actor_cast<caf::actor>(*link_o)})
    self->send_exit(h, caf::exit_reason::user_shutdown);
}
