#include "cluster/launch/node_agent.hpp"

#include "cluster/launch/net_cut.hpp"
#include "cluster/launch/net_shape.hpp"
#include "cluster/serve_setup.hpp"
#include "ports/rank_processes.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <memory>
#include <ostream>
#include <thread>

namespace troupe::cluster {

namespace {

using namespace std::chrono_literals;

/// Waits for the agent's children on a thread of its own and reports each exit to the agent.
class reaper {
public:
  explicit reaper(caf::actor agent)
    : agent_(std::move(agent)), thread_([this] { run(); }) {}
  ~reaper() {
    stop_ = true;
    thread_.join();
  }

private:
  void run() {
    while (!stop_) {
      int status = 0;
      pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        caf::anon_send(agent_, agent_exit{{}, pid, status});
        continue;
      }
      // No child has exited (or there is none): look again shortly. Polling keeps the thread
      // stoppable; 20 ms is far below a process restart's cost.
      std::this_thread::sleep_for(20ms);
    }
  }

  caf::actor agent_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// A cut's time is up (the address); sent by the agent to itself.
using cut_over_atom = caf::atom_constant<caf::atom("cutover")>;
/// A slowdown's time is up (the address, the factor); sent by the agent to itself.
using slow_over_atom = caf::atom_constant<caf::atom("slowover")>;

struct agent_state {
  std::string host;
  /// This process's binary: what the agent starts (as `troupe node`).
  std::filesystem::path executable = std::filesystem::read_symlink("/proc/self/exe");
  /// pid → the actor that started it (receives its agent_exit).
  std::map<std::int32_t, caf::actor> owners;
  std::unique_ptr<reaper> reap;
  /// Addresses this host is cut off from → cuts of it not over yet.
  std::map<std::string, std::uint32_t> cuts;
  /// Addresses this host's traffic to is slowed → the factors of the slowdowns not over yet.
  std::map<std::string, std::multiset<double>> slowdowns;
  link_shaper shaper;
};

/// Slows the traffic to `address` by the largest factor of its slowdowns not over yet, or
/// lifts its slowdown when none is left; says so on stderr.
caf::error reshape(agent_state& st, const std::string& address) {
  const auto prefix = "troupe agent[" + st.host + "]: ";
  auto it = st.slowdowns.find(address);
  if (it == st.slowdowns.end() || it->second.empty()) {
    st.slowdowns.erase(address);
    auto e = st.shaper.lift(address);
    std::cerr << prefix
              << (e ? runtime::error_text(e) : "traffic to " + address + " at full speed again")
              << "\n";
    return e;
  }
  const double factor = *it->second.rbegin();
  auto bits = st.shaper.slow(address, factor);
  if (!bits) {
    std::cerr << prefix << runtime::error_text(bits.error()) << "\n";
    return bits.error();
  }
  std::cerr << prefix << "traffic to " << address << " slowed " << factor << "x, to "
            << static_cast<double>(*bits) / 1e6 << " Mbit/s\n";
  return {};
}

} // namespace

caf::actor spawn_node_agent(caf::actor_system& sys, std::string host) {
  return sys.spawn([host](caf::event_based_actor* self) -> caf::behavior {
    // Shared with the exit functor, which runs after the behavior is gone.
    auto st = std::make_shared<agent_state>();
    st->host = host;
    st->reap = std::make_unique<reaper>(caf::actor_cast<caf::actor>(self));
    self->attach_functor([st] {
      for (auto& [pid, owner] : st->owners)
        kill(pid, SIGKILL);
      st->owners.clear();
      st->reap.reset();
      for (auto& [address, n] : st->cuts)
        set_cut_off(address, false);
      st->shaper.lift_all();
    });
    return {
      [self, st](agent_spawn& s) -> caf::result<std::int32_t> {
        if (s.argv.empty())
          return caf::make_error(caf::sec::invalid_argument, "agent_spawn: empty argv");
        // Only a cluster process of this agent's own binary: a peer of the cluster's CA runs
        // `troupe node`, not any command, as the agent's user (docs/tls.md).
        std::error_code ec;
        if (s.argv.size() < 2 || s.argv[1] != "node"
            || std::filesystem::weakly_canonical(s.argv[0], ec) != st->executable) {
          std::cerr << "troupe agent[" << st->host << "]: refused to start '" << s.argv[0]
                    << (s.argv.size() > 1 ? " " + s.argv[1] : std::string{}) << " ...'\n";
          return caf::make_error(caf::sec::invalid_argument,
                                 "agent_spawn: the agent starts only `" + st->executable.string()
                                   + " node ...` (its own binary), not '" + s.argv[0]
                                   + (s.argv.size() > 1 ? " " + s.argv[1] : std::string{})
                                   + " ...'");
        }
        std::vector<char*> argv;
        for (auto& a : s.argv)
          argv.push_back(a.data());
        argv.push_back(nullptr);
        pid_t pid = fork();
        if (pid < 0)
          return caf::make_error(caf::sec::runtime_error,
                                 std::string("fork: ") + std::strerror(errno));
        if (pid == 0) {
          // The child: only async-signal-safe calls until exec.
          setpgid(0, 0);
          sigset_t none;
          sigemptyset(&none);
          sigprocmask(SIG_SETMASK, &none, nullptr);
          execv(argv[0], argv.data());
          const char msg[] = "troupe agent: cannot exec the node\n";
          [[maybe_unused]] auto n = write(2, msg, sizeof msg - 1);
          _exit(127);
        }
        st->owners[pid] = caf::actor_cast<caf::actor>(self->current_sender());
        return static_cast<std::int32_t>(pid);
      },
      [st](const agent_signal& s) -> caf::result<caf::ok_atom> {
        if (st->owners.count(s.pid) == 0)
          return caf::make_error(caf::sec::invalid_argument,
                                 "agent_signal: no running process " + std::to_string(s.pid));
        if (kill(s.pid, s.signal) != 0)
          return caf::make_error(caf::sec::runtime_error,
                                 std::string("kill: ") + std::strerror(errno));
        return caf::ok_atom::value;
      },
      [st](const agent_signal_rank& s) -> caf::result<std::int32_t> {
        if (st->owners.count(s.pid) == 0)
          return caf::make_error(caf::sec::invalid_argument,
                                 "agent_signal_rank: no running process " + std::to_string(s.pid));
        auto child = ports::find_rank_process(s.pid, s.rank);
        if (!child)
          return caf::make_error(caf::sec::invalid_argument,
                                 "no rank process of " + std::to_string(s.pid) + " serves rank "
                                   + std::to_string(s.rank));
        if (kill(*child, s.signal) != 0)
          return caf::make_error(caf::sec::runtime_error,
                                 std::string("kill: ") + std::strerror(errno));
        return static_cast<std::int32_t>(*child);
      },
      [self, st](const agent_cut& c) -> caf::result<caf::ok_atom> {
        const auto prefix = "troupe agent[" + st->host + "]: ";
        if (st->cuts[c.address]++ == 0)
          if (auto e = set_cut_off(c.address, true)) {
            st->cuts.erase(c.address);
            std::cerr << prefix << runtime::error_text(e) << "\n";
            return e;
          }
        std::cerr << prefix << "cut off from " << c.address << " for " << c.milliseconds
                  << " ms\n";
        const auto ms = std::max<std::int64_t>(0, c.milliseconds);
        self->delayed_send(self, std::chrono::milliseconds(ms), cut_over_atom::value, c.address);
        return caf::ok_atom::value;
      },
      [st](cut_over_atom, const std::string& address) {
        auto it = st->cuts.find(address);
        if (it == st->cuts.end() || --it->second > 0)
          return;
        st->cuts.erase(it);
        const auto prefix = "troupe agent[" + st->host + "]: ";
        if (auto e = set_cut_off(address, false))
          std::cerr << prefix << runtime::error_text(e) << "\n";
        else
          std::cerr << prefix << "reconnected to " << address << "\n";
      },
      [self, st](const agent_slow& s) -> caf::result<caf::ok_atom> {
        auto& factors = st->slowdowns[s.address];
        auto mine = factors.insert(s.factor);
        if (auto e = reshape(*st, s.address)) {
          factors.erase(mine);
          if (factors.empty())
            st->slowdowns.erase(s.address);
          return e;
        }
        const auto ms = std::max<std::int64_t>(0, s.milliseconds);
        self->delayed_send(self, std::chrono::milliseconds(ms), slow_over_atom::value, s.address,
                           s.factor);
        return caf::ok_atom::value;
      },
      [st](slow_over_atom, const std::string& address, double factor) {
        auto it = st->slowdowns.find(address);
        if (it == st->slowdowns.end())
          return;
        if (auto f = it->second.find(factor); f != it->second.end())
          it->second.erase(f);
        reshape(*st, address);
      },
      [self, st](agent_exit& e) {
        auto it = st->owners.find(e.pid);
        if (it == st->owners.end())
          return;  // not one of ours (or reported already)
        e.host = st->host;
        if (it->second)
          self->send(it->second, std::move(e));
        st->owners.erase(it);
      },
    };
  });
}

int run_agent_command(const std::string& listen, const std::string& name,
                      const runtime::tls_options& tls, std::ostream& err) {
  auto addr = parse_host_port(listen);
  if (!addr)
    return err << "troupe agent: --listen '" << listen << "': expected HOST:PORT\n", 1;
  if (tls.enabled())
    if (auto e = runtime::check_tls(tls))
      return err << "troupe agent: TLS: " << runtime::error_text(e) << "\n", 1;
  block_stop_signals();
  runtime::world w{real_world_options(true, tls)};
  auto& sys = w.system();
  auto agent = spawn_node_agent(sys, name.empty() ? addr->first : name);
  auto port = runtime::publish_actor(sys, agent, addr->second, addr->first, true);
  if (!port) {
    caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
    err << "troupe agent: cannot listen on " << listen << ": " << runtime::error_text(port.error())
        << "\n";
    return 1;
  }
  err << "troupe agent: listening on " << addr->first << ":" << *port << "\n";
  wait_for_stop_signal();
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
  err << "troupe agent: stopped\n";
  return 0;
}

} // namespace troupe::cluster
