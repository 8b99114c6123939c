#include "cluster/launch/launch_command.hpp"

#include "cluster/autoscaling.hpp"
#include "cluster/launch/node_agent.hpp"
#include "cluster/launch/real_faults.hpp"
#include "cluster/launch/slurm_launch.hpp"
#include "cluster/serve_setup.hpp"
#include "cluster/sim/expert_placement.hpp"
#include "cluster/sim/fault_plan.hpp"
#include "cluster/sim/result.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

namespace troupe::cluster {

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

/// A lost host's agent answers again (sent by the launcher's reconnect thread).
using agent_back_atom = caf::atom_constant<caf::atom("agentback")>;

/// A free TCP port on `host` (bound and released: another process may take it first, which
/// the control process then reports as a failed publish).
std::optional<std::uint16_t> free_port(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "0", &hints, &res) != 0 || res == nullptr)
    return std::nullopt;
  std::optional<std::uint16_t> port;
  int fd = socket(res->ai_family, SOCK_STREAM, 0);
  if (fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port = ntohs(addr.ss_family == AF_INET6
                     ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                     : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  if (fd >= 0)
    close(fd);
  freeaddrinfo(res);
  return port;
}

std::string join_host_port(const std::string& host, std::uint16_t port) {
  auto h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789-_./:=@,+") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return std::string("killed by SIG") + (name != nullptr ? name : std::to_string(WTERMSIG(status)));
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

/// Whether host `h` of `hosts` takes `role`: it lists it; the store, when no host lists it,
/// runs where the control process may.
bool takes_role(const launch_host& h, const std::string& role,
                const std::vector<launch_host>& hosts) {
  if (role == "fetcher")  // a prefill instance's, on its host
    return takes_role(h, "prefill", hosts);
  auto lists = [](const launch_host& x, const std::string& r) {
    return std::find(x.roles.begin(), x.roles.end(), r) != x.roles.end();
  };
  if (role == "store"
      && std::none_of(hosts.begin(), hosts.end(), [&](const auto& x) { return lists(x, role); }))
    return lists(h, "control");
  return lists(h, role);
}

/// SIGHUP is the launcher's "read the hosts file again" (reload_hosts): blocked in every
/// thread started from then on and taken without waiting, or noted by a handler when it
/// reaches a thread that does not block it (a library's, started earlier).
volatile std::sig_atomic_t caught_reload = 0;

extern "C" void note_reload_signal(int) { caught_reload = 1; }

void block_reload_signal() {
  struct sigaction sa {};
  sa.sa_handler = note_reload_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGHUP, &sa, nullptr);
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &hup, nullptr);
}

bool poll_reload_signal() {
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  timespec now{0, 0};
  bool taken = sigtimedwait(&hup, nullptr, &now) == SIGHUP;
  if (caught_reload != 0) {
    caught_reload = 0;
    taken = true;
  }
  return taken;
}

struct process_state {
  launch_process spec;
  /// The host (its agent) the process runs on, and its pid there (0: not running).
  std::string host;
  std::int32_t pid = 0;
  std::uint32_t restarts = 0;
  /// starting | running | restarting | stopped | down | exited | failed | lost
  std::string state = "starting";
  std::optional<clock::time_point> restart_at;
  /// Killed by a fault: not restarted until the fault releases it.
  bool held = false;
  /// Killed by the launcher to join the control process on its new host: restarted at once,
  /// not counted against the restart intensity.
  bool rejoin = false;
  /// Stopped on the autoscaler's order: removed once it exited, not restarted.
  bool retiring = false;
  /// Stopped because its host left the hosts file (or no longer takes its role): restarted
  /// on another host once it exited, not counted against the restart intensity.
  bool evacuating = false;
  /// Between hosts for that reason: from its stop there until it runs on the other. The
  /// autoscaler's orders of its role wait meanwhile (its pool is short only until it is back).
  bool moving = false;
  /// An instance of several GPUs: those a fault plan failed, and the EP size its command line
  /// forms on the others (its next start's; 0: none can form). Killed to re-form: restarted
  /// at once, not counted against the restart intensity.
  std::set<std::uint32_t> failed_gpus;
  std::uint32_t ep = 0;
  bool reforming = false;
  /// The failed GPUs when the running process started (its group's rank r runs on the r-th
  /// of the others), and the EP size it re-formed to after losing rank processes, as it
  /// reported (0: none lost).
  std::set<std::uint32_t> started_failed;
  std::uint32_t ep_now = 0;
};

/// An order of the autoscaler in the control process (launched_pools.hpp).
struct scale_order {
  bool start = true;
  std::string role;
  std::uint32_t index = 0;
};

/// The instance's `--gpus`: its healthy GPUs of `configured`, the flag removed when all are.
void set_gpus(std::vector<std::string>& argv, const std::vector<std::uint32_t>& healthy,
              std::uint32_t configured) {
  auto f = std::find(argv.begin(), argv.end(), "--gpus");
  if (f != argv.end())
    argv.erase(f, std::min(f + 2, argv.end()));
  if (healthy.size() == configured)
    return;
  std::string list;
  for (auto g : healthy)
    list += (list.empty() ? "" : ",") + std::to_string(g);
  argv.insert(argv.end(), {"--gpus", list});
}

/// Sets the value after `flag` in `argv`, if the flag is there.
void set_arg(std::vector<std::string>& argv, const std::string& flag, const std::string& value) {
  auto f = std::find(argv.begin(), argv.end(), flag);
  if (f != argv.end() && std::next(f) != argv.end())
    *std::next(f) = value;
}

class launcher {
public:
  /// `models`: a process of each instance role (prefill, decode, fetcher when the cluster
  /// runs them) with index 0, whose command line an instance the autoscaler orders takes.
  launcher(caf::actor_system& sys, std::map<std::string, caf::actor> agents,
           std::vector<launch_host> hosts, const launch_options& o,
           std::vector<launch_process> plan, std::vector<launch_process> models,
           std::string control, std::string listen_host,
           std::string ready_file, std::vector<process_action> faults, std::ostream& err)
    : self_(sys), agents_(std::move(agents)), hosts_(std::move(hosts)), o_(o),
      models_(std::move(models)), control_(std::move(control)),
      listen_host_(std::move(listen_host)), ready_file_(std::move(ready_file)),
      faults_(std::move(faults)), err_(err) {
    for (auto& [host, agent] : agents_)
      self_->monitor(agent);
    if (!o_.events_file.empty())
      events_.open(o_.events_file, std::ios::app);
    for (auto& p : plan) {
      process_state st;
      st.host = p.host;
      st.spec = std::move(p);
      procs_.push_back(std::move(st));
    }
  }

  ~launcher() {
    stopping_->store(true);
    for (auto& t : reconnects_)
      t.join();
  }

  int run() {
    for (auto& p : procs_)
      if (!start(p))
        return stop_all(1);
    write_state();
    for (;;) {
      std::optional<agent_exit> exited;
      std::optional<std::string> lost;
      std::optional<std::pair<std::string, caf::actor>> back;
      std::optional<scale_order> order;
      self_->receive([&](agent_exit& e) { exited = std::move(e); },
                     [&](reformed_atom, const std::string& name, std::int32_t pid,
                         std::uint32_t ranks) { reformed(name, pid, ranks); },
                     [&](caf::down_msg& d) { lost = host_of(d.source); },
                     [&](agent_back_atom, std::string& host, caf::actor& agent) {
                       back.emplace(std::move(host), std::move(agent));
                     },
                     [&](scale_start_atom, std::string& role, std::uint32_t index) {
                       order = scale_order{true, std::move(role), index};
                     },
                     [&](scale_stop_atom, std::string& role, std::uint32_t index) {
                       order = scale_order{false, std::move(role), index};
                     },
                     caf::after(next_wait()) >> [] {});
      if (back)
        if (int status = host_back(back->first, std::move(back->second)); status >= 0)
          return stop_all(status);
      if (poll_reload_signal())
        reload_hosts();
      if (int sig = poll_stop_signal(std::chrono::milliseconds(0)); sig != 0) {
        err_ << "troupe launch: " << signal_name(sig)
             << ": stopping the cluster (instances drain first)\n";
        return stop_all(0);
      }
      if (lost && agents_.count(*lost) != 0)  // (not a stale agent's second notice)
        if (int status = lose_host(*lost); status >= 0)
          return stop_all(status);
      if (exited)
        if (int status = on_exit(*exited); status >= 0)
          return stop_all(status);
      for (auto& p : procs_)
        if (p.restart_at && clock::now() >= *p.restart_at) {
          p.restart_at.reset();
          if (!start(p))
            return stop_all(1);
          write_state();
        }
      if (order)
        order->start ? scale_up(order->role, order->index)
                     : scale_down(order->role, order->index);
      check_ready();
      register_with_control();
      run_faults();
    }
  }

private:
  /// How long the loop may sleep: 200 ms, less when a fault action is due sooner.
  std::chrono::milliseconds next_wait() const {
    std::chrono::milliseconds wait = 200ms;
    if (serving_since_ && next_fault_ < faults_.size()) {
      auto due = *serving_since_ + faults_[next_fault_].at - clock::now();
      wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(due), 1ms, wait);
    }
    return wait;
  }

  void event(const std::string& what, const process_state& p, nlohmann::json extra = {}) {
    if (!events_.is_open())
      return;
    nlohmann::json j{{"t", std::chrono::duration<double>(clock::now() - started_).count()},
                     {"event", what}, {"process", p.spec.name}, {"pid", p.pid}};
    for (auto& [k, v] : extra.items())
      j[k] = v;
    events_ << j.dump() << "\n" << std::flush;
  }

  /// Carries out the fault actions that are due (times count from serving).
  void run_faults() {
    if (!serving_since_)
      return;
    bool changed = false;
    while (next_fault_ < faults_.size()
           && clock::now() >= *serving_since_ + faults_[next_fault_].at) {
      const auto& a = faults_[next_fault_++];
      auto it = std::find_if(procs_.begin(), procs_.end(),
                             [&](const process_state& p) { return p.spec.name == a.process; });
      if (it == procs_.end())
        continue;
      auto& p = *it;
      switch (a.kind) {
        case process_action_kind::kill:
          p.held = true;
          p.restart_at.reset();
          signal(p, SIGKILL);
          break;
        case process_action_kind::release:
          if (p.held) {
            p.held = false;
            if (p.pid == 0 && p.state == "down")
              p.restart_at = clock::now();
          }
          break;
        case process_action_kind::stop:
        case process_action_kind::resume: {
          const bool stop = a.kind == process_action_kind::stop;
          if (p.pid == 0)
            break;
          // A GPU's rank in a rank process stops alone; one the group does not use, nothing.
          // (A process stopped whole, its rank process not found then, resumes whole.)
          const auto at = a.configured > 1 && (stop || p.state != "stopped") ? place_of(p, a)
                                                                           : gpu_place{};
          if (at.home == gpu_home::unused)
            continue;
          if (at.home == gpu_home::rank_process) {
            if (auto child = signal_rank(p, at.rank, stop ? SIGSTOP : SIGCONT)) {
              event("fault", p, {{"action", to_string(a.kind)}, {"fault", a.fault},
                                 {"gpu", a.gpu}, {"rank_process", *child}});
              continue;
            }
          }
          signal(p, stop ? SIGSTOP : SIGCONT);
          p.state = stop ? "stopped" : "running";
          break;
        }
        case process_action_kind::term:
          signal(p, SIGTERM);
          break;
        case process_action_kind::cut:
        case process_action_kind::slow:
          link_fault(p, a);
          continue;
        case process_action_kind::fail_gpu:
        case process_action_kind::heal_gpu:
          gpu_fault(p, a);
          continue;
      }
      // The duty cycle of a slowdown is too chatty for the terminal; the log has it all.
      if (a.kind != process_action_kind::stop && a.kind != process_action_kind::resume)
        err_ << "troupe launch: fault " << a.fault << ": " << to_string(a.kind) << " "
             << p.spec.name << "\n";
      event("fault", p, {{"action", to_string(a.kind)}, {"fault", a.fault}});
      changed = true;
    }
    if (changed)
      write_state();
  }

  /// A GPU of `p`'s instance fails or recovers: the instance's next start runs on its healthy
  /// GPUs (`--gpus`, the EP resize rule of sim::resized_ep). A failure kills the process, which
  /// restarts at once when those GPUs form an EP group and is held down otherwise; a recovery
  /// restarts a process held down once they do.
  void gpu_fault(process_state& p, const process_action& a) {
    if (a.kind == process_action_kind::fail_gpu)
      p.failed_gpus.insert(a.gpu);
    else
      p.failed_gpus.erase(a.gpu);
    std::vector<std::uint32_t> healthy;
    for (std::uint32_t g = 0; g < a.configured; ++g)
      if (!p.failed_gpus.contains(g))
        healthy.push_back(g);
    // (The topology check keeps gpus_per_instance within the model's experts: no limit here.)
    const auto size = sim::resized_ep(a.configured, static_cast<std::uint32_t>(healthy.size()), 0);
    set_gpus(p.spec.argv, healthy, a.configured);
    err_ << "troupe launch: fault " << a.fault << ": gpu " << a.gpu << " of " << p.spec.name
         << (a.kind == process_action_kind::fail_gpu ? " failed" : " recovered") << "; "
         << healthy.size() << " of " << a.configured << " healthy";
    nlohmann::json done{{"action", to_string(a.kind)}, {"fault", a.fault}, {"gpu", a.gpu},
                        {"healthy_gpus", healthy}, {"ep", size}};
    if (a.kind == process_action_kind::fail_gpu && size > 0 && p.pid != 0
        && p.state == "running") {
      // The running group's rank on that GPU: none (the GPU is not in it), one of its
      // process's threads, or one of its rank processes, which alone goes (none found: its
      // group is still starting them; the whole process goes, below).
      const auto at = place_of(p, a);
      if (at.home == gpu_home::unused) {
        err_ << "; its running EP group of " << at.running << " does not use it\n";
        p.ep = size;
        event("fault", p, done);
        write_state();
        return;
      }
      if (at.home == gpu_home::rank_process)
        if (auto child = signal_rank(p, at.rank, SIGKILL)) {
          err_ << ", the process of its rank " << at.rank << " (pid " << *child
               << ") is killed: the instance re-forms on the ranks left\n";
          p.ep = size;
          done["rank_process"] = *child;
          event("fault", p, done);
          write_state();
          return;
        }
    }
    if (a.kind == process_action_kind::fail_gpu && size > 0) {
      // Running: killed, and its exit restarts it. Restarting already: it starts with the
      // new --gpus.
      p.reforming = p.pid != 0;
      signal(p, SIGKILL);
      err_ << ", it re-forms as an EP group of " << size << "\n";
    } else if (a.kind == process_action_kind::fail_gpu) {
      p.held = true;
      p.reforming = false;
      p.restart_at.reset();
      signal(p, SIGKILL);
      err_ << ", too few for an EP group (" << (a.configured + 1) / 2
           << " needed): down until enough recover\n";
    } else if (p.held && size > 0) {
      p.held = false;
      if (p.pid != 0)
        p.reforming = true;  // killed, its exit not seen yet: restarted when it is
      else if (p.state == "down")
        p.restart_at = clock::now();
      err_ << ", it re-forms as an EP group of " << size << "\n";
    } else {
      err_ << (p.pid != 0 ? ", regained at its next restart\n" : "\n");
    }
    p.ep = size;
    event("fault", p, done);
    write_state();
  }

  enum class gpu_home { process, rank_process, unused };
  struct gpu_place {
    gpu_home home = gpu_home::process;
    /// Its rank in the running group, and the group's size.
    std::uint32_t rank = 0;
    std::uint32_t running = 0;
  };

  /// Where GPU a.gpu of running process `p`'s instance (a.configured GPUs) runs now: as rank r
  /// of its group (the r-th of the GPUs healthy when it started, below the group's size: its
  /// EP size then, or the one it re-formed to), a thread of the process or one of its rank
  /// processes (r >= a.ranks_per_process); or not in the group.
  gpu_place place_of(const process_state& p, const process_action& a) const {
    std::optional<std::uint32_t> rank;
    std::uint32_t healthy = 0;
    for (std::uint32_t g = 0; g < a.configured; ++g)
      if (!p.started_failed.contains(g)) {
        if (g == a.gpu)
          rank = healthy;
        ++healthy;
      }
    gpu_place at;
    at.running = p.ep_now > 0 ? p.ep_now : sim::resized_ep(a.configured, healthy, 0);
    if (!rank || *rank >= at.running) {
      at.home = gpu_home::unused;
      return at;
    }
    at.rank = *rank;
    if (a.ranks_per_process > 0 && *rank >= a.ranks_per_process)
      at.home = gpu_home::rank_process;
    return at;
  }

  /// Sends `sig` to the rank process of `p` that serves rank `rank` (its host's agent finds
  /// it); returns its pid, or none when there is no such process (or no agent).
  std::optional<std::int32_t> signal_rank(const process_state& p, std::uint32_t rank, int sig) {
    auto agent = agents_.find(p.host);
    if (agent == agents_.end())
      return std::nullopt;
    std::optional<std::int32_t> child;
    self_->request(agent->second, 5s, agent_signal_rank{p.pid, rank, sig})
      .receive([&](std::int32_t pid) { child = pid; }, [](const caf::error&) {});
    return child;
  }

  /// Instance process `name` (process `pid`) lost rank processes and re-formed on `ranks`
  /// ranks (its report through the control process; one of an earlier process is stale).
  void reformed(const std::string& name, std::int32_t pid, std::uint32_t ranks) {
    auto* p = find_named(name);
    if (p == nullptr || p->pid != pid || p->ep_now == ranks)
      return;
    p->ep_now = ranks;
    err_ << "troupe launch: " << name << " lost EP rank processes and re-formed as an EP group of "
         << ranks << " (until its next restart)\n";
    event("reform", *p, {{"ep", ranks}});
    write_state();
  }

  /// A link fault between `p` and the process `a.peer`, once per fault and pair of hosts: a
  /// partition (the agent of the peer's host cuts that host off from `p`'s host for the cut's
  /// length) or a slowdown (the agents of both hosts slow what they send to each other).
  void link_fault(const process_state& p, const process_action& a) {
    auto q = std::find_if(procs_.begin(), procs_.end(),
                          [&](const process_state& x) { return x.spec.name == a.peer; });
    if (q == procs_.end())
      return;
    auto hosts = std::minmax(p.host, q->host);
    if (!link_faults_.insert({a.fault, hosts.first, hosts.second}).second)
      return;
    const bool cut = a.kind == process_action_kind::cut;
    const auto head = "troupe launch: fault " + std::to_string(a.fault) + ": ";
    const auto ends = " (" + p.spec.name + " <-> " + q->spec.name + ")";
    const std::string not_done = cut ? "not cut: " : "not slowed: ";
    if (p.host == q->host) {
      err_ << head << not_done << "both ends run on host " << p.host << ends << "\n";
      return;
    }
    // The hosts whose agents act (the peer's; for a slowdown both), each with the other end's
    // host, then with that host's address.
    std::vector<std::pair<std::string, std::string>> ends_of{{q->host, p.host}};
    if (!cut)
      ends_of.emplace_back(p.host, q->host);
    std::vector<std::pair<std::string, std::string>> acting;
    for (const auto& [host, other] : ends_of) {
      if (agents_.count(host) == 0) {
        err_ << head << not_done << "the agent of host " << host << " is lost" << ends << "\n";
        return;
      }
      auto address = host_address(other);
      if (!address) {
        err_ << head << not_done << address.error() << ends << "\n";
        return;
      }
      acting.emplace_back(host, *address);
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(a.length).count();
    for (const auto& [host, address] : acting)
      if (cut)
        caf::anon_send(agents_.at(host), agent_cut{address, ms});
      else
        caf::anon_send(agents_.at(host), agent_slow{address, a.factor, ms});
    err_ << head << (cut ? "cut " : "slowed ") << p.host << " <-> " << q->host;
    if (!cut)
      err_ << " " << a.factor << "x";
    err_ << " for " << ms / 1000.0 << " s" << ends << "\n";
    nlohmann::json extra{{"action", cut ? "cut" : "slow"}, {"fault", a.fault},
                         {"peer", q->spec.name}, {"hosts", {p.host, q->host}},
                         {"seconds", ms / 1000.0}};
    if (!cut)
      extra["factor"] = a.factor;
    event("fault", p, std::move(extra));
  }

  /// The numeric IP address by which the other hosts reach `host` (its agent's).
  sim::result<std::string> host_address(const std::string& host) const {
    using failure = sim::result<std::string>;
    auto h = std::find_if(hosts_.begin(), hosts_.end(),
                          [&](const launch_host& x) { return x.name == host; });
    auto hp = h == hosts_.end() ? std::nullopt : parse_host_port(h->agent);
    if (!hp)
      return failure::failure("host " + host + " has no agent address");
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    char text[NI_MAXHOST] = {};
    bool resolved = getaddrinfo(hp->first.c_str(), nullptr, &hints, &found) == 0
                    && getnameinfo(found->ai_addr, found->ai_addrlen, text, sizeof text, nullptr,
                                   0, NI_NUMERICHOST) == 0;
    if (found != nullptr)
      freeaddrinfo(found);
    if (!resolved)
      return failure::failure("cannot resolve " + hp->first + ", the address of host " + host);
    const std::string address = text;
    if (address.rfind("127.", 0) == 0 || address == "::1")
      return failure::failure("host " + host + " is reached on loopback (" + address
                              + "), which every host of this machine shares");
    return address;
  }

  std::string host_of(const caf::actor_addr& a) const {
    for (const auto& [host, agent] : agents_)
      if (agent.address() == a)
        return host;
    return "?";
  }

  /// Sends `sig` to the process (through its host's agent) if it runs and its host is not lost.
  void signal(const process_state& p, int sig) {
    if (auto agent = agents_.find(p.host); p.pid != 0 && agent != agents_.end())
      caf::anon_send(agent->second, agent_signal{p.pid, sig});
  }

  bool start(process_state& p) {
    if (p.spec.role == "control")
      fs::remove(ready_file_);
    bool ok = false;
    self_->request(agents_.at(p.host), std::chrono::seconds(30), agent_spawn{p.spec.argv})
      .receive(
        [&](std::int32_t pid) {
          p.pid = pid;
          ok = true;
        },
        [&](const caf::error& e) {
          err_ << "troupe launch: cannot start " << p.spec.name << " on " << p.host << ": "
               << self_->system().render(e) << "\n";
        });
    if (!ok)
      return false;
    p.state = "running";
    p.moving = false;
    p.started_failed = p.failed_gpus;
    p.ep_now = 0;
    err_ << "troupe launch: started " << p.spec.name << " (pid " << p.pid
         << (agents_.size() > 1 ? " on " + p.host : std::string{}) << ")\n";
    event("start", p, {{"restarts", p.restarts}});
    return true;
  }

  /// A process ended: decides whether to restart it, stop the cluster (returns its exit
  /// status), or nothing (-1).
  int on_exit(const agent_exit& e) {
    int status = e.status;
    auto pid = e.pid;
    auto* p = find(e.host, pid);
    if (p == nullptr)
      return -1;
    bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    event("exit", *p, {{"status", describe_status(status)}});
    p->pid = 0;
    err_ << "troupe launch: " << p->spec.name << " (pid " << pid << ") "
         << describe_status(status);
    if (p->spec.role == "control")
      autoscaler_ = caf::actor{};  // a restarted control process has a new one
    if (p->retiring) {
      err_ << "; removed\n";
      auto name = p->spec.name;
      remove(name);
      write_state();
      return -1;
    }
    if (p->held) {
      // Killed by a fault: down until the fault releases it (no restart, no intensity).
      p->state = "down";
      err_ << "; down until the fault ends\n";
      write_state();
      return -1;
    }
    if (p->evacuating) {
      p->evacuating = false;
      err_ << "; its host left the hosts file\n";
      evacuate(*p);
      write_state();
      return -1;
    }
    if (p->reforming) {
      p->reforming = false;
      p->state = "restarting";
      p->restart_at = clock::now();
      err_ << "; restarts as an EP group of " << p->ep << "\n";
      write_state();
      return -1;
    }
    if (p->rejoin) {
      p->rejoin = false;
      p->state = "restarting";
      p->restart_at = clock::now();
      err_ << "; restarts to join the control process at " << control_ << "\n";
      write_state();
      return -1;
    }
    if (clean) {
      p->state = "exited";
      err_ << "\n";
      write_state();
      if (p->spec.role == "control") {
        err_ << "troupe launch: the control process ended; stopping the cluster\n";
        return 0;
      }
      return -1;
    }
    return restart_later(*p);
  }

  /// Schedules a restart of `p`, ending the line the caller began on `err_`. Returns -1, or
  /// 1 when the restart intensity is exceeded (the cluster stops).
  int restart_later(process_state& p) {
    // Restart intensity over every process, as a one_for_one supervisor counts it.
    auto now = clock::now();
    restarts_.push_back(now);
    while (!restarts_.empty() && now - restarts_.front() > o_.restart_period)
      restarts_.pop_front();
    if (restarts_.size() > o_.max_restarts) {
      p.state = "failed";
      err_ << "; more than " << o_.max_restarts << " restarts within "
           << o_.restart_period.count() << " s: stopping the cluster\n";
      write_state();
      return 1;
    }
    ++p.restarts;
    p.state = "restarting";
    p.restart_at = now + o_.restart_delay;
    err_ << "; restart " << p.restarts << " in " << std::fixed << std::setprecision(1)
         << std::chrono::duration<double>(o_.restart_delay).count() << " s\n";
    write_state();
    return -1;
  }

  /// The agent of `host` is gone (the machine died, or its link to us): its processes are
  /// taken as gone too (a cut-off instance exits by itself once its link to the control
  /// process times out). Each moves to the live host that takes its role and runs the fewest
  /// processes, and starts there as a restart; one that no live host takes stays `lost`. The
  /// control process moves too, when a live host takes the control role: its address (and
  /// the HTTP address, when it was the lost host's) becomes that host's, and every other
  /// process is restarted at once with the new address (its requests were the lost control
  /// process's). Returns -1, or the status to stop the cluster with.
  int lose_host(const std::string& host) {
    reconnect_later(host, agents_.at(host).address());
    agents_.erase(host);
    // Those the autoscaler was removing are removed, not moved (a prefill instance's block
    // fetcher, on the same host, follows it).
    for (;;) {
      auto p = std::find_if(procs_.begin(), procs_.end(), [&](const process_state& x) {
        return x.host == host && x.retiring;
      });
      if (p == procs_.end())
        break;
      p->pid = 0;
      auto name = p->spec.name;
      remove(name);
    }
    bool control = false;
    for (auto& p : procs_)
      if (p.host == host) {
        event("lost", p, {{"host", host}});
        p.pid = 0;
        p.evacuating = false;  // it moves now
        p.restart_at.reset();
        control = control || p.spec.role == "control";
      }
    const launch_host* control_to = control ? least_loaded("control") : nullptr;
    if (control && control_to == nullptr) {
      err_ << "troupe launch: lost the agent of host " << host
           << ", which runs the control process, and no live host takes the control role; "
              "stopping the cluster\n";
      for (auto& p : procs_)
        if (p.host == host)
          p.state = "failed";
      return 1;
    }
    write_state();
    err_ << "troupe launch: lost the agent of host " << host << "\n";
    if (control_to != nullptr)
      move_control(host, *control_to);
    for (auto& p : procs_) {
      if (p.host != host)
        continue;
      const launch_host* to = p.spec.role == "control"   ? control_to
                              : p.spec.role == "fetcher" ? host_of_prefill(p.spec.index)
                                                         : least_loaded(p.spec.role);
      if (to == nullptr) {
        p.state = "lost";
        p.moving = false;
        err_ << "troupe launch: " << p.spec.name << ": " << no_host_for(p.spec.role)
             << "; it stays down\n";
        continue;
      }
      if (int status = move_to(p, *to); status >= 0)
        return status;
    }
    drop_left_hosts();
    write_state();
    return -1;
  }

  process_state* find(const std::string& host, std::int32_t pid) {
    for (auto& p : procs_)
      if (p.pid == pid && p.host == host)
        return &p;
    return nullptr;
  }

  void check_ready() {
    if (!http_.empty() || !fs::exists(ready_file_))
      return;
    try {
      std::ifstream in(ready_file_);
      auto j = nlohmann::json::parse(in);
      http_ = join_host_port(listen_host_, j.at("http").get<std::uint16_t>());
    } catch (const std::exception&) {
      return;  // half-written: the next poll reads it
    }
    err_ << "troupe launch: serving on http://" << http_ << " (SIGTERM or Ctrl-C stops)\n";
    if (!serving_since_) {
      serving_since_ = clock::now();
      if (!faults_.empty())
        err_ << "troupe launch: fault plan: " << faults_.size()
             << " action(s), timed from now\n";
    }
    write_state();
  }

  void write_state() {
    tell_autoscaler();
    if (o_.state_file.empty())
      return;
    nlohmann::json procs = nlohmann::json::array();
    for (const auto& p : procs_) {
      procs.push_back({{"name", p.spec.name},
                       {"role", p.spec.role},
                       {"index", p.spec.index},
                       {"host", p.host},
                       {"pid", p.pid},
                       {"restarts", p.restarts},
                       {"state", p.state}});
      if (p.ep > 0 || !p.failed_gpus.empty()) {
        procs.back()["ep"] = p.ep;
        procs.back()["failed_gpus"] = p.failed_gpus;
      }
      if (p.ep_now > 0)
        procs.back()["ep_now"] = p.ep_now;
    }
    nlohmann::json hosts = nlohmann::json::array();
    for (const auto& h : hosts_) {
      nlohmann::json host{{"name", h.name},
                          {"agent", h.agent},
                          {"state", agents_.count(h.name) ? "up" : "lost"}};
      if (h.devices) {
        host["devices"] = *h.devices;
        host["devices_taken"] = devices_taken(h);
      }
      hosts.push_back(std::move(host));
    }
    nlohmann::json j{{"launcher_pid", getpid()},
                     {"control", control_},
                     {"http", http_.empty() ? nlohmann::json() : nlohmann::json(http_)},
                     {"hosts", hosts},
                     {"processes", procs}};
    auto tmp = o_.state_file + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << j.dump(2) << "\n";
    }
    std::error_code ec;
    fs::rename(tmp, o_.state_file, ec);
  }

  /// Waits until every process in `group` has exited or `deadline`; reaps as they go.
  void wait_for(const std::vector<process_state*>& group, clock::time_point deadline) {
    auto alive = [&] {
      for (auto* p : group)
        if (p->pid != 0)
          return true;
      return false;
    };
    while (alive() && clock::now() < deadline) {
      self_->receive(
        [&](agent_exit& e) {
          if (auto* p = find(e.host, e.pid)) {
            err_ << "troupe launch: " << p->spec.name << " (pid " << e.pid << ") "
                 << describe_status(e.status) << "\n";
            event("exit", *p, {{"status", describe_status(e.status)}});
            p->pid = 0;
            p->state = "exited";
          }
        },
        [&](caf::down_msg& d) {
          auto host = host_of(d.source);
          for (auto* p : group)
            if (p->host == host)
              p->pid = 0;
        },
        caf::after(std::chrono::milliseconds(50)) >> [] {});
    }
  }

  /// Stops every process: instances first (SIGTERM: they drain, and a drained decode
  /// instance may still write blocks), then the store process, then the control process,
  /// SIGKILL for any still alive after its grace. Returns `status`.
  int stop_all(int status) {
    for (auto& p : procs_) {
      p.restart_at.reset();
      if (p.state == "stopped")
        signal(p, SIGCONT);  // a stopped process cannot drain
    }
    std::vector<process_state*> instances, store, control;
    for (auto& p : procs_)
      (p.spec.role == "control" ? control : p.spec.role == "store" ? store : instances)
        .push_back(&p);
    for (auto* group : {&instances, &store, &control}) {
      for (auto* p : *group)
        signal(*p, SIGTERM);
      wait_for(*group, clock::now() + o_.serve.grace + 60s);
      for (auto* p : *group)
        if (p->pid != 0) {
          err_ << "troupe launch: " << p->spec.name << " (pid " << p->pid
               << ") did not stop; killing it\n";
          signal(*p, SIGKILL);
        }
      wait_for(*group, clock::now() + 10s);
    }
    write_state();
    err_ << "troupe launch: stopped\n";
    return status;
  }

  /// Tries to reach the agent of lost host `name` again, every 2 s on a thread of its own,
  /// until an agent answers there that is not the lost one, `gone` (whose proxy the
  /// middleman may hand out until it has closed its connection): the thread then tells the
  /// launcher (agent_back_atom). Ends when the launcher stops.
  void reconnect_later(const std::string& name, caf::actor_addr gone) {
    auto h = std::find_if(hosts_.begin(), hosts_.end(),
                          [&](const launch_host& x) { return x.name == name; });
    if (h == hosts_.end())
      return;
    auto addr = *parse_host_port(h->agent);
    auto me = caf::actor_cast<caf::actor>(self_.ptr());
    auto& sys = self_->system();
    reconnects_.emplace_back([&sys, addr, name, me, gone, stop = stopping_] {
      for (;;) {
        for (int i = 0; i < 20 && !stop->load(); ++i)
          std::this_thread::sleep_for(100ms);
        if (stop->load())
          return;
        auto a = runtime::connect_actor(sys, addr.first, addr.second, 3s);
        if (a && a->address() != gone) {
          caf::anon_send(me, agent_back_atom::value, name, *a);
          return;
        }
      }
    });
  }

  /// The agent of lost host `host` answers again: the host takes processes again, first
  /// those that no live host took (`lost`), which start there as restarts. Returns -1, or
  /// the status to stop the cluster with (the restart intensity was exceeded).
  int host_back(const std::string& host, caf::actor agent) {
    if (std::none_of(hosts_.begin(), hosts_.end(),
                     [&](const launch_host& x) { return x.name == host; }))
      return -1;  // it left the hosts file meanwhile
    self_->monitor(agent);
    agents_[host] = std::move(agent);
    write_state();
    err_ << "troupe launch: the agent of host " << host
         << (joining_.erase(host) != 0 ? " joined" : " is back") << "\n";
    const auto& h = *std::find_if(hosts_.begin(), hosts_.end(),
                                  [&](const launch_host& x) { return x.name == host; });
    for (auto& p : procs_) {
      if (p.state != "lost" || !takes_role(h, p.spec.role, hosts_)
          || (takes_device(p.spec.role) && !device_free(h)))
        continue;
      if (int status = move_to(p, h); status >= 0)
        return status;
    }
    write_state();
    return -1;
  }

  /// SIGHUP: reads the hosts file again. A new host joins once its agent answers (tried every
  /// 2 s); a host's new roles and devices count for the placements from now on; a host that
  /// left the file, or no longer takes the role of a process it runs, has those processes
  /// stopped (instances drain) and started on the other hosts as they exit (not counted as
  /// restarts), and is dropped once it runs none. The control process's host must keep the
  /// control role, and a host its agent address: such a file is refused, as a file with
  /// problems, and the hosts stay as they were.
  void reload_hosts() {
    const std::string head = "troupe launch: SIGHUP: ";
    if (o_.hosts_file.empty()) {
      err_ << head << "no hosts file to read again (--hosts)\n";
      return;
    }
    std::ostringstream problems;
    auto loaded = load_hosts(o_.hosts_file, problems);
    if (!loaded) {
      err_ << head << "the hosts stay as they were:\n" << problems.str();
      return;
    }
    auto find_new = [&](const std::string& name) {
      return std::find_if(loaded->begin(), loaded->end(),
                          [&](const launch_host& h) { return h.name == name; });
    };
    for (const auto& h : hosts_) {
      auto n = find_new(h.name);
      if (n != loaded->end() && n->agent != h.agent) {
        err_ << head << "host " << h.name << " has a new agent address (" << n->agent
             << ", was " << h.agent << "): remove it, send SIGHUP, then add it again; the "
             << "hosts stay as they were\n";
        return;
      }
    }
    for (const auto& p : procs_)
      if (p.spec.role == "control") {
        auto n = find_new(p.host);
        if (n == loaded->end() || !takes_role(*n, "control", *loaded)) {
          err_ << head << "host " << p.host << " runs the control process, so it must stay "
               << "and keep the control role; the hosts stay as they were\n";
          return;
        }
      }
    std::vector<std::string> joined, left;
    for (const auto& n : *loaded)
      if (std::none_of(hosts_.begin(), hosts_.end(),
                       [&](const launch_host& h) { return h.name == n.name; }))
        joined.push_back(n.name);
    for (const auto& h : hosts_)
      if (find_new(h.name) == loaded->end())
        left.push_back(h.name);
    // The hosts that left stay listed, taking no role, until their processes have moved (one
    // that left and is back before that stays).
    for (const auto& n : *loaded)
      leaving_.erase(n.name);
    leaving_.insert(left.begin(), left.end());
    auto next = *loaded;
    for (const auto& name : left) {
      auto h = *std::find_if(hosts_.begin(), hosts_.end(),
                             [&](const launch_host& x) { return x.name == name; });
      h.roles.clear();
      next.push_back(std::move(h));
    }
    hosts_ = std::move(next);
    err_ << head << "read " << o_.hosts_file << ": " << hosts_.size() - left.size() << " host(s)";
    for (const auto& name : joined)
      err_ << ", " << name << " joins";
    for (const auto& name : left)
      err_ << ", " << name << " leaves";
    err_ << "\n";
    for (const auto& name : joined) {
      joining_.insert(name);
      reconnect_later(name, caf::actor_addr{});
    }
    // Processes on a host that no longer takes their role: stopped, to start elsewhere.
    for (auto& p : procs_) {
      auto h = std::find_if(hosts_.begin(), hosts_.end(),
                            [&](const launch_host& x) { return x.name == p.host; });
      // (A block fetcher follows its prefill instance: evacuate.)
      if (h == hosts_.end() || takes_role(*h, p.spec.role, hosts_) || p.retiring
          || p.spec.role == "fetcher")
        continue;
      if (p.pid != 0 && agents_.count(p.host) != 0) {
        err_ << "troupe launch: " << p.spec.name << " leaves host " << p.host
             << (takes_device(p.spec.role) ? " (it drains first)\n" : "\n");
        p.evacuating = true;
        p.moving = true;
        signal(p, p.spec.role == "decode" ? SIGUSR1 : SIGTERM);
      } else {
        evacuate(p);
      }
    }
    drop_left_hosts();
    write_state();
  }

  /// Starts `p`, which left its host, on another one (a fetcher on its prefill instance's),
  /// at once and not counted as a restart; with none for it, it stays `lost`.
  void evacuate(process_state& p) {
    const launch_host* to = p.spec.role == "fetcher" ? host_of_prefill(p.spec.index)
                                                     : least_loaded(p.spec.role);
    p.moving = to != nullptr && !p.held;
    if (to == nullptr) {
      p.state = "lost";
      p.restart_at.reset();
      err_ << "troupe launch: " << p.spec.name << ": " << no_host_for(p.spec.role)
           << "; it stays down\n";
    } else {
      err_ << "troupe launch: " << p.spec.name << " moves from " << p.host << " to "
           << to->name << "\n";
      p.host = to->name;
      set_arg(p.spec.argv, "--fabric-host", parse_host_port(to->agent)->first);
      if (p.held) {
        p.state = "down";
      } else {
        p.state = "restarting";
        p.restart_at = clock::now();
      }
    }
    // A prefill instance's block fetcher goes where it went.
    if (p.spec.role == "prefill")
      if (auto* f = find_named("fetcher/" + std::to_string(p.spec.index));
          f != nullptr && f->host != p.host && !f->retiring) {
        if (f->pid != 0 && agents_.count(f->host) != 0) {
          f->evacuating = true;
          signal(*f, SIGTERM);
        } else {
          evacuate(*f);
        }
      }
    drop_left_hosts();
  }

  /// Drops the hosts that left the hosts file and run no process any more.
  void drop_left_hosts() {
    for (auto it = leaving_.begin(); it != leaving_.end();) {
      const auto name = *it;
      if (std::any_of(procs_.begin(), procs_.end(),
                      [&](const process_state& p) { return p.host == name; })) {
        ++it;
        continue;
      }
      it = leaving_.erase(it);
      if (auto a = agents_.find(name); a != agents_.end()) {
        self_->demonitor(a->second);
        agents_.erase(a);
      }
      hosts_.erase(std::remove_if(hosts_.begin(), hosts_.end(),
                                  [&](const launch_host& h) { return h.name == name; }),
                   hosts_.end());
      err_ << "troupe launch: host " << name << " left\n";
    }
  }

  /// Places `p` (gone with its host) on host `to`, its fabric endpoint bound to the address
  /// the host is reached at, and restarts it there (a process killed by a fault starts when
  /// the fault releases it). Returns restart_later's status.
  /// The live host prefill instance `index` runs on (moved there already: it comes first in
  /// the plan), where its block fetcher must run too (null: none).
  const launch_host* host_of_prefill(std::uint32_t index) const {
    const std::string name = "prefill/" + std::to_string(index);
    for (const auto& p : procs_)
      if (p.spec.name == name)
        for (const auto& h : hosts_)
          if (h.name == p.host && agents_.count(h.name) != 0 && p.state != "lost")
            return &h;
    return nullptr;
  }

  /// Whether host `h` has a device free for another instance process: its `devices` are
  /// more than the instance processes placed there (running, restarting, held down by a
  /// fault or draining; not those that exited or wait `lost` for a host).
  bool device_free(const launch_host& h) const {
    return !h.devices || devices_taken(h) < *h.devices;
  }

  std::uint64_t devices_taken(const launch_host& h) const {
    return static_cast<std::uint64_t>(
      std::count_if(procs_.begin(), procs_.end(), [&](const process_state& p) {
        return p.host == h.name && takes_device(p.spec.role) && p.state != "exited"
               && p.state != "failed" && p.state != "lost";
      }));
  }

  /// Why no live host takes a new process of `role` (for the messages).
  std::string no_host_for(const std::string& role) const {
    bool live = std::any_of(hosts_.begin(), hosts_.end(), [&](const launch_host& h) {
      return agents_.count(h.name) != 0 && takes_role(h, role, hosts_);
    });
    return live ? "every live host that takes the " + role
                    + " role has all its devices taken (the hosts file's `devices`)"
                : "no live host takes the " + role + " role";
  }

  /// The live host that takes `role` (with a free device for an instance) and runs the fewest
  /// processes (null: none).
  const launch_host* least_loaded(const std::string& role) const {
    const launch_host* to = nullptr;
    std::size_t fewest = 0;
    for (const auto& h : hosts_) {
      if (agents_.count(h.name) == 0 || !takes_role(h, role, hosts_)
          || (takes_device(role) && !device_free(h)))
        continue;
      auto n = static_cast<std::size_t>(std::count_if(
        procs_.begin(), procs_.end(), [&](const process_state& q) { return q.host == h.name; }));
      if (to == nullptr || n < fewest)
        to = &h, fewest = n;
    }
    return to;
  }

  /// The control process leaves lost host `from` for `to`: it will publish on `to`'s address
  /// (same port) and listen for HTTP there when it listened on `from`'s address. Every process
  /// is told the new address; those still running elsewhere are killed to restart with it
  /// (rejoin: not counted as crashes), as they would exit by themselves once their link to the
  /// lost control process timed out.
  void move_control(const std::string& from, const launch_host& to) {
    const auto old_host = parse_host_port(control_)->first;
    const auto new_host = parse_host_port(to.agent)->first;
    control_ = join_host_port(new_host, parse_host_port(control_)->second);
    if (listen_host_ == old_host)
      listen_host_ = new_host;
    // Not serving until the moved control process reports its HTTP port.
    http_.clear();
    fs::remove(ready_file_);
    err_ << "troupe launch: the control process moves from " << from << " to " << to.name
         << ": control " << control_ << ", HTTP on " << listen_host_
         << "; the other processes restart to join it\n";
    for (auto& p : procs_) {
      set_arg(p.spec.argv, "--control", control_);
      if (p.spec.role == "control") {
        auto flag = std::find(p.spec.argv.begin(), p.spec.argv.end(), "--listen");
        if (flag != p.spec.argv.end() && std::next(flag) != p.spec.argv.end()) {
          auto listen = parse_host_port(*std::next(flag));
          if (listen && listen->first == old_host)
            *std::next(flag) = join_host_port(new_host, listen->second);
        }
      } else if (p.host != from && p.pid != 0 && !p.held) {
        p.rejoin = true;
        signal(p, SIGKILL);
      } else if (p.host != from && p.state == "restarting") {
        p.restart_at = clock::now();  // its restart takes the new address
      }
    }
  }

  int move_to(process_state& p, const launch_host& to) {
    err_ << "troupe launch: " << p.spec.name << " moves from " << p.host << " to " << to.name;
    p.host = to.name;
    set_arg(p.spec.argv, "--fabric-host", parse_host_port(to.agent)->first);
    if (p.held) {
      p.state = "down";
      err_ << "; down until the fault ends\n";
      return -1;
    }
    return restart_later(p);
  }

  process_state* find_named(const std::string& name) {
    for (auto& p : procs_)
      if (p.spec.name == name)
        return &p;
    return nullptr;
  }

  /// The autoscaler ordered instance `index` of `role`: its process starts on the live host
  /// that takes the role and runs the fewest processes, with its block fetcher beside a
  /// prefill instance when the cluster runs them. One that cannot start is reported failed.
  void scale_up(const std::string& role, std::uint32_t index) {
    const auto name = role + "/" + std::to_string(index);
    if (find_named(name) != nullptr) {
      tell_autoscaler();
      return;
    }
    // The order fails; the autoscaler orders again at its next decisions: said once until
    // the reason changes.
    auto refuse = [&](const std::string& why) {
      if (unplaced_[role] != why)
        err_ << "troupe launch: the autoscaler ordered " << name << "; " << why << "\n";
      unplaced_[role] = why;
      failed_.push_back({role, index, "failed"});
      tell_autoscaler();
    };
    // An instance of the role on its way to another host: the pool is short until it arrives,
    // and a new one would take the device it goes to.
    auto mover = std::find_if(procs_.begin(), procs_.end(), [&](const process_state& p) {
      return p.spec.role == role && p.moving && !p.retiring;
    });
    if (mover != procs_.end()) {
      refuse("not started while " + mover->spec.name + " moves to another host");
      return;
    }
    const launch_host* to = hosts_.empty() ? nullptr : least_loaded(role);
    auto make = [&](const std::string& r) -> std::optional<process_state> {
      auto m = std::find_if(models_.begin(), models_.end(),
                            [&](const launch_process& x) { return x.role == r; });
      if (m == models_.end() || (!hosts_.empty() && to == nullptr))
        return std::nullopt;
      process_state p;
      p.spec = *m;
      p.spec.name = r + "/" + std::to_string(index);
      p.spec.index = index;
      set_arg(p.spec.argv, "--index", std::to_string(index));
      if (to != nullptr) {
        p.spec.host = to->name;
        set_arg(p.spec.argv, "--fabric-host", parse_host_port(to->agent)->first);
      }
      p.host = p.spec.host;
      return p;
    };
    auto instance = make(role);
    if (!instance) {
      refuse(no_host_for(role));
      return;
    }
    unplaced_.erase(role);
    err_ << "troupe launch: the autoscaler orders " << name << "\n";
    event("scale", *instance, {{"action", "start"}});
    procs_.push_back(std::move(*instance));
    if (!start(procs_.back())) {
      procs_.pop_back();
      failed_.push_back({role, index, "failed"});
      write_state();
      return;
    }
    if (role == "prefill")
      if (auto fetcher = make("fetcher")) {
        procs_.push_back(std::move(*fetcher));
        if (!start(procs_.back()))
          procs_.pop_back();  // the instance reads the store directly
      }
    write_state();
  }

  /// The autoscaler removes instance `index` of `role`: a running process gets a stop signal
  /// (it drains) and is removed once it exited; one that does not run is removed at once.
  void scale_down(const std::string& role, std::uint32_t index) {
    auto* p = find_named(role + "/" + std::to_string(index));
    if (p == nullptr) {
      tell_autoscaler();
      return;
    }
    err_ << "troupe launch: the autoscaler removes " << p->spec.name << "\n";
    event("scale", *p, {{"action", "stop"}});
    retire(*p);
    write_state();
  }

  void retire(process_state& p) {
    if (p.pid == 0) {
      auto name = p.spec.name;
      remove(name);
      return;
    }
    p.retiring = true;
    p.held = false;
    p.restart_at.reset();
    if (p.state == "stopped")
      signal(p, SIGCONT);  // a stopped process cannot drain
    // A decode instance drains with its pool's grace on SIGUSR1, as the autoscaler's drain has
    // it; a prefill instance has no jobs left (the autoscaler waited), a fetcher nothing to
    // drain.
    signal(p, p.spec.role == "decode" ? SIGUSR1 : SIGTERM);
    p.state = "draining";
  }

  /// Drops process `name` from the cluster; a prefill instance's block fetcher follows it.
  void remove(const std::string& name) {
    auto it = std::find_if(procs_.begin(), procs_.end(),
                           [&](const process_state& p) { return p.spec.name == name; });
    if (it == procs_.end())
      return;
    const bool prefill = it->spec.role == "prefill";
    const auto index = it->spec.index;
    procs_.erase(it);
    if (prefill)
      if (auto* f = find_named("fetcher/" + std::to_string(index)))
        retire(*f);
    drop_left_hosts();
  }

  /// Once the control process serves, and again after each of its restarts: registers with
  /// its directory, which passes on the instance processes' re-formations, and with its
  /// autoscaler's pool stand-ins (none when the topology does not autoscale), which then hear
  /// of every change of the instance processes and send their orders here.
  void register_with_control() {
    auto* c = find_named("control");
    if (c == nullptr || c->pid == 0 || c->pid == registered_pid_ || !fs::exists(ready_file_)
        || clock::now() < next_registration_)
      return;
    next_registration_ = clock::now() + 1s;
    auto hp = parse_host_port(control_);
    auto directory = runtime::connect_actor(self_->system(), hp->first, hp->second, 3s);
    if (!directory)
      return;
    std::optional<caf::actor> scaler;
    self_->request(*directory, 5s, directory_atom::value)
      .receive([&](const control_directory& d) { scaler = d.scaler; }, [](const caf::error&) {});
    if (!scaler)
      return;
    // The directory passes on what the instance processes report (reformed_atom).
    bool registered = false;
    self_->request(*directory, 5s, launcher_atom::value, caf::actor_cast<caf::actor>(self_.ptr()))
      .receive([&](caf::ok_atom) { registered = true; }, [](const caf::error&) {});
    if (!registered)
      return;
    registered_pid_ = c->pid;
    if (!*scaler)
      return;  // the topology's pools are not autoscaled
    self_->request(*scaler, 5s, launcher_atom::value, caf::actor_cast<caf::actor>(self_.ptr()))
      .receive([&](caf::ok_atom) { autoscaler_ = *scaler; }, [](const caf::error&) {});
    if (!autoscaler_) {
      registered_pid_ = 0;  // try again
      return;
    }
    err_ << "troupe launch: the control process's autoscaler orders instances here\n";
    tell_autoscaler();
  }

  /// The instance processes and their states, to the autoscaler's pool stand-ins.
  void tell_autoscaler() {
    if (!autoscaler_)
      return;
    std::vector<launched_instance> all;
    for (const auto& p : procs_)
      if (p.spec.role == "prefill" || p.spec.role == "decode")
        all.push_back({p.spec.role, p.spec.index, p.moving ? "moving" : p.state});
    all.insert(all.end(), failed_.begin(), failed_.end());
    failed_.clear();
    caf::anon_send(autoscaler_, instances_atom::value, std::move(all));
  }

  caf::scoped_actor self_;
  std::map<std::string, caf::actor> agents_;
  std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::thread> reconnects_;
  std::vector<launch_host> hosts_;  // empty: one host, the agent in this process
  const launch_options& o_;
  std::vector<process_state> procs_;
  std::vector<launch_process> models_;
  /// The control process's pool stand-ins once registered with (invalid: none), the control
  /// process registered with, the next try, and the orders that failed since last told.
  caf::actor autoscaler_;
  std::int32_t registered_pid_ = 0;
  clock::time_point next_registration_{};
  std::vector<launched_instance> failed_;
  /// Per role, why the autoscaler's last order of it found no host (said once).
  std::map<std::string, std::string> unplaced_;
  /// Hosts added by a reload whose agent has not answered yet, and hosts that left the hosts
  /// file but still run processes.
  std::set<std::string> joining_, leaving_;
  std::string control_;
  std::string listen_host_;
  std::string ready_file_;
  std::string http_;
  std::deque<clock::time_point> restarts_;
  std::vector<process_action> faults_;
  std::size_t next_fault_ = 0;
  /// Link cuts and slowdowns done: (fault, host, host).
  std::set<std::tuple<std::size_t, std::string, std::string>> link_faults_;
  std::optional<clock::time_point> serving_since_;
  clock::time_point started_ = clock::now();
  std::ofstream events_;
  std::ostream& err_;
};

/// The arguments every `troupe node` of a launch takes alike, besides --model, --control and
/// (the store process's) --kv-dir.
std::vector<std::string> shared_node_args(const launch_options& o) {
  const auto& s = o.serve;
  std::vector<std::string> args{"--threads", std::to_string(s.device_threads), "--grace",
                                std::to_string(s.grace.count())};
  auto add = [&](const char* flag, const std::string& value) {
    if (!value.empty()) {
      args.push_back(flag);
      args.push_back(value);
    }
  };
  add("--engram-map", s.engram_map);
  add("--tokenizer", s.tokenizer);
  const auto& tls = o.node_tls.enabled() ? o.node_tls : o.tls;
  add("--tls-ca", tls.ca_file);
  add("--tls-cert", tls.cert_file);
  add("--tls-key", tls.key_file);
  if (s.max_batch > 0)
    add("--max-batch", std::to_string(s.max_batch));
  if (s.prefill_chunk > 0)
    add("--prefill-chunk", std::to_string(s.prefill_chunk));
  if (s.max_context > 0)
    add("--max-context", std::to_string(s.max_context));
  if (s.kv_tokens > 0)
    add("--kv-tokens", std::to_string(s.kv_tokens));
  if (s.gpu_memory_fraction != serve_options{}.gpu_memory_fraction) {
    char fraction[32];  // the shortest text that reads back as the same double
    const auto end = std::to_chars(fraction, fraction + sizeof fraction, s.gpu_memory_fraction).ptr;
    add("--gpu-memory-utilization", std::string(fraction, end));
  }
  if (s.spec != "off")
    add("--spec", s.spec);
  if (s.overlap != "on")
    add("--overlap", s.overlap);
  if (s.window_memory != "256MiB")
    add("--window-memory", s.window_memory);
  if (s.eplb_ranks > 0) {
    add("--eplb", std::to_string(s.eplb_ranks));
    add("--eplb-interval", s.eplb_interval);
  }
  return args;
}

/// The HTTP entrypoint's arguments of the control process, besides --listen.
std::vector<std::string> entrypoint_node_args(const launch_options& o) {
  const auto& s = o.serve;
  std::vector<std::string> args{"--max-in-flight", std::to_string(s.max_in_flight),
                                "--compile-threads", std::to_string(s.compile_threads)};
  if (!s.served_model_name.empty())
    args.insert(args.end(), {"--served-model-name", s.served_model_name});
  if (!s.api_keys_file.empty())
    args.insert(args.end(), {"--api-keys", s.api_keys_file});
  if (s.check_history)
    args.push_back("--check-history");
  return args;
}

/// `troupe launch --slurm`: the options become the Slurm job's (paths made absolute, for the
/// job's machines on a shared file system), which is submitted and followed.
int launch_on_slurm(launch_options o, const topology& topo,
                    const std::pair<std::string, std::uint16_t>& listen,
                    std::uint16_t control_port, std::ostream& out, std::ostream& err) {
  auto& s = o.serve;
  auto absolute = [](std::string& path) {
    if (!path.empty())
      path = fs::absolute(path).lexically_normal().string();
  };
  for (auto* path : {&s.topology, &s.model, &s.kv_dir, &s.tokenizer, &s.api_keys_file,
                     &o.tls.ca_file, &o.tls.cert_file, &o.tls.key_file, &o.node_tls.ca_file,
                     &o.node_tls.cert_file, &o.node_tls.key_file})
    absolute(*path);
  if (s.engram_map != "identity")
    absolute(s.engram_map);
  auto job = o.slurm_job;
  if (job.topology_path.empty())
    job.topology_path = s.topology;
  job.block_fetchers = o.block_fetchers;
  job.troupe = o.executable.empty() ? fs::read_symlink("/proc/self/exe").string() : o.executable;
  job.model_dir = s.model;
  job.bind = listen.first;
  job.http_port = listen.second;
  if (control_port != 0)
    job.control_port = control_port;
  job.store_dir = s.kv_dir;
  job.node_args = shared_node_args(o);
  auto entry = entrypoint_node_args(o);
  job.node_args.insert(job.node_args.end(), entry.begin(), entry.end());
  return run_slurm_launch(topo, job, o.dry_run, out, err);
}

} // namespace

std::optional<std::vector<launch_host>> load_hosts(const std::string& file, std::ostream& err) {
  std::vector<launch_host> hosts;
  std::vector<std::string> problems;
  try {
    auto root = toml::parse_file(file);
    auto* arr = root["host"].as_array();
    if (arr == nullptr || arr->empty())
      problems.push_back("no [[host]] entries");
    for (const auto& key_value : root)
      if (key_value.first.str() != "host")
        problems.push_back("unknown key '" + std::string(key_value.first.str()) + "'");
    if (arr != nullptr)
      for (std::size_t i = 0; i < arr->size(); ++i) {
        auto* t = arr->get(i)->as_table();
        auto where = "host " + std::to_string(i + 1);
        if (t == nullptr) {
          problems.push_back(where + ": not a table");
          continue;
        }
        launch_host h;
        h.name = (*t)["name"].value_or(std::string{});
        h.agent = (*t)["agent"].value_or(std::string{});
        if (h.name.empty())
          problems.push_back(where + ": name is missing");
        if (!parse_host_port(h.agent) || parse_host_port(h.agent)->second == 0)
          problems.push_back(where + ": agent '" + h.agent + "': expected HOST:PORT");
        if (auto* roles = (*t)["roles"].as_array())
          for (const auto& r : *roles) {
            auto role = r.value_or(std::string{});
            if (role != "control" && role != "store" && role != "prefill" && role != "decode")
              problems.push_back(where + ": role '" + role
                                 + "': expected control, store, prefill or decode");
            h.roles.push_back(role);
          }
        else
          problems.push_back(where
                             + ": roles is missing (a list of control, store, prefill, decode)");
        if (auto devices = (*t)["devices"]; devices) {
          auto n = devices.value<std::int64_t>();
          if (!devices.is_integer() || !n || *n < 1 || *n > 65536)
            problems.push_back(where + ": devices: expected a whole number from 1 to 65536 (the "
                               "GPUs, or CPU engines, its prefill and decode instances may take)");
          else
            h.devices = static_cast<std::uint32_t>(*n);
        }
        for (const auto& [k, v] : *t)
          if (k.str() != "name" && k.str() != "agent" && k.str() != "roles"
              && k.str() != "devices")
            problems.push_back(where + ": unknown key '" + std::string(k.str()) + "'");
        for (const auto& other : hosts)
          if (other.name == h.name)
            problems.push_back(where + ": name '" + h.name + "' is used twice");
        hosts.push_back(std::move(h));
      }
    for (const char* role : {"control", "prefill", "decode"})
      if (std::none_of(hosts.begin(), hosts.end(), [&](const launch_host& h) {
            return std::find(h.roles.begin(), h.roles.end(), role) != h.roles.end();
          }))
        problems.push_back(std::string("no host takes the ") + role + " role");
  } catch (const toml::parse_error& e) {
    problems.push_back(std::string(e.description()));
  }
  if (problems.empty())
    return hosts;
  for (const auto& p : problems)
    err << file << ": " << p << "\n";
  return std::nullopt;
}

bool takes_device(const std::string& role) { return role == "prefill" || role == "decode"; }

sim::result<std::vector<launch_process>> plan_launch(const launch_options& o,
                                                     std::uint32_t prefill, std::uint32_t decode,
                                                     std::uint32_t store_shards,
                                                     const std::string& control,
                                                     const std::string& ready_file,
                                                     const std::vector<launch_host>& hosts) {
  // The hosts each role may run on, and the next one to take an instance.
  auto takers = [&](const std::string& role) {
    std::vector<std::string> out;
    for (const auto& h : hosts)
      if (takes_role(h, role, hosts))
        out.push_back(h.name);
    if (out.empty())
      out.push_back("local");
    return out;
  };
  const auto& s = o.serve;
  auto exe = o.executable.empty() ? fs::read_symlink("/proc/self/exe").string() : o.executable;
  // What every node takes alike (the store process no model).
  std::vector<std::string> common{"--control", control};
  auto shared = shared_node_args(o);
  common.insert(common.end(), shared.begin(), shared.end());
  std::vector<launch_process> plan;
  // Devices taken on each host so far, and the instance that found none free.
  std::map<std::string, std::uint32_t> used;
  std::string no_room;
  auto room = [&](const std::string& host) {
    auto h = std::find_if(hosts.begin(), hosts.end(),
                          [&](const launch_host& x) { return x.name == host; });
    return h == hosts.end() || !h->devices || used[host] < *h->devices;
  };
  auto node = [&](std::string name, std::string role, std::uint32_t index,
                  std::vector<std::string> extra) {
    auto on = takers(role);
    // Round-robin, an instance going on to the next host with a free device; a fetcher beside
    // its prefill instance.
    std::string host = on[index % on.size()];
    if (role == "fetcher")
      for (const auto& q : plan)
        if (q.name == "prefill/" + std::to_string(index))
          host = q.host;
    if (takes_device(role)) {
      for (std::size_t k = 0; k < on.size() && !room(host); ++k)
        host = on[(index + k + 1) % on.size()];
      if (!room(host)) {
        if (no_room.empty())
          no_room = name;
        return;
      }
      ++used[host];
    }
    launch_process p{std::move(name), host, std::move(role), index,
                     {exe, "node", s.topology, "--role"}};
    p.argv.push_back(p.role);
    if (p.role != "store" && p.role != "fetcher")
      p.argv.insert(p.argv.end(), {"--model", s.model});
    if (p.role == "prefill" || p.role == "decode" || p.role == "fetcher"
        || (p.role == "store" && store_shards > 1)) {
      p.argv.push_back("--index");
      p.argv.push_back(std::to_string(index));
    }
    p.argv.insert(p.argv.end(), common.begin(), common.end());
    p.argv.insert(p.argv.end(), extra.begin(), extra.end());
    if (p.role != "control") {
      // The fabric endpoint binds to the address its host is reached at.
      std::string address = "127.0.0.1";
      for (const auto& h : hosts)
        if (h.name == p.host)
          address = parse_host_port(h.agent)->first;
      p.argv.insert(p.argv.end(), {"--fabric", o.fabric, "--fabric-host", address});
    } else {
      p.argv.insert(p.argv.end(), {"--fabric", o.fabric});
    }
    if (!o.kv_stream)
      p.argv.insert(p.argv.end(), {"--kv-stream", "off"});
    plan.push_back(std::move(p));
  };
  std::vector<std::string> control_extra{"--listen", s.listen};
  auto entry = entrypoint_node_args(o);
  control_extra.insert(control_extra.end(), entry.begin(), entry.end());
  if (!ready_file.empty())
    control_extra.insert(control_extra.end(), {"--ready-file", ready_file});
  // The block store runs in processes of its own (one per shard), which the control process
  // waits for.
  if (store_shards > 0)
    control_extra.push_back("--external-store");
  node("control", "control", 0, control_extra);
  for (std::uint32_t i = 0; i < store_shards; ++i) {
    std::vector<std::string> store_extra;
    if (!s.kv_dir.empty())
      store_extra = {"--kv-dir", s.kv_dir};
    node(store_process_name(i, store_shards), "store", i, store_extra);
  }
  for (std::uint32_t i = 0; i < prefill; ++i) {
    node("prefill/" + std::to_string(i), "prefill", i, {});
    if (store_shards > 0 && o.block_fetchers)
      node("fetcher/" + std::to_string(i), "fetcher", i, {});
  }
  for (std::uint32_t i = 0; i < decode; ++i)
    node("decode/" + std::to_string(i), "decode", i, {});
  if (!no_room.empty()) {
    std::string role = no_room.substr(0, no_room.find('/'));
    std::uint64_t devices = 0;
    for (const auto& h : hosts)
      if (takes_role(h, role, hosts))
        devices += h.devices.value_or(0);
    return sim::result<std::vector<launch_process>>::failure(
      "no host has a free device for " + no_room + ": the hosts that take the " + role
      + " role have " + std::to_string(devices) + " device(s) (the hosts file's `devices`), "
      "and the topology's " + std::to_string(prefill) + " prefill and "
      + std::to_string(decode) + " decode instance(s) take one each; add devices or hosts");
  }
  return plan;
}

int run_launch_command(const launch_options& o, std::ostream& out, std::ostream& err) {
  const std::string command = "troupe launch";
  auto fail = [&](const std::string& msg) {
    err << command << ": " << msg << "\n";
    return 1;
  };
  // Every device process runs on this host unless a hosts file or Slurm places them: then
  // this host must be able to run their engine (a GPU for device = "cuda").
  const bool devices_here = o.hosts_file.empty() && !o.slurm && !o.dry_run;
  auto in = load_serve_inputs(o.serve, command, err, devices_here);
  if (!in)
    return 1;
  if (o.slurm && prefill_or_decode_scales(in->topo))
    err << command << ": warning: [autoscaler] is on, but a Slurm job keeps its pools at their "
        << "initial sizes (troupe launch without --slurm, troupe serve and troupe sim run the "
        << "autoscaler; docs/launch.md)\n";
  auto listen = parse_host_port(o.serve.listen);
  if (!listen)
    return fail("--listen '" + o.serve.listen + "': expected HOST:PORT, e.g. 127.0.0.1:8000");
  auto control = parse_host_port(o.control);
  if (!control)
    return fail("--control '" + o.control + "': expected HOST:PORT, e.g. 127.0.0.1:7000");
  if (!o.serve.api_keys_file.empty() && !load_api_keys_option(o.serve, command, err))
    return 1;
  if (o.node_tls.enabled() && !o.tls.enabled())
    return fail("--node-tls-ca, --node-tls-cert and --node-tls-key need --tls-ca, --tls-cert "
                "and --tls-key (the launcher's own)");
  for (const auto* tls : {&o.tls, &o.node_tls})
    if (auto e = runtime::check_tls(*tls))
      return fail(std::string(tls == &o.tls ? "TLS: " : "the processes' TLS (--node-tls-*): ")
                  + runtime::error_text(e));
  if (o.slurm)
    return launch_on_slurm(o, in->topo, *listen, control->second, out, err);
  std::vector<launch_host> hosts;
  if (!o.hosts_file.empty()) {
    auto loaded = load_hosts(o.hosts_file, err);
    if (!loaded)
      return 1;
    hosts = std::move(*loaded);
    // The control process listens on its host's address; its port cannot be probed there.
    auto host = std::find_if(hosts.begin(), hosts.end(), [](const launch_host& h) {
      return std::find(h.roles.begin(), h.roles.end(), "control") != h.roles.end();
    });
    control->first = parse_host_port(host->agent)->first;
    if (control->second == 0)
      control->second = 7100;
  }
  if (control->second == 0 && !o.dry_run) {
    auto port = free_port(control->first);
    if (!port)
      return fail("no free port on " + control->first + " for the control process");
    control->second = *port;
  }
  auto control_addr = join_host_port(control->first, control->second);
  std::uint32_t prefill = find_pool(in->topo, pool_role::prefill)->instances.initial;
  std::uint32_t decode = find_pool(in->topo, pool_role::decode)->instances.initial;

  // The control process reports its HTTP port through this file.
  std::string ready_file;
  if (!o.dry_run) {
    if (!o.state_file.empty()) {
      ready_file = o.state_file + ".control";
    } else {
      std::string tmpl = (fs::temp_directory_path() / "troupe-launch-XXXXXX").string();
      if (mkdtemp(tmpl.data()) == nullptr)
        return fail("cannot make a temporary directory: " + std::string(std::strerror(errno)));
      ready_file = tmpl + "/control.ready";
    }
  }
  // The fault plan: validated against the topology, expanded with the seed, translated.
  real_fault_plan faults;
  if (!o.faults_file.empty()) {
    // Shard indices as `troupe sim` takes them: the topology's shards, or its default.
    sim::fault_limits limits;
    if (in->topo.storage.shards > 0)
      limits.store_shards = in->topo.storage.shards;
    auto loaded = sim::load_fault_plan(o.faults_file, in->topo, limits);
    if (!loaded.ok()) {
      for (const auto& d : loaded.errors)
        err << d.to_string() << "\n";
      return 1;
    }
    auto timeline = sim::expand(*loaded.value, runtime::rng{o.seed}.split("faults"),
                                std::chrono::duration_cast<runtime::duration>(o.fault_horizon));
    faults = plan_real_faults(timeline, in->topo, !in->kv_dir.empty(), !hosts.empty());
    for (const auto& why : faults.not_executed)
      err << command << ": warning: fault not executed: " << why << "\n";
  }
  const std::uint32_t store_shards = in->kv_dir.empty() ? 0 : in->topo.storage.real_shards();
  auto planned = plan_launch(o, prefill, decode, store_shards, control_addr, ready_file, hosts);
  if (!planned)
    return fail(o.hosts_file + ": " + planned.error());
  auto plan = std::move(*planned);
  // Devices the autoscaler's new instances of a role can take (none: no bound).
  auto free_devices = [&](const std::string& role) -> std::optional<std::uint64_t> {
    std::uint64_t free = 0;
    for (const auto& h : hosts) {
      if (!takes_role(h, role, hosts))
        continue;
      if (!h.devices)
        return std::nullopt;
      auto taken = std::count_if(plan.begin(), plan.end(), [&](const launch_process& p) {
        return p.host == h.name && takes_device(p.role);
      });
      free += *h.devices - static_cast<std::uint64_t>(taken);
    }
    return free;
  };
  for (auto role : {pool_role::prefill, pool_role::decode}) {
    const auto* pool = find_pool(in->topo, role);
    auto room = free_devices(std::string(to_string(role)));
    if (!hosts.empty() && autoscaled(in->topo, *pool) && room
        && pool->instances.max - pool->instances.initial > *room)
      err << command << ": warning: the autoscaler may grow " << to_string(role) << " to "
          << pool->instances.max << " instance(s), but the hosts that take the role have "
          << *room << " free device(s) (the hosts file's `devices`): an order beyond them "
          << "fails\n";
  }
  if (o.dry_run) {
    out << "# " << plan.size() << " processes on "
        << (hosts.empty() ? std::string("this host") : std::to_string(hosts.size()) + " hosts")
        << " (" << in->topo.source << ")\n";
    out << std::left << std::setw(12) << "# process" << std::setw(10) << "host"
        << std::setw(10) << "role" << "command\n";
    for (const auto& p : plan) {
      out << std::left << std::setw(12) << p.name << std::setw(10) << p.host << std::setw(10)
          << p.role;
      for (std::size_t i = 0; i < p.argv.size(); ++i)
        out << (i ? " " : "") << shell_quote(p.argv[i]);
      out << "\n";
    }
    for (const auto& h : hosts)
      if (h.devices)
        out << "# host " << h.name << ": "
            << std::count_if(plan.begin(), plan.end(),
                             [&](const launch_process& p) {
                               return p.host == h.name && takes_device(p.role);
                             })
            << " of " << *h.devices << " device(s) taken\n";
    for (auto role : {pool_role::prefill, pool_role::decode})
      if (const auto* pool = find_pool(in->topo, role);
          pool->ranks_per_process > 0 && pool->ranks_per_process < pool->gpus_per_instance) {
        const auto k = pool->ranks_per_process, n = pool->gpus_per_instance;
        out << "# each " << to_string(role) << " process runs ranks 0-" << k - 1 << " of its "
            << n << " and starts " << (n - 1) / k << " troupe ep-rank process(es) for ranks "
            << k << "-" << n - 1 << " (ranks_per_process = " << k << ")\n";
      }
    for (auto role : {pool_role::prefill, pool_role::decode})
      if (const auto* pool = find_pool(in->topo, role); autoscaled(in->topo, *pool))
        out << "# the autoscaler keeps " << to_string(role) << " at " << pool->instances.min
            << " to " << pool->instances.max << " instance(s): those it orders run as "
            << to_string(role) << "/<i> with " << to_string(role) << "/0's command line and "
            << "--index <i>\n";
    if (!faults.actions.empty())
      out << "# fault actions (seconds after the cluster serves)\n";
    for (const auto& a : faults.actions) {
      out << "# " << std::fixed << std::setprecision(1) << runtime::to_seconds(a.at) << " "
          << to_string(a.kind) << " " << a.process;
      if (a.kind == process_action_kind::cut || a.kind == process_action_kind::slow)
        out << " <-> " << a.peer;
      if (a.kind == process_action_kind::slow)
        out << " by " << std::setprecision(4) << std::defaultfloat << a.factor << "x"
            << std::fixed << std::setprecision(1);
      if (a.kind == process_action_kind::cut || a.kind == process_action_kind::slow)
        out << " for " << runtime::to_seconds(a.length) << " s";
      if (a.kind == process_action_kind::fail_gpu || a.kind == process_action_kind::heal_gpu)
        out << " gpu " << a.gpu << " of " << a.configured;
      if ((a.kind == process_action_kind::stop || a.kind == process_action_kind::resume)
          && a.configured > 1)
        out << " gpu " << a.gpu << " of " << a.configured
            << (a.ranks_per_process > 0 && a.gpu >= a.ranks_per_process
                  ? " (its rank process)" : "");
      out << " (fault " << a.fault << ")\n";
    }
    return 0;
  }
  err << command << ": " << plan.size() << " processes (control on " << control_addr << ", "
      << (store_shards == 0   ? std::string{}
          : store_shards == 1 ? std::string("the block store, ")
                              : "the block store in " + std::to_string(store_shards) + " shards"
                                  + (in->topo.storage.real_replicas() > 1
                                       ? " (" + std::to_string(in->topo.storage.real_replicas())
                                           + " copies of each block)"
                                       : std::string{})
                                  + ", ")
      << prefill << " prefill, " << decode
      << " decode)\n";

  // The agents that start the processes: one in this process, or each host's `troupe agent`.
  block_stop_signals();
  block_reload_signal();
  runtime::world w{real_world_options(true, o.tls)};
  auto& sys = w.system();
  std::map<std::string, caf::actor> agents;
  caf::actor local;
  if (hosts.empty()) {
    local = spawn_node_agent(sys, "local");
    agents["local"] = local;
  }
  for (const auto& h : hosts) {
    auto addr = parse_host_port(h.agent);
    auto deadline = clock::now() + 30s;
    for (;;) {
      auto a = runtime::connect_actor(sys, addr->first, addr->second);
      if (a) {
        agents[h.name] = *a;
        break;
      }
      if (clock::now() >= deadline)
        return fail("cannot reach the agent of host " + h.name + " at " + h.agent + ": "
                    + runtime::error_text(a.error()) + " (is `troupe agent --listen " + h.agent
                    + "` running there?)");
      std::this_thread::sleep_for(500ms);
    }
  }
  int status = 0;
  {
    // What an instance the autoscaler orders runs: the command line of index 0 of its role.
    std::vector<launch_process> models;
    // (Placed as the first instances of the initial plan were, so it fits where that did.)
    auto first = plan_launch(o, 1, 1, store_shards, control_addr, ready_file, hosts);
    for (auto& p : first ? *first : std::vector<launch_process>{})
      if (p.role == "prefill" || p.role == "decode" || p.role == "fetcher")
        models.push_back(std::move(p));
    launcher l(sys, agents, hosts, o, std::move(plan), std::move(models), control_addr,
               listen->first, ready_file, std::move(faults.actions), err);
    status = l.run();
  }
  if (local)
    caf::anon_send_exit(local, caf::exit_reason::user_shutdown);
  return status;
}

} // namespace troupe::cluster
