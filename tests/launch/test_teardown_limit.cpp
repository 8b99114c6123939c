// teardown_limit: a stopping node process exits after its limit when an actor never ends, and
// names that actor; a teardown that ends in time is left alone. Each case runs in a forked
// child (the limit calls _exit), whose stderr goes to a pipe.
#include "cluster/launch/teardown_limit.hpp"
#include "runtime/world.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

using namespace troupe;
using namespace std::chrono_literals;

namespace {

runtime::world_options real_world() {
  runtime::world_options o;
  o.mode = runtime::world_mode::real;
  o.threads = 2;
  return o;
}

struct child_result {
  int status = -1;
  std::string err;
};

/// Runs `body` in a forked child with stderr into a pipe; the child exits with `body`'s value
/// unless something ends it first.
template <class F>
child_result in_child(F body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], STDERR_FILENO);
    ::_exit(body());
  }
  ::close(fds[1]);
  child_result r;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    r.err.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int ws = 0;
  REQUIRE(::waitpid(pid, &ws, 0) == pid);
  r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
  return r;
}

} // namespace

TEST_CASE("teardown_limit: an actor that ignores its exit ends the process after the limit") {
  auto r = in_child([] {
    cluster::teardown_limit limit{"troupe node[test]", 300ms};
    runtime::world w{real_world()};
    auto& sys = w.system();
    // Stuck in a call on its own thread, as a port in a library call that does not return.
    auto stubborn = sys.spawn<caf::detached>([](caf::event_based_actor*) -> caf::behavior {
      return {[](int) { std::this_thread::sleep_for(60s); }};
    });
    caf::anon_send(stubborn, 1);
    auto polite = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
      return {[](int x) { return x; }};
    });
    limit.watch(stubborn, "the stubborn actor");
    limit.watch(polite, "the polite actor");
    caf::anon_send_exit(stubborn, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(polite, caf::exit_reason::user_shutdown);
    limit.arm(7);
    return 0;  // the world's end waits for the stubborn actor
  });
  CHECK(r.status == 7);
  CHECK(r.err == "troupe node[test]: still stopping after 300 ms (not ended: the stubborn actor); "
                 "exiting with status 7\n");
}

TEST_CASE("teardown_limit: a teardown within the limit ends with its own status, silently") {
  auto r = in_child([] {
    cluster::teardown_limit limit{"troupe node[test]", 10s};
    runtime::world w{real_world()};
    auto a = w.system().spawn([](caf::event_based_actor*) -> caf::behavior {
      return {[](int x) { return x; }};
    });
    limit.watch(a, "an actor");
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    limit.arm(7);
    return 5;
  });
  CHECK(r.status == 5);
  CHECK(r.err.empty());
}

TEST_CASE("teardown_limit: unarmed, it never ends the process") {
  auto r = in_child([] {
    cluster::teardown_limit limit{"troupe node[test]", 1ms};
    std::this_thread::sleep_for(50ms);
    return 4;
  });
  CHECK(r.status == 4);
  CHECK(r.err.empty());
}
