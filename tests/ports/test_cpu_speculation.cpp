// Speculative decoding on the CPU device (tiny random model, which has DSpark draft layers):
// verifying drafts draws exactly the tokens of one-token steps, greedy or seeded, rolls the
// rejected drafts back, and the device proposes its own drafts.
#include "device_fixture.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace troupe;
using namespace troupe::test;
using runtime::device_errc;

namespace {

/// Sequence `id`'s tokens, one per step: the prompt's step, then `n - 1` single-token steps.
std::vector<runtime::sampled_token> one_by_one(device_fixture& f, const runtime::device_port& dev,
                                               std::uint64_t id,
                                               const std::vector<std::int32_t>& pr,
                                               std::size_t n, runtime::sampling params) {
  std::vector<runtime::sampled_token> out{f.sampled(dev, step({seq(id, 0, pr, true, params)}))};
  while (out.size() < n)
    out.push_back(
      f.sampled(dev, step({seq(id, pr.size() + out.size() - 1, {out.back().token}, true, params)})));
  return out;
}

} // namespace

TEST_CASE_FIXTURE(device_fixture,
                  "verifying drafts draws exactly the tokens of one-token steps, greedy or seeded") {
  auto dev = cpu(tiny_params());
  const auto pr = prompt(20, 9);
  const auto other = prompt(13, 2);
  for (const auto& params : {runtime::sampling{.temperature = 0.0, .top_logprobs = 0},
                             runtime::sampling{.temperature = 0.9, .seed = 21, .top_logprobs = 0}}) {
    CAPTURE(params.temperature);
    const auto ref = one_by_one(*this, dev, 1, pr, 40, params);
    const auto ref_other = one_by_one(*this, dev, 2, other, 40, params);
    self->send(dev, runtime::device_release{1});
    self->send(dev, runtime::device_release{2});
    // Sequence 3 verifies drafts: the reference's next k tokens with the one at `wrong`
    // replaced (wrong == k: all right); sequence 4 decodes one token per step in the same batch.
    auto first = run(dev, step({seq(3, 0, pr, true, params), seq(4, 0, other, true, params)}));
    REQUIRE_MESSAGE(first, sys.render(first.error()));
    std::vector<runtime::sampled_token> got{first->sampled.at(0)}, got_other{first->sampled.at(1)};
    std::uint32_t accepted = 0, rejected = 0;
    for (std::uint32_t round = 0; got.size() + 6 <= ref.size(); ++round) {
      const std::uint32_t k = 1 + round % 5;
      const std::uint32_t wrong = (round * 3) % (k + 1);
      std::vector<std::int32_t> tokens{got.back().token};
      for (std::uint32_t j = 0; j < k; ++j) {
        const auto t = ref[got.size() + j].token;
        tokens.push_back(j == wrong ? (t + 1) % 256 : t);
      }
      auto s = seq(3, pr.size() + got.size() - 1, tokens, true, params);
      s.verify = k;
      auto r = run(dev, step({s, seq(4, other.size() + got_other.size() - 1,
                                      {got_other.back().token}, true, params)}));
      REQUIRE_MESSAGE(r, sys.render(r.error()));
      const auto answered = std::min(wrong, k) + 1;
      REQUIRE(r->sampled.size() == answered + 1);
      accepted += answered - 1;
      rejected += k - (answered - 1);
      for (std::uint32_t i = 0; i < answered; ++i) {
        CHECK(r->sampled[i].sequence == 3);
        got.push_back(r->sampled[i]);
      }
      CHECK(r->sampled.back().sequence == 4);
      got_other.push_back(r->sampled.back());
    }
    CHECK(accepted > 0);
    CHECK(rejected > 0);
    // The same tokens and, bitwise, the same log-probabilities: the logits of a verify step
    // are those of one-token steps (batch-invariant mode), and the cache after a rollback is
    // exactly the cache that never saw the rejected drafts.
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i].token == ref[i].token);
      CHECK(got[i].logprob == ref[i].logprob);
    }
    for (std::size_t i = 0; i < got_other.size(); ++i) {
      CAPTURE(i);
      CHECK(got_other[i].token == ref_other[i].token);
    }
    self->send(dev, runtime::device_release{3});
    self->send(dev, runtime::device_release{4});
  }
}

TEST_CASE_FIXTURE(device_fixture,
                  "a device proposes DSpark drafts, and verifying them keeps the greedy output") {
  auto dev = cpu(tiny_params());
  const auto pr = prompt(24, 4);
  const auto ref = greedy(dev, 1, pr, 40);
  auto first = seq(2, 0, pr);
  first.propose = true;
  auto r = run(dev, step({first, seq(3, 0, prompt(7, 1))}));
  REQUIRE_MESSAGE(r, sys.render(r.error()));
  std::vector<std::int32_t> got{r->sampled.at(0).token};
  std::size_t proposed = 0, accepted = 0;
  while (got.size() + 7 <= ref.size()) {
    // One proposal, for the sequence that asked.
    REQUIRE(r->drafts.size() == 1);
    const auto& d = r->drafts[0];
    CHECK(d.sequence == 2);
    REQUIRE(!d.tokens.empty());
    REQUIRE(d.tokens.size() <= 6);
    REQUIRE(d.confidences.size() == d.tokens.size());
    for (std::size_t k = 0; k < d.tokens.size(); ++k) {
      CHECK(d.tokens[k] >= 0);
      CHECK(d.tokens[k] < 256);
      CHECK(d.confidences[k] >= 0.0f);
      CHECK(d.confidences[k] <= 1.0f);
    }
    std::vector<std::int32_t> tokens{got.back()};
    tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
    auto s = seq(2, pr.size() + got.size() - 1, tokens);
    s.verify = static_cast<std::uint32_t>(d.tokens.size());
    s.propose = true;
    proposed += d.tokens.size();
    r = run(dev, step({s}));
    REQUIRE_MESSAGE(r, sys.render(r.error()));
    accepted += r->sampled.size() - 1;
    for (const auto& t : r->sampled)
      got.push_back(t.token);
  }
  MESSAGE("tiny random model: " << accepted << " of " << proposed << " drafts accepted");
  got.resize(std::min(got.size(), ref.size()));
  CHECK(got == std::vector<std::int32_t>(ref.begin(), ref.begin() + got.size()));
}

TEST_CASE_FIXTURE(device_fixture, "a step verifying more drafts than a rollback undoes is refused") {
  auto dev = cpu(tiny_params());
  auto s = seq(1, 0, prompt(10, 3));
  s.verify = 7;
  auto r = run(dev, step({s}));
  REQUIRE_FALSE(r);
  CHECK(runtime::is(r.error(), device_errc::invalid_step));
  // Nothing was opened: the sequence starts at 0 again.
  CHECK(run(dev, step({seq(1, 0, prompt(10, 3))})));
}

TEST_CASE_FIXTURE(device_fixture, "a device measures its step profile once its model has loaded") {
  auto p = tiny_params();
  p.profile = std::make_shared<ports::step_profile>();
  auto profile = p.profile;
  auto dev = cpu(std::move(p));
  // The profile is measured before the first step is answered.
  REQUIRE(run(dev, step({seq(1, 0, prompt(5, 1))})));
  const auto points = profile->get();
  REQUIRE(points.size() == 7);
  for (std::size_t i = 0; i < points.size(); ++i) {
    CHECK(points[i].first == (1u << i));
    CHECK(points[i].second > 0.0);
  }
  // Interpolated between points, never below the fastest step.
  const double low = std::min_element(points.begin(), points.end(), [](auto a, auto b) {
                       return a.second < b.second;
                     })->second;
  CHECK(profile->seconds(3) >= low);
  CHECK(profile->seconds(1000) >= low);
}

TEST_CASE("a step profile interpolates linearly and extends its last segment") {
  ports::step_profile p;
  CHECK(p.seconds(5) == 0.0);
  p.set({{1, 1.0}, {2, 1.0}, {4, 2.0}, {8, 6.0}});
  CHECK(p.seconds(1) == doctest::Approx(1.0));
  CHECK(p.seconds(3) == doctest::Approx(1.5));
  CHECK(p.seconds(6) == doctest::Approx(4.0));
  CHECK(p.seconds(16) == doctest::Approx(14.0));
  // Below the first point: never less than the fastest step.
  CHECK(p.seconds(0) == doctest::Approx(1.0));
}

TEST_CASE_FIXTURE(device_fixture,
                  "a sequence handed over with its draft context drafts as if it had stayed") {
  auto a = cpu(tiny_params());
  auto b = cpu(tiny_params());
  auto c = cpu(tiny_params());
  const auto pr = prompt(150, 8);
  // Device a prefills in two chunks, the first only extending the draft context; device c in
  // one step.
  auto head = seq(1, 0, {pr.begin(), pr.begin() + 100}, false);
  head.propose = true;
  REQUIRE(run(a, step({head})));
  auto tail = seq(1, 100, {pr.begin() + 100, pr.end()});
  tail.propose = true;
  auto first = run(a, step({tail}));
  REQUIRE(first);
  auto whole = seq(1, 0, pr);
  whole.propose = true;
  auto first_c = run(c, step({whole}));
  REQUIRE(first_c);
  const auto t0 = first->sampled.at(0).token;
  REQUIRE(first_c->sampled.at(0).token == t0);
  REQUIRE(first->drafts.size() == 1);
  CHECK(first->drafts[0].tokens == first_c->drafts.at(0).tokens);
  CHECK(first->drafts[0].confidences == first_c->drafts[0].confidences);
  // The hand-off carries the draft context.
  auto snap = ask<runtime::kv_snapshot_ptr>(a, runtime::kv_export{1});
  REQUIRE(snap);
  CHECK_FALSE((*snap)->draft.bytes.empty());
  REQUIRE(ask<caf::ok_atom>(b, runtime::kv_import{1, *snap}));
  auto next = seq(1, pr.size(), {t0});
  next.propose = true;
  auto stayed = run(a, step({next}));
  auto moved = run(b, step({next}));
  REQUIRE(stayed);
  REQUIRE(moved);
  CHECK(moved->sampled.at(0).token == stayed->sampled.at(0).token);
  REQUIRE(moved->drafts.size() == 1);
  CHECK(moved->drafts[0].tokens == stayed->drafts.at(0).tokens);
  CHECK(moved->drafts[0].confidences == stayed->drafts[0].confidences);
  // Without it the importing device drafts from an empty context: other confidences.
  auto bare = std::make_shared<runtime::kv_snapshot>(**snap);
  bare->draft = {};
  auto d = cpu(tiny_params());
  REQUIRE(ask<caf::ok_atom>(d, runtime::kv_import{1, bare}));
  auto blind = run(d, step({next}));
  REQUIRE(blind);
  CHECK(blind->sampled.at(0).token == stayed->sampled.at(0).token);
  CHECK(blind->drafts.at(0).confidences != stayed->drafts[0].confidences);
  // A corrupt draft context is refused like any other part of a snapshot.
  auto bad = std::make_shared<runtime::kv_snapshot>(**snap);
  bad->draft.bytes[bad->draft.bytes.size() / 2] ^= 0x01;
  auto e = cpu(tiny_params());
  auto refused = ask<caf::ok_atom>(e, runtime::kv_import{1, bad});
  REQUIRE_FALSE(refused);
  CHECK(runtime::is(refused.error(), device_errc::snapshot_rejected));
}

TEST_CASE_FIXTURE(device_fixture, "a step built ahead verifies the drafts the step before it "
                                  "proposed, from where that step left the cache") {
  // Overlapped speculation: every step after the first is sent before the one before it is
  // answered; its rows feed what that step draws and verify what it proposes (feed_drawn), at
  // a position only the device knows (the builder's is a lower bound). On the uniform model
  // greedy accepts every draft (all id 0) and a seeded draw, uniform at its position, rarely
  // equals a draft: a wrong position shows in the seeded tokens.
  auto p = tiny_params();
  p.model_dir = model_dirs::tiny_uniform();
  auto dev = cpu(std::move(p));
  const auto pr = prompt(20, 5);
  const runtime::sampling greedy_params{.temperature = 0.0};
  const runtime::sampling seeded{.temperature = 1.0, .seed = 3};
  const auto ref = one_by_one(*this, dev, 1, pr, 48, seeded);
  self->send(dev, runtime::device_release{1});
  auto first = [&](std::uint64_t id, runtime::sampling params) {
    auto s = seq(id, 0, pr, true, params);
    s.propose = true;
    return s;
  };
  auto ahead = [&](std::uint64_t id, std::uint64_t lower_bound, std::uint32_t verify,
                   runtime::sampling params) {
    auto s = seq(id, lower_bound, std::vector<std::int32_t>(1 + verify, 0), true, params);
    s.verify = verify;
    s.propose = true;
    s.feed_drawn = true;
    return s;
  };
  constexpr std::uint64_t steps = 10;
  self->send(dev, step({first(2, greedy_params), first(3, seeded)}, 1));
  for (std::uint64_t k = 1; k < steps; ++k)
    self->send(dev, step({ahead(2, pr.size() + k - 1, 5, greedy_params),
                          ahead(3, pr.size() + k - 1, 1 + k % 5, seeded)},
                         k + 1));
  std::vector<std::int32_t> greedy_got, seeded_got;
  for (std::uint64_t k = 0; k < steps; ++k)
    self->receive(
      [&](runtime::device_result& r) {
        CHECK(r.id == k + 1);
        for (const auto& t : r.sampled)
          (t.sequence == 2 ? greedy_got : seeded_got).push_back(t.token);
      },
      [&](caf::error& e) { FAIL(sys.render(e)); });
  // Greedy: one token, then six per step (every draft accepted), all id 0.
  CHECK(greedy_got == std::vector<std::int32_t>(1 + 6 * (steps - 1), 0));
  // Seeded: the tokens of one-token steps.
  REQUIRE(seeded_got.size() >= steps);
  REQUIRE(seeded_got.size() <= ref.size());
  for (std::size_t i = 0; i < seeded_got.size(); ++i) {
    CAPTURE(i);
    CHECK(seeded_got[i] == ref[i].token);
  }
  // A row built ahead verifies no more drafts than the step before proposed (none here).
  auto plain = seq(4, 0, pr);
  REQUIRE(run(dev, step({plain}, 20)));
  auto r = run(dev, step({ahead(4, pr.size(), 2, greedy_params)}, 21));
  REQUIRE_FALSE(r);
  CHECK(runtime::is(r.error(), device_errc::invalid_step));
}
