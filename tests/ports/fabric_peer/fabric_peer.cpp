// fabric_peer: the other process of the cross-process fabric link tests (tests only).
//
// The shm provider moves data between address spaces (cross-memory attach or shared-memory
// bounce buffers), which two endpoints in one test process never exercise. This helper opens
// an endpoint of the given provider, offers `size` pattern bytes (tests/ports/fabric_pattern.hpp)
// under id 7, prints its address in hex on one line, and then serves until its standard input
// closes or reads "quit" (at most 60 s), printing "served <n>" before it exits.
//
// Usage: troupe_test_fabric_peer <provider> <size> <seed>
#include "../fabric_pattern.hpp"
#include "ports/fabric_link.hpp"

#include <caf/error.hpp>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include <poll.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <provider> <size> <seed>\n", argv[0]);
    return 2;
  }
  troupe::ports::fabric_params params;
  params.provider = argv[1];
  auto size = std::strtoull(argv[2], nullptr, 10);
  auto seed = std::strtoull(argv[3], nullptr, 10);
  auto endpoint = troupe::ports::fabric_endpoint::open(params);
  if (!endpoint) {
    std::printf("error %s\n", caf::to_string(endpoint.error()).c_str());
    std::fflush(stdout);
    return 1;
  }
  auto bytes = std::make_shared<const std::string>(troupe::test::fabric_pattern(size, seed));
  (*endpoint)->offer(7, bytes);
  std::printf("%s\n", troupe::test::to_hex((*endpoint)->address()).c_str());
  std::fflush(stdout);
  // Serve until stdin says quit or closes; bounded at 60 s.
  std::string line;
  for (int waited = 0; waited < 600; ++waited) {
    pollfd pfd{STDIN_FILENO, POLLIN, 0};
    if (::poll(&pfd, 1, 100) > 0) {
      char buf[64];
      auto n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n <= 0)
        break;
      line.append(buf, static_cast<std::size_t>(n));
      if (line.find("quit") != std::string::npos)
        break;
    }
  }
  std::printf("served %llu\n",
              static_cast<unsigned long long>((*endpoint)->stats().served));
  std::fflush(stdout);
  return 0;
}
