#include "ports/rank_processes.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "kernels/model_config.hpp"
#include "ports/cpu_device.hpp"

extern char** environ;

namespace troupe::ports {

namespace {

std::string joined(const std::vector<std::int32_t>& ranks) {
  std::string s;
  for (auto r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace

std::optional<pid_t> find_rank_process(pid_t parent, std::uint32_t rank) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const auto name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    // stat: "pid (comm) state ppid ...", the comm may hold spaces and parentheses.
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    if (!(rest >> state >> ppid) || ppid != parent) continue;
    std::ifstream cmdline(e.path() / "cmdline");
    std::vector<std::string> argv;
    for (std::string arg; std::getline(cmdline, arg, '\0');) argv.push_back(arg);
    if (argv.size() < 2 || argv[1] != "ep-rank") continue;
    auto flag = std::find(argv.begin(), argv.end(), "--ranks");
    if (flag == argv.end() || std::next(flag) == argv.end()) continue;
    std::istringstream ranks(*std::next(flag));
    for (std::string r; std::getline(ranks, r, ',');)
      if (r == std::to_string(rank)) return static_cast<pid_t>(std::stol(name));
  }
  return std::nullopt;
}

struct rank_processes::children {
  struct child {
    pid_t pid = -1;
    std::vector<std::int32_t> ranks;
    bool exited = false;
    int status = 0;
    bool counted = false;  // its ranks were reported lost
  };
  std::mutex mutex;
  std::condition_variable stop_watching;
  bool stopping = false;
  std::vector<child> all;

  /// Reaps those that ended; returns the ranks of those a signal ended that were not counted
  /// yet (counting them), with how. Called with the mutex held.
  std::uint32_t newly_killed(std::string& why) {
    std::uint32_t ranks = 0;
    for (auto& c : all) {
      if (!c.exited && ::waitpid(c.pid, &c.status, WNOHANG) == c.pid) c.exited = true;
      if (!c.exited || !WIFSIGNALED(c.status) || c.counted) continue;
      c.counted = true;
      ranks += static_cast<std::uint32_t>(c.ranks.size());
      std::string list;
      for (auto r : c.ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
      const char* name = ::sigabbrev_np(WTERMSIG(c.status));
      why += (why.empty() ? "" : "; ") + std::string("the process of rank")
             + (c.ranks.size() > 1 ? "s " : " ") + list + " (pid " + std::to_string(c.pid)
             + ") was killed by "
             + (name != nullptr ? "SIG" + std::string(name)
                                : "signal " + std::to_string(WTERMSIG(c.status)));
    }
    return ranks;
  }

  bool any_counted() const {
    return std::any_of(all.begin(), all.end(), [](const child& c) { return c.counted; });
  }
};

rank_processes::rank_processes() : children_(std::make_unique<children>()) {}

rank_processes::rank_processes(rank_processes&& o) noexcept
    : children_(std::exchange(o.children_, nullptr)),
      watcher_(std::move(o.watcher_)) {}

rank_processes& rank_processes::operator=(rank_processes&& o) noexcept {
  if (this != &o) {
    reap_all();
    children_ = std::exchange(o.children_, nullptr);
    watcher_ = std::move(o.watcher_);
  }
  return *this;
}

rank_processes::~rank_processes() { reap_all(); }

bool rank_processes::empty() const {
  if (!children_) return true;  // moved from
  std::lock_guard lock(children_->mutex);
  return children_->all.empty();
}

kernels::result<std::vector<kernels::ep_peer>> rank_processes::start(
  const std::filesystem::path& program, ep_rank_options o, std::uint32_t per_process) {
  using r = kernels::result<std::vector<kernels::ep_peer>>;
  if (!children_) children_ = std::make_unique<children>();  // moved from
  std::vector<kernels::ep_peer> peers;
  auto undo = [&](const std::string& why) {
    for (auto& p : peers) ::close(p.fd);
    reap_all();
    return r::failure(why);
  };
  for (auto first = per_process; first < o.group; first += per_process) {
    std::vector<std::int32_t> ranks;
    for (auto rank = first; rank < std::min(o.group, first + per_process); ++rank)
      ranks.push_back(static_cast<std::int32_t>(rank));
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      return undo(std::string("EP rank processes: socketpair: ") + std::strerror(errno));
    std::vector<std::string> args{program.string(), "ep-rank", "--model", o.model_dir.string(),
                                  "--threads", std::to_string(o.threads), "--group",
                                  std::to_string(o.group), "--ranks", joined(ranks), "--fd", "3"};
    if (!o.engram_map.empty()) {
      args.emplace_back("--engram-map");
      args.push_back(o.engram_map);
    }
    if (!o.batch_invariant) args.emplace_back("--fast");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, sv[1], 3);  // dup2 clears close-on-exec
    // Nothing else of the device's process (its listening sockets, other groups' sockets).
    posix_spawn_file_actions_addclosefrom_np(&actions, 4);
    pid_t pid = -1;
    const int err = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(sv[1]);
    if (err != 0) {
      ::close(sv[0]);
      return undo("EP rank processes: cannot start " + program.string() + ": "
                  + std::strerror(err));
    }
    {
      std::lock_guard lock(children_->mutex);
      children_->all.push_back({pid, ranks});
    }
    peers.push_back({sv[0], std::move(ranks)});
  }
  return peers;
}

std::uint32_t rank_processes::killed_ranks(std::chrono::milliseconds wait) {
  if (!children_) return 0;  // moved from
  const auto until = std::chrono::steady_clock::now() + wait;
  for (;;) {
    std::string why;
    {
      std::lock_guard lock(children_->mutex);
      const auto ranks = children_->newly_killed(why);
      if (ranks > 0 || children_->any_counted() || std::chrono::steady_clock::now() >= until)
        return ranks;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void rank_processes::watch(killed_fn on_killed) {
  watcher_ = std::thread([c = children_.get(), on_killed = std::move(on_killed)] {
    std::unique_lock lock(c->mutex);
    while (!c->stopping) {
      std::string why;
      // Told with the mutex held: a killed_ranks() meanwhile waits until the loss is known.
      if (const auto ranks = c->newly_killed(why); ranks > 0) {
        on_killed(ranks, why);
        return;
      }
      c->stop_watching.wait_for(lock, std::chrono::milliseconds(100));
    }
  });
}

void rank_processes::reap_all() {
  if (!children_) return;  // moved from
  if (watcher_.joinable()) {
    {
      std::lock_guard lock(children_->mutex);
      children_->stopping = true;
    }
    children_->stop_watching.notify_all();
    watcher_.join();
  }
  std::lock_guard lock(children_->mutex);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& c : children_->all) {
    while (!c.exited && ::waitpid(c.pid, nullptr, WNOHANG) != c.pid) {
      if (std::chrono::steady_clock::now() >= until) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    c.exited = true;
  }
  children_->all.clear();
  children_->stopping = false;
}

int run_ep_rank(int fd, const ep_rank_options& o) {
  auto cfg = kernels::load_model_config(o.model_dir);
  auto placement =
    cfg ? kernels::place_experts(static_cast<std::int32_t>(cfg->text.n_routed_experts),
                                 static_cast<std::int32_t>(o.group))
        : kernels::result<kernels::expert_placement>::failure(cfg.error());
  if (!placement) {
    kernels::refuse_ep_peer(fd, o.ranks.size(), placement.error());
    return 1;
  }
  auto prepare = [&](kernels::model& m) -> kernels::result<bool> {
    auto map = set_engram_map(m, o.engram_map);
    if (!map) return kernels::result<bool>::failure(map.error());
    return true;
  };
  auto served = kernels::serve_ep_peer(
    fd, o.model_dir, {.threads = o.threads, .batch_invariant = o.batch_invariant}, *placement,
    o.ranks, prepare);
  return served ? 0 : 1;
}

}  // namespace troupe::ports
