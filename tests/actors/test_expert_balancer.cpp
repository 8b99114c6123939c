// The expert balancer (actors/lb/expert_balancer.hpp) on the deterministic scheduler: it places
// at start from the load of that instant and publishes at once, then every interval re-places by
// the load over the last window and publishes after the ranks' load time; its counters; bad
// parameters make it exit with the reason.
#include "actors/lb/expert_balancer.hpp"
#include "actors/type_ids.hpp"
#include "runtime/world.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

struct published {
  runtime::time_point at;
  std::vector<double> load;
  expert_placement placement;
};

/// 8 experts over 4 ranks with 3 slots each; the hot expert is expert 0 until 90 s, then 5.
expert_balancer_params params(runtime::time_point origin,
                              std::shared_ptr<std::vector<published>> out,
                              std::shared_ptr<std::vector<std::pair<double, double>>> asked,
                              const runtime::world& w) {
  expert_balancer_params p;
  p.ranks = 4;
  p.slots_per_rank = 3;
  p.interval = 60s;
  p.window = 60s;
  p.load_time = 10s;
  p.load = [origin, asked](runtime::time_point from, runtime::time_point to) {
    asked->emplace_back(runtime::to_seconds(from - origin), runtime::to_seconds(to - origin));
    std::vector<double> load(8, 1.0);
    load[to - origin > 90s ? 5 : 0] = 20.0;
    return load;
  };
  p.publish = [out, &w](const std::vector<double>& load, const expert_placement& placement) {
    out->push_back({w.now(), load, placement});
  };
  return p;
}

/// The balancer's counters (lb_stats_atom), asked on the deterministic scheduler.
lb_counters counters_of(runtime::world& w, const expert_balancer_actor& balancer) {
  auto counters = std::make_shared<std::optional<lb_counters>>();
  w.system().spawn([balancer, counters](caf::event_based_actor* self) {
    self->request(balancer, caf::infinite, lb_stats_atom::value)
      .then([counters](lb_counters& c) { *counters = std::move(c); });
  });
  w.driver().run_for(0s);
  REQUIRE(counters->has_value());
  return **counters;
}

} // namespace

TEST_CASE("the expert balancer re-places by the recent load and switches after the load time") {
  runtime::world w{runtime::world_options{runtime::world_mode::sim, 1, 0, false,
                                          register_actor_types}};
  const auto origin = w.now();
  auto out = std::make_shared<std::vector<published>>();
  auto asked = std::make_shared<std::vector<std::pair<double, double>>>();
  auto balancer = spawn_expert_balancer(w.system(), params(origin, out, asked, w));
  w.driver().run_until(origin + 150s);
  // At start: the load of that instant, published at once; expert 0 (hot) gets the copies.
  REQUIRE(out->size() >= 2);
  CHECK((*out)[0].at == origin);
  CHECK(asked->at(0) == std::pair{0.0, 0.0});
  CHECK((*out)[0].placement.copies[0] == 5);  // 4 spare slots, all to the one hot expert
  // At 60 s over [0, 60): still expert 0, published at 70 s. At 120 s over [60, 120): expert 5
  // is hot now, published at 130 s.
  CHECK(asked->at(1) == std::pair{0.0, 60.0});
  CHECK(runtime::to_seconds((*out)[1].at - origin) == doctest::Approx(70.0));
  CHECK(asked->at(2) == std::pair{60.0, 120.0});
  REQUIRE(out->size() == 3);
  CHECK(runtime::to_seconds((*out)[2].at - origin) == doctest::Approx(130.0));
  CHECK((*out)[2].placement.copies[5] == 5);
  CHECK((*out)[2].placement.copies[0] == 1);
  // Every copy of the hot expert on a different rank: 5 copies over 4 ranks, 2 on one.
  std::vector<int> holders(4, 0);
  for (std::uint32_t r = 0; r < 4; ++r)
    holders[r] = static_cast<int>(std::count((*out)[2].placement.slots[r].begin(),
                                             (*out)[2].placement.slots[r].end(), 5u));
  CHECK(*std::min_element(holders.begin(), holders.end()) >= 1);
  // Its counters.
  const auto counters = counters_of(w, balancer);
  CHECK(counters.lb == "expert");
  CHECK(counters.values.at(0) == 3);  // computed
  CHECK(counters.values.at(1) == 3);  // published
  caf::anon_send_exit(balancer, caf::exit_reason::user_shutdown);
}

TEST_CASE("an expert balancer whose placement cannot exist exits with the reason") {
  runtime::world w{runtime::world_options{runtime::world_mode::sim, 1, 0, false,
                                          register_actor_types}};
  auto out = std::make_shared<std::vector<published>>();
  auto asked = std::make_shared<std::vector<std::pair<double, double>>>();
  auto p = params(w.now(), out, asked, w);
  p.slots_per_rank = 1;  // 4 slots for 8 experts
  auto balancer = spawn_expert_balancer(w.system(), std::move(p));
  auto reason = std::make_shared<caf::error>();
  auto downs = std::make_shared<int>(0);
  // (It keeps a behavior, so that it lives to receive the down message.)
  w.system().spawn([balancer, reason, downs](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(balancer);
    self->set_down_handler([reason, downs](caf::down_msg& m) { *reason = m.reason; ++*downs; });
    return {[](int) {}};
  });
  w.driver().run_for(1s);
  CHECK(out->empty());
  CHECK(*downs == 1);
  REQUIRE(*reason);
  CHECK(w.system().render(*reason).find("4 slots for 8 experts") != std::string::npos);
}

TEST_CASE("windows in which no token was routed leave the placement as it is") {
  runtime::world w{runtime::world_options{runtime::world_mode::sim, 1, 0, false,
                                          register_actor_types}};
  const auto origin = w.now();
  auto out = std::make_shared<std::vector<published>>();
  auto asked = std::make_shared<std::vector<std::pair<double, double>>>();
  auto p = params(origin, out, asked, w);
  // An idle server until 100 s (the real world's counts), then expert 5 is hot.
  p.load = [origin](runtime::time_point, runtime::time_point to) {
    std::vector<double> load(8, 0.0);
    if (to - origin > 100s) {
      std::fill(load.begin(), load.end(), 1.0);
      load[5] = 20.0;
    }
    return load;
  };
  auto balancer = spawn_expert_balancer(w.system(), std::move(p));
  w.driver().run_until(origin + 150s);
  // Nothing at start nor at 60 s; at 120 s the load, published at 130 s.
  REQUIRE(out->size() == 1);
  CHECK(runtime::to_seconds((*out)[0].at - origin) == doctest::Approx(130.0));
  CHECK((*out)[0].placement.copies[5] == 5);
  const auto counters = counters_of(w, balancer);
  CHECK(counters.names.at(2) == "windows_idle");
  CHECK(counters.values.at(2) == 2);
  caf::anon_send_exit(balancer, caf::exit_reason::user_shutdown);
}

TEST_CASE("a balancer's placement becomes the EP dispatch plans' placement") {
  std::vector<double> load(8, 1.0);
  load[5] = 20.0;
  auto placed = place_experts({load, 4, 3});
  const auto& p = std::get<expert_placement>(placed);
  const auto d = dispatch_placement(p);
  CHECK(d.experts == 8);
  CHECK(d.ranks == 4);
  for (std::int32_t r = 0; r < 4; ++r)
    CHECK(d.local[std::size_t(r)]
          == std::vector<std::int32_t>(p.slots[std::size_t(r)].begin(), p.slots[std::size_t(r)].end()));
  for (std::int32_t e = 0; e < 8; ++e) {
    CAPTURE(e);
    const auto& homes = d.homes[std::size_t(e)];
    REQUIRE_FALSE(homes.empty());
    CHECK(std::is_sorted(homes.begin(), homes.end()));
    CHECK(std::adjacent_find(homes.begin(), homes.end()) == homes.end());
    for (auto r : homes)
      CHECK(d.slot_of(r, e) >= 0);
    // Every rank holding e is a home.
    for (std::int32_t r = 0; r < 4; ++r)
      CHECK((d.slot_of(r, e) >= 0) == (std::find(homes.begin(), homes.end(), r) != homes.end()));
  }
  // Expert 5's five copies over four ranks: four homes (one rank holds it twice).
  CHECK(d.homes[5].size() == 4);
}
