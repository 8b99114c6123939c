// The simulated world's teardown: messages already sent are handled, so actors shut down and
// give their memory back (a swarm runs thousands of worlds in one process).
#include "runtime/log.hpp"
#include "runtime/world.hpp"

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

using namespace troupe::runtime;
using namespace std::chrono_literals;

namespace {

/// Holds its own handle (a handle cycle, as actors that know each other have) and a token
/// whose lifetime shows whether the state was destroyed.
struct holder_state {
  caf::actor me;
  std::shared_ptr<int> token;
  static inline const char* name = "holder";
};

caf::behavior holder(caf::stateful_actor<holder_state>* self, std::shared_ptr<int> token) {
  self->state.me = caf::actor_cast<caf::actor>(self);
  self->state.token = std::move(token);
  return {[](int) {}};
}

/// Sends itself a tick every second for ever.
caf::behavior periodic(caf::event_based_actor* self) {
  self->delayed_send(self, 1s, 0);
  return {[self](int n) { self->delayed_send(self, 1s, n + 1); }};
}

} // namespace

TEST_CASE("a sim world's teardown handles the kill an actor in a handle cycle was sent") {
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> watch = token;
  {
    world w{world_options{world_mode::sim, 1, 0, false, nullptr}};
    auto a = w.system().spawn(holder, std::move(token));
    w.system().spawn(periodic);
    w.driver().run_for(3s);
    REQUIRE_FALSE(watch.expired()); // alive, held by its own handle
    caf::anon_send_exit(a, caf::exit_reason::kill);
    // The world ends before the driver runs again: the kill is still in the mailbox.
  }
  // Dropped unhandled, the kill would leave the actor and its state alive for ever.
  CHECK(watch.expired());
}

TEST_CASE("a sim world's teardown ends with periodic actors and leaves live ones alone") {
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> watch = token;
  {
    world w{world_options{world_mode::sim, 1, 0, false, nullptr}};
    auto a = w.system().spawn(holder, std::move(token));
    w.system().spawn(periodic);
    w.driver().run_for(3s);
    caf::anon_send(a, 7); // handled at teardown; nothing asks the actor to stop
  }
  // Nothing told the holder to quit: its cycle keeps it (that is the actors' own business).
  CHECK_FALSE(watch.expired());
}

TEST_CASE("log lines carry the virtual time of the world on their own thread") {
  // Two simulated worlds driven on two threads at once (as `troupe swarm --jobs 2` does): each
  // thread's stamp is its own world's virtual time, and a world's end gives its thread back the
  // stamp it had before (wall time here, or an enclosing world's clock).
  auto drive = [](duration d) {
    world w{world_options{.mode = world_mode::sim, .seed = 1}};
    w.system().spawn(periodic);
    w.driver().run_for(d);
    return log::now_stamp();
  };
  std::string a, b;
  std::thread ta([&] { a = drive(7s); });
  std::thread tb([&] { b = drive(90s); });
  ta.join();
  tb.join();
  CHECK(a == "t=7.000000s");
  CHECK(b == "t=90.000000s");

  world outer{world_options{.mode = world_mode::sim, .seed = 2}};
  outer.system().spawn(periodic);
  outer.driver().run_for(3s);
  CHECK(drive(5s) == "t=5.000000s");
  CHECK(log::now_stamp() == "t=3.000000s");
}
