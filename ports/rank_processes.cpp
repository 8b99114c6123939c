#include "ports/rank_processes.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

rank_processes::rank_processes(rank_processes&& o) noexcept
    : children_(std::exchange(o.children_, {})) {}

rank_processes& rank_processes::operator=(rank_processes&& o) noexcept {
  if (this != &o) {
    reap_all();
    children_ = std::exchange(o.children_, {});
  }
  return *this;
}

rank_processes::~rank_processes() { reap_all(); }

kernels::result<std::vector<kernels::ep_peer>> rank_processes::start(
  const std::filesystem::path& program, ep_rank_options o, std::uint32_t per_process) {
  using r = kernels::result<std::vector<kernels::ep_peer>>;
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
    children_.push_back({pid, static_cast<std::uint32_t>(ranks.size())});
    peers.push_back({sv[0], std::move(ranks)});
  }
  return peers;
}

std::uint32_t rank_processes::killed_ranks(std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  for (;;) {
    std::uint32_t ranks = 0;
    for (auto& c : children_) {
      int status = 0;
      if (!c.exited && ::waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.exited = true;
        c.killed = WIFSIGNALED(status);
      }
      if (c.killed) ranks += c.ranks;
    }
    if (ranks > 0 || std::chrono::steady_clock::now() >= until) return ranks;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void rank_processes::reap_all() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& c : children_) {
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
  children_.clear();
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
