// `troupe launch --slurm` (see slurm_launch.hpp).
#include "cluster/launch/slurm_launch.hpp"

#include "cluster/serve_setup.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;

const std::string command = "troupe launch";

/// What a Slurm command printed, and how it ended.
struct ran {
  int status = -1; // the exit status; -1: it could not be started or was killed
  std::string out;
  std::string err;
  bool ok() const { return status == 0; }
  /// Its stderr (else stdout), trimmed, for a message.
  std::string why() const {
    std::string s = err.empty() ? out : err;
    while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
      s.pop_back();
    return s.empty() ? "exit status " + std::to_string(status) : s;
  }
};

/// Runs `argv` (argv[0] found on PATH) with the default signal mask and both outputs captured.
/// (Boost.Process would need Boost.Filesystem's library, a package more, for these few calls.)
ran run(const std::vector<std::string>& argv) {
  ran r;
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0)
    return {-1, "", std::strerror(errno)};
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return {-1, "", std::strerror(errno)};
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(out[0]);
    close(err[0]);
    return {-1, "", argv[0] + ": " + std::strerror(rc)};
  }
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* into[2] = {&r.out, &r.err};
  int open = 2;
  char buf[4096];
  while (open > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0)
        continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        into[i]->append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0)
      close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty())
      out.push_back(l);
  return out;
}

/// The value of `key=` in one line of `scontrol -o` output ("" when absent).
std::string field(const std::string& line, const std::string& key) {
  auto at = line.find(" " + key + "=");
  std::size_t start;
  if (at != std::string::npos)
    start = at + key.size() + 2;
  else if (line.rfind(key + "=", 0) == 0)
    start = key.size() + 1;
  else
    return "";
  return line.substr(start, line.find(' ', start) - start);
}

/// The batch step's output file for `pattern` (sbatch --output): %j / %A the job id, %x the
/// job name, %% a percent sign; nothing for another replacement (the file is not followed).
std::optional<std::string> output_file(const std::string& pattern, const std::string& id,
                                       const std::string& name) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') {
      out += pattern[i];
      continue;
    }
    if (++i == pattern.size())
      return std::nullopt;
    switch (pattern[i]) {
    case 'j':
    case 'A':
      out += id;
      break;
    case 'x':
      out += name;
      break;
    case '%':
      out += '%';
      break;
    default:
      return std::nullopt;
    }
  }
  return out;
}

/// Copies what was appended to a file to a stream, whole lines at a time.
class follower {
public:
  follower(std::string path, std::ostream& to) : path_(std::move(path)), to_(to) {}

  /// Copies the new whole lines (with `all`, also an unfinished last one).
  void poll(bool all = false) {
    std::ifstream in(path_, std::ios::binary);
    if (!in)
      return;
    in.seekg(static_cast<std::streamoff>(offset_));
    std::string fresh((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::size_t end = fresh.size();
    if (!all) {
      auto newline = fresh.rfind('\n');
      if (newline == std::string::npos)
        return;
      end = newline + 1;
    }
    if (end == 0)
      return;
    to_ << fresh.substr(0, end);
    if (fresh[end - 1] != '\n')
      to_ << "\n";
    to_ << std::flush;
    offset_ += end;
  }

private:
  std::string path_;
  std::ostream& to_;
  std::size_t offset_ = 0;
};

/// Where the HTTP API of running job `id` is: "http://HOST:PORT", HOST the control machine's
/// NodeAddr (or `bind` when the control listens on one address only). Empty when unknown.
std::string api_url(const std::string& id, const slurm_options& o) {
  std::string host = o.bind;
  if (host == "0.0.0.0" || host == "::" || host.empty()) {
    auto job = run({"scontrol", "show", "job", "-o", id});
    std::string nodes;
    for (const auto& l : lines_of(job.out))
      if (field(l, "HetJobOffset") == "0" || field(l, "HetJobOffset").empty())
        if (nodes = field(l, "NodeList"); !nodes.empty())
          break;
    if (!job.ok() || nodes.empty())
      return "";
    auto names = lines_of(run({"scontrol", "show", "hostnames", nodes}).out);
    if (names.empty())
      return "";
    auto node = run({"scontrol", "show", "node", "-o", names.front()});
    host = field(node.out, "NodeAddr");
    if (host.empty())
      host = names.front();
  }
  if (host.find(':') != std::string::npos)
    host = "[" + host + "]";
  return "http://" + host + ":" + std::to_string(o.http_port);
}

/// "RUNNING" or "PENDING x2, RUNNING" from one state per component.
std::string summary(const std::vector<std::string>& states) {
  std::map<std::string, int> count;
  for (const auto& s : states)
    ++count[s];
  std::string out;
  for (const auto& [state, n] : count) {
    if (!out.empty())
      out += ", ";
    out += state;
    if (n > 1 && count.size() > 1)
      out += " x" + std::to_string(n);
  }
  return out;
}

} // namespace

int run_slurm_launch(const topology& topo, const slurm_options& o, bool dry_run,
                     std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << command << ": " << msg << "\n";
    return 1;
  };
  auto job = make_slurm_job(topo, o);
  if (!job)
    return fail(job.error());
  if (dry_run) {
    out << job->script;
    return 0;
  }

  // sbatch reads the script at submission: a temporary file is enough.
  std::string script = (std::filesystem::temp_directory_path() / "troupe-XXXXXX.sbatch").string();
  int fd = mkstemps(script.data(), 7);
  if (fd < 0)
    return fail("cannot make a temporary file: " + std::string(std::strerror(errno)));
  bool written = ::write(fd, job->script.data(), job->script.size()) ==
                 static_cast<ssize_t>(job->script.size());
  close(fd);
  if (!written) {
    unlink(script.c_str());
    return fail("cannot write " + script);
  }
  block_stop_signals();
  auto submitted = run({"sbatch", "--parsable", script});
  unlink(script.c_str());
  if (!submitted.ok())
    return fail("sbatch did not take the job: " + submitted.why());
  const std::string id = submitted.out.substr(0, submitted.out.find_first_of(";\n"));
  const std::string name =
    o.job_name.empty() ? "troupe-" + topo.cluster.name : o.job_name;
  err << command << ": submitted Slurm job " << id << " (" << job->components.size()
      << " components: control";
  for (std::size_t i = 1; i < job->components.size(); ++i)
    err << ", " << job->components[i].name;
  err << "); SIGTERM or Ctrl-C drains it\n";
  const std::string pattern = o.output.empty() ? "troupe-%j.out" : o.output;
  std::optional<follower> output;
  if (auto file = output_file(pattern, id, name)) {
    err << command << ": the job's output (" << *file << ") follows\n";
    output.emplace(*file, err);
  } else {
    err << command << ": the job writes its output to " << pattern << " (not followed here)\n";
  }

  // Follow the job until it leaves the queue.
  int stops = 0;
  std::string last;
  bool announced = false;
  int failures = 0;
  for (;;) {
    if (int sig = poll_stop_signal(1000ms); sig != 0) {
      if (stops++ == 0) {
        err << command << ": " << signal_name(sig) << ": draining job " << id
            << " (scancel --signal=TERM; again to cancel it)\n";
        if (auto r = run({"scancel", "--signal=TERM", id}); !r.ok())
          err << command << ": scancel --signal=TERM " << id << ": " << r.why() << "\n";
      } else {
        err << command << ": " << signal_name(sig) << ": cancelling job " << id << "\n";
        if (auto r = run({"scancel", id}); !r.ok())
          err << command << ": scancel " << id << ": " << r.why() << "\n";
      }
    }
    if (output)
      output->poll();
    auto q = run({"squeue", "-h", "-j", id, "-o", "%T"});
    if (!q.ok() && q.why().find("Invalid job id") == std::string::npos) {
      if (++failures == 1 || failures % 60 == 0)
        err << command << ": squeue: " << q.why() << " (still trying)\n";
      continue;
    }
    failures = 0;
    auto states = lines_of(q.out);
    if (states.empty())
      break;
    auto now = summary(states);
    if (now != last) {
      err << command << ": job " << id << ": " << now << "\n";
      last = now;
    }
    if (!announced && now == "RUNNING") {
      if (auto url = api_url(id, o); !url.empty()) {
        err << command << ": job " << id << " runs; the HTTP API will be at " << url
            << " (GET /ready answers 200 once it serves)\n";
        announced = true;
      }
    }
  }
  if (output)
    output->poll(true);

  // How each component ended.
  auto shown = run({"scontrol", "show", "job", "-o", id});
  std::vector<std::string> ends;
  for (const auto& l : lines_of(shown.out))
    if (auto s = field(l, "JobState"); !s.empty())
      ends.push_back(s);
  if (ends.empty())
    return fail("job " + id + " left the queue; its end is unknown (" +
                (shown.ok() ? std::string("slurmctld no longer lists it") : shown.why()) + ")");
  const bool completed = summary(ends) == "COMPLETED";
  err << command << ": job " << id << " ended: " << summary(ends) << "\n";
  return completed ? 0 : 1;
}

} // namespace troupe::cluster
