// line_ostream: each line reaches the descriptor in one write, so processes sharing a pipe
// (troupe launch and its nodes on one stderr) never cut each other's lines.
#include "runtime/line_stream.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <string>

using troupe::runtime::line_ostream;

namespace {

std::string read_available(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0)
      return out;
    out.append(buf, static_cast<std::size_t>(n));
  }
}

} // namespace

TEST_CASE("a line reaches the descriptor only once it is complete") {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  REQUIRE(::fcntl(p[0], F_SETFL, O_NONBLOCK) == 0);
  {
    line_ostream out{p[1]};
    out << "troupe node[decode/0]: " << 6 << std::flush;
    CHECK(read_available(p[0]).empty());
    out << " request(s) forwarded\nsecond ";
    CHECK(read_available(p[0]) == "troupe node[decode/0]: 6 request(s) forwarded\n");
    out << "line";
  } // an unfinished line is written when the stream goes
  CHECK(read_available(p[0]) == "second line");
  ::close(p[0]);
  ::close(p[1]);
}

TEST_CASE("lines written piecewise by several processes on one pipe stay whole") {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  constexpr int writers = 4, lines = 500;
  for (int w = 0; w < writers; ++w) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(p[0]);
      {
        line_ostream out{p[1]};
        for (int i = 0; i < lines; ++i)
          out << "writer " << w << ": line " << i << " of " << lines << ", with "
              << std::string(static_cast<std::size_t>(i % 97), 'x') << " end\n";
      }
      ::_exit(0);
    }
  }
  ::close(p[1]);
  std::string all;
  char buf[8192];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;)
    all.append(buf, static_cast<std::size_t>(n));
  ::close(p[0]);
  for (int w = 0; w < writers; ++w) {
    int status = 0;
    ::wait(&status);
    CHECK(WIFEXITED(status));
  }
  std::istringstream in{all};
  std::set<std::string> seen;
  for (std::string l; std::getline(in, l);) {
    int w = -1, i = -1;
    REQUIRE_MESSAGE(std::sscanf(l.c_str(), "writer %d: line %d", &w, &i) == 2, l);
    std::string expect = "writer " + std::to_string(w) + ": line " + std::to_string(i) + " of " +
                         std::to_string(lines) + ", with " +
                         std::string(static_cast<std::size_t>(i % 97), 'x') + " end";
    CHECK_MESSAGE(l == expect, l);
    seen.insert(l);
  }
  CHECK(seen.size() == static_cast<std::size_t>(writers * lines));
}
