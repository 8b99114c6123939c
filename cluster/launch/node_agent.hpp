// node_agent: starts and watches the processes of a launched cluster on one host.
//
// `troupe launch` supervises processes that may live on other machines. It does not log in
// to them: each host runs `troupe agent`, which publishes a node agent actor through CAF's
// middleman, and the launcher asks it to start processes, to signal them, and hears from it
// when one exits — the same messages whether the agent runs on another host or inside the
// launcher itself (a launch on this host alone spawns its agent in-process). The agent is a
// port: fork/exec is immediate, and the blocking wait for children runs on a reaper thread
// the agent owns, which turns each exit into a message to the process's owner.
//
// Protocol: agent_spawn → the new process's pid (the sender owns it, and receives an
// agent_exit when it ends); agent_signal → ok (a pid the agent did not start, or one that
// has already exited, is an error); agent_signal_rank → the pid of the EP rank process of
// one of those that it signalled; agent_cut → ok, or the error: this host is cut off from
// another host's address for a while (a link fault, net_cut.hpp), and the agent reconnects it
// itself when the time is up (the launcher may be on the other side of the cut); agent_slow →
// ok, or the error: what this host sends to another host's address is slowed for a while (a
// link slowdown, net_shape.hpp), lifted by the agent itself. When the agent stops, it sends
// SIGKILL to the processes it started that are still running and lifts its cuts and
// slowdowns.
#pragma once

#include "cluster/launch/control_directory.hpp"
#include "runtime/transport.hpp"

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace troupe::cluster {

/// Start `argv` (argv[0]: the executable's path on the agent's host) in a process group of its
/// own, with every signal unblocked. Only `troupe node` of the agent's own binary: argv[0]
/// must name the agent's executable (after resolving links) and argv[1] be "node"; anything
/// else is refused (an error), so that a peer cannot run other commands as the agent's user.
struct agent_spawn {
  std::vector<std::string> argv;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_spawn& x) {
  return f(caf::meta::type_name("agent_spawn"), x.argv);
}

/// Send `signal` to process `pid` (one this agent started).
struct agent_signal {
  std::int32_t pid = 0;
  std::int32_t signal = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_signal& x) {
  return f(caf::meta::type_name("agent_signal"), x.pid, x.signal);
}

/// Send `signal` to the `troupe ep-rank` child of process `pid` (one this agent started) that
/// serves rank `rank` of its instance's EP group (ports::find_rank_process) → that child's
/// pid; an error when no child of `pid` serves it (none started yet, or it died).
struct agent_signal_rank {
  std::int32_t pid = 0;
  std::uint32_t rank = 0;
  std::int32_t signal = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_signal_rank& x) {
  return f(caf::meta::type_name("agent_signal_rank"), x.pid, x.rank, x.signal);
}

/// Cut this host off from numeric IP `address` (every packet to and from it dropped) for
/// `milliseconds`; overlapping cuts of one address end with the last.
struct agent_cut {
  std::string address;
  std::int64_t milliseconds = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_cut& x) {
  return f(caf::meta::type_name("agent_cut"), x.address, x.milliseconds);
}

/// Slow what this host sends to numeric IPv4 `address` to its interface's speed divided by
/// `factor` for `milliseconds` (a link slowdown, net_shape.hpp); while slowdowns of one address
/// overlap, the largest factor holds, and the link is back to full speed when the last ends.
struct agent_slow {
  std::string address;
  double factor = 1;
  std::int64_t milliseconds = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_slow& x) {
  return f(caf::meta::type_name("agent_slow"), x.address, x.factor, x.milliseconds);
}

/// Process `pid` on host `host` ended; `status` is waitpid's.
struct agent_exit {
  std::string host;
  std::int32_t pid = 0;
  std::int32_t status = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_exit& x) {
  return f(caf::meta::type_name("agent_exit"), x.host, x.pid, x.status);
}

/// Spawns a node agent for this host, named `host` in its exit notices.
caf::actor spawn_node_agent(caf::actor_system& sys, std::string host);

/// `troupe agent --listen HOST:PORT [--name NAME] [--tls-*]`: publishes a node agent (over
/// mutual TLS with `tls`) and serves until SIGTERM / SIGINT (then its processes are killed).
/// Returns the exit status.
int run_agent_command(const std::string& listen, const std::string& name,
                      const runtime::tls_options& tls, std::ostream& err);

} // namespace troupe::cluster

CAF_BEGIN_TYPE_ID_BLOCK(troupe_launch_agent, caf::id_block::troupe_launch::end)
CAF_ADD_TYPE_ID(troupe_launch_agent, (troupe::cluster::agent_spawn))
CAF_ADD_TYPE_ID(troupe_launch_agent, (troupe::cluster::agent_signal))
CAF_ADD_TYPE_ID(troupe_launch_agent, (troupe::cluster::agent_signal_rank))
CAF_ADD_TYPE_ID(troupe_launch_agent, (troupe::cluster::agent_exit))
CAF_ADD_TYPE_ID(troupe_launch_agent, (troupe::cluster::agent_cut))
CAF_ADD_TYPE_ID(troupe_launch_agent, (troupe::cluster::agent_slow))
CAF_END_TYPE_ID_BLOCK(troupe_launch_agent)
