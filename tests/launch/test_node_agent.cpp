// Tests of cluster/launch/node_agent: what a host's agent agrees to start.
#include "cluster/launch/node_agent.hpp"

#include "runtime/world.hpp"

#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <variant>
#include <vector>

using namespace troupe;
using namespace troupe::cluster;
using namespace std::chrono_literals;

namespace {

struct fixture {
  runtime::world world{runtime::world_options{runtime::world_mode::real, 1, 2, false, nullptr}};
  caf::scoped_actor launcher{world.system()};
  caf::actor agent = spawn_node_agent(world.system(), "h1");
  std::string self_exe = std::filesystem::read_symlink("/proc/self/exe").string();

  ~fixture() { launcher->send_exit(agent, caf::exit_reason::user_shutdown); }

  /// The agent's answer to agent_spawn{argv}: the pid, or the error's text.
  std::variant<std::int32_t, std::string> spawn(std::vector<std::string> argv) {
    std::variant<std::int32_t, std::string> out{std::string("no answer")};
    launcher->request(agent, 5s, agent_spawn{std::move(argv)})
      .receive([&](std::int32_t pid) { out = pid; },
               [&](caf::error& e) { out = world.system().render(e); });
    return out;
  }
};

} // namespace

TEST_CASE_FIXTURE(fixture, "an agent starts its own binary's `node` command and nothing else") {
  for (const auto& argv : std::vector<std::vector<std::string>>{
         {"/bin/sh", "-c", "touch /tmp/troupe-agent-test-should-not-exist"},
         {self_exe, "agent", "--listen", "127.0.0.1:1"},
         {self_exe},
         {"/bin/true", "node"}}) {
    auto r = spawn(argv);
    REQUIRE(std::holds_alternative<std::string>(r));
    CHECK(std::get<std::string>(r).find("the agent starts only `" + self_exe + " node ...`")
          != std::string::npos);
  }
  CHECK_FALSE(std::filesystem::exists("/tmp/troupe-agent-test-should-not-exist"));
  // Its own binary with `node` (this test binary: `--help` makes it print and exit) starts, and
  // its exit is reported to the process that asked.
  auto r = spawn({self_exe, "node", "--help"});
  REQUIRE(std::holds_alternative<std::int32_t>(r));
  const auto pid = std::get<std::int32_t>(r);
  CHECK(pid > 0);
  bool exited = false;
  launcher->receive([&](const agent_exit& e) { exited = e.pid == pid && e.host == "h1"; },
                    caf::after(30s) >> [] {});
  CHECK(exited);
}
