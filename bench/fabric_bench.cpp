// The fabric link (ports/fabric_link) moving 112 KiB KV blocks over libfabric's shm and tcp
// providers, beside the physical floor measured in the same run: memcpy of the same bytes
// (what shm can at best approach), process_vm_readv of the same bytes (the cross-memory-attach
// copy by which libfabric 1.17's shm provider moves a large message: shm's own floor), and a
// plain loopback TCP socket pair moving the same blocks request/response (what the tcp
// provider can at best approach).
//
// Every case moves `--blocks` blocks (distinct source blocks, each pulled into one of a set of
// reused destination buffers, as a KV pool would) two ways:
// - throughput: `--depth` transfers in flight (pipelined), GB/s = bytes / wall time;
// - latency: one transfer at a time, the per-block time's p50 and p99.
// The fabric cases offer the blocks on one endpoint and pull them into caller buffers
// (pull_into_async) from another endpoint of the same process (two progress threads).
// Rounds are interleaved (every case once per round); the table gives min and median over the
// rounds, and the load average before and after.
//
// `--kib 7168` moves 7 MiB per transfer (a 64-block request's KV in one pull) instead.
//
// Every buffer comes from malloc. Run with GLIBC_TUNABLES=glibc.malloc.hugetlb=1 to back them
// with transparent huge pages, as every `troupe node` does (the header
// line says which): process_vm_readv pins the pages it copies, one by one.
//
//   build/bench/bench_fabric [--rounds N] [--blocks N] [--depth N] [--kib N]
#include "ports/fabric_link.hpp"

#include <caf/error.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

namespace {

using steady = std::chrono::steady_clock;
// The transfer size (--kib; default one 128-token block of V4.1 block KV), the distinct source
// buffers (7 MiB in all, at least 2) and the reused destination buffers.
std::size_t block_bytes = 112 * 1024;
std::size_t sources = 64;
constexpr std::size_t targets = 16;

double seconds(steady::duration d) {
  return std::chrono::duration<double>(d).count();
}

struct result {
  double gbps = 0;   // pipelined throughput
  double p50_us = 0; // serial latency
  double p99_us = 0;
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

std::vector<std::string> make_sources() {
  std::vector<std::string> out;
  std::uint64_t x = 88172645463325252ull;
  for (std::size_t b = 0; b < sources; ++b) {
    std::string s(block_bytes, '\0');
    for (auto& c : s) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      c = static_cast<char>(x);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// -- memcpy --------------------------------------------------------------------------------

result run_memcpy(const std::vector<std::string>& src, std::vector<std::string>& dst,
                  std::size_t blocks) {
  result r;
  auto t0 = steady::now();
  for (std::size_t i = 0; i < blocks; ++i)
    std::memcpy(dst[i % targets].data(), src[i % sources].data(), block_bytes);
  r.gbps = static_cast<double>(blocks * block_bytes) / seconds(steady::now() - t0) / 1e9;
  std::vector<double> lat;
  for (std::size_t i = 0; i < blocks; ++i) {
    auto t = steady::now();
    std::memcpy(dst[i % targets].data(), src[i % sources].data(), block_bytes);
    lat.push_back(seconds(steady::now() - t) * 1e6);
  }
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  return r;
}

// -- process_vm_readv: the copy shm makes, here from this process into itself ---------------

result run_cma(const std::vector<std::string>& src, std::vector<std::string>& dst,
               std::size_t blocks) {
  const pid_t self = ::getpid();
  auto copy = [&](std::size_t i) {
    iovec to{dst[i % targets].data(), block_bytes};
    iovec from{const_cast<char*>(src[i % sources].data()), block_bytes};
    return ::process_vm_readv(self, &to, 1, &from, 1, 0) == static_cast<ssize_t>(block_bytes);
  };
  result r;
  std::size_t failed = 0;
  auto t0 = steady::now();
  for (std::size_t i = 0; i < blocks; ++i)
    failed += copy(i) ? 0 : 1;
  r.gbps = static_cast<double>(blocks * block_bytes) / seconds(steady::now() - t0) / 1e9;
  std::vector<double> lat;
  for (std::size_t i = 0; i < blocks; ++i) {
    auto t = steady::now();
    failed += copy(i) ? 0 : 1;
    lat.push_back(seconds(steady::now() - t) * 1e6);
  }
  if (failed > 0)
    std::printf("  process_vm_readv: %zu copies failed (%s)\n", failed, std::strerror(errno));
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  return r;
}

// -- a bare loopback TCP socket: request an 8-byte block index, get the block ----------------

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    auto k = ::write(fd, p, n);
    if (k <= 0)
      return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool read_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    auto k = ::read(fd, p, n);
    if (k <= 0)
      return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

struct socket_pair {
  int client = -1;
  std::thread server;

  explicit socket_pair(const std::vector<std::string>& src) {
    int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listener, 1);
    socklen_t len = sizeof addr;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    client = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    int conn = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    ::setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    server = std::thread([conn, &src] {
      std::uint64_t index = 0;
      while (read_all(conn, reinterpret_cast<char*>(&index), sizeof index))
        if (!write_all(conn, src[index % sources].data(), block_bytes))
          break;
      ::close(conn);
    });
  }

  ~socket_pair() {
    ::shutdown(client, SHUT_RDWR);
    ::close(client);
    server.join();
  }
};

result run_socket(socket_pair& s, std::vector<std::string>& dst, std::size_t blocks,
                  std::size_t depth) {
  result r;
  auto t0 = steady::now();
  std::size_t sent = 0;
  for (; sent < std::min(depth, blocks); ++sent)
    write_all(s.client, reinterpret_cast<const char*>(&sent), sizeof sent);
  for (std::size_t got = 0; got < blocks; ++got) {
    read_all(s.client, dst[got % targets].data(), block_bytes);
    if (sent < blocks) {
      write_all(s.client, reinterpret_cast<const char*>(&sent), sizeof sent);
      ++sent;
    }
  }
  r.gbps = static_cast<double>(blocks * block_bytes) / seconds(steady::now() - t0) / 1e9;
  std::vector<double> lat;
  for (std::size_t i = 0; i < blocks; ++i) {
    auto t = steady::now();
    write_all(s.client, reinterpret_cast<const char*>(&i), sizeof i);
    read_all(s.client, dst[i % targets].data(), block_bytes);
    lat.push_back(seconds(steady::now() - t) * 1e6);
  }
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  return r;
}

// -- the fabric link ------------------------------------------------------------------------

struct fabric_case {
  std::unique_ptr<troupe::ports::fabric_endpoint> server;
  std::unique_ptr<troupe::ports::fabric_endpoint> client;
  std::string name;
};

bool open_fabric(const std::string& provider, const std::vector<std::string>& src,
                 fabric_case& out) {
  troupe::ports::fabric_params p;
  p.provider = provider;
  auto a = troupe::ports::fabric_endpoint::open(p);
  auto b = troupe::ports::fabric_endpoint::open(p);
  if (!a || !b) {
    std::printf("fabric %s unavailable: %s\n", provider.c_str(),
                caf::to_string(!a ? a.error() : b.error()).c_str());
    return false;
  }
  out.server = std::move(*a);
  out.client = std::move(*b);
  out.name = out.server->provider_name();
  for (std::size_t i = 0; i < sources; ++i)
    out.server->offer(i, std::make_shared<const std::string>(src[i]));
  return true;
}

result run_fabric(fabric_case& f, std::vector<std::string>& dst, std::size_t blocks,
                  std::size_t depth) {
  result r;
  const auto& peer = f.server->address();
  const auto timeout = std::chrono::seconds(30);
  std::mutex m;
  std::condition_variable cv;
  std::size_t done = 0, failed = 0;
  std::atomic<std::size_t> next{0};
  // `depth` lanes; each completion starts the lane's next pull (from the progress thread).
  std::function<void(std::size_t)> start = [&](std::size_t lane) {
    auto i = next.fetch_add(1);
    if (i >= blocks)
      return;
    auto& buf = dst[lane % targets];
    f.client->pull_into_async(peer, i % sources, buf.data(), buf.size(), timeout,
                              [&, lane](caf::expected<std::uint64_t> got) {
                                start(lane);
                                std::lock_guard<std::mutex> g{m};
                                ++done;
                                if (!got || *got != block_bytes)
                                  ++failed;
                                cv.notify_one();
                              });
  };
  auto t0 = steady::now();
  for (std::size_t lane = 0; lane < std::min(depth, blocks); ++lane)
    start(lane);
  {
    std::unique_lock<std::mutex> lock{m};
    cv.wait(lock, [&] { return done == blocks; });
  }
  r.gbps = static_cast<double>(blocks * block_bytes) / seconds(steady::now() - t0) / 1e9;
  std::vector<double> lat;
  for (std::size_t i = 0; i < blocks; ++i) {
    auto& buf = dst[i % targets];
    std::promise<bool> ok;
    auto t = steady::now();
    f.client->pull_into_async(peer, i % sources, buf.data(), buf.size(), timeout,
                              [&](caf::expected<std::uint64_t> got) {
                                ok.set_value(got && *got == block_bytes);
                              });
    if (!ok.get_future().get())
      ++failed;
    lat.push_back(seconds(steady::now() - t) * 1e6);
  }
  if (failed > 0)
    std::printf("  %s: %zu transfers failed\n", f.name.c_str(), failed);
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  return r;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double min_of(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}

double max_of(const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
}

} // namespace

int main(int argc, char** argv) {
  int rounds = 5;
  std::size_t blocks = 2000, depth = 8;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0)
      rounds = std::max(1, std::atoi(argv[i + 1]));
    else if (std::strcmp(argv[i], "--blocks") == 0)
      blocks = static_cast<std::size_t>(std::max(1, std::atoi(argv[i + 1])));
    else if (std::strcmp(argv[i], "--depth") == 0)
      depth = static_cast<std::size_t>(std::max(1, std::atoi(argv[i + 1])));
    else if (std::strcmp(argv[i], "--kib") == 0)
      block_bytes = static_cast<std::size_t>(std::max(1, std::atoi(argv[i + 1]))) * 1024;
  }
  depth = std::min(depth, targets);
  sources = std::max<std::size_t>(2, 64 * 112 * 1024 / block_bytes);
  auto src = make_sources();
  std::vector<std::string> dst(targets, std::string(block_bytes, '\0'));
  double load[3] = {};
  getloadavg(load, 3);
  std::printf("fabric link: %zu KiB blocks, %zu per case, %zu in flight, %d interleaved rounds, "
              "%u hardware threads; load average %.2f\n",
              block_bytes / 1024, blocks, depth, rounds, std::thread::hardware_concurrency(),
              load[0]);
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  std::printf("malloc: %s\n", tunables && std::strstr(tunables, "glibc.malloc.hugetlb=1")
                                 ? "transparent huge pages (glibc.malloc.hugetlb=1)"
                                 : "4 KiB pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1 for huge)");

  fabric_case shm, tcp;
  bool have_shm = open_fabric("shm", src, shm);
  bool have_tcp = open_fabric("tcp", src, tcp);
  socket_pair sock{src};

  struct series {
    std::string name;
    std::vector<double> gbps, p50, p99;
  };
  std::vector<series> all(5);
  all[0].name = "memcpy (floor for shm)";
  all[1].name = "process_vm_readv (shm's copy)";
  all[2].name = "bare TCP socket (floor for tcp)";
  all[3].name = "fabric " + (have_shm ? shm.name : std::string{"shm"});
  all[4].name = "fabric " + (have_tcp ? tcp.name : std::string{"tcp"});
  auto add = [](series& s, const result& r) {
    s.gbps.push_back(r.gbps);
    s.p50.push_back(r.p50_us);
    s.p99.push_back(r.p99_us);
  };
  for (int round = 0; round < rounds; ++round) {
    add(all[0], run_memcpy(src, dst, blocks));
    add(all[1], run_cma(src, dst, blocks));
    add(all[2], run_socket(sock, dst, blocks, depth));
    if (have_shm)
      add(all[3], run_fabric(shm, dst, blocks, depth));
    if (have_tcp)
      add(all[4], run_fabric(tcp, dst, blocks, depth));
  }
  std::printf("%-34s %22s %22s %12s\n", "case", "GB/s min / median / max",
              "p50 us min / median", "p99 us med");
  for (auto& s : all) {
    if (s.gbps.empty())
      continue;
    std::printf("%-34s %6.2f / %6.2f / %6.2f %10.1f / %8.1f %12.1f\n", s.name.c_str(),
                min_of(s.gbps), median_of(s.gbps), max_of(s.gbps), min_of(s.p50),
                median_of(s.p50), median_of(s.p99));
  }
  if (have_shm) {
    std::printf("shm / memcpy throughput (medians): %.2f  (goal >= 0.80)\n",
                median_of(all[3].gbps) / median_of(all[0].gbps));
    std::printf("process_vm_readv / memcpy: %.2f, shm / process_vm_readv: %.2f (medians)\n",
                median_of(all[1].gbps) / median_of(all[0].gbps),
                median_of(all[3].gbps) / median_of(all[1].gbps));
  }
  if (have_tcp)
    std::printf("tcp / bare socket throughput (medians): %.2f  (goal >= 0.80)\n",
                median_of(all[4].gbps) / median_of(all[2].gbps));
  getloadavg(load, 3);
  std::printf("load average after: %.2f\n", load[0]);
  return 0;
}
