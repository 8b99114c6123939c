#include "cluster/sim/progress_bar.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace troupe::cluster::sim {

progress_bar::progress_bar(std::FILE* stream, bool enabled)
    : stream_(stream), active_(enabled && stream != nullptr && isatty(fileno(stream)) != 0),
      start_(std::chrono::steady_clock::now()) {}

double progress_bar::wall_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void progress_bar::update(std::uint64_t done, std::uint64_t total, const std::string& detail,
                          bool force) {
  if (!active_)
    return;
  auto now = std::chrono::steady_clock::now();
  if (!force && drawn_ && now - last_ < std::chrono::milliseconds(100))
    return;
  last_ = now;
  auto wall = wall_s();
  auto share = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 0.0;
  share = std::min(1.0, share);
  std::string eta = "--";
  if (done > 0 && done < total) {
    auto left = wall * static_cast<double>(total - done) / static_cast<double>(done);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0fs", std::ceil(left));
    eta = buf;
  } else if (done >= total) {
    eta = "0s";
  }
  std::string bar(static_cast<std::size_t>(share * 30), '#');
  std::fprintf(stream_, "\r[%-30s] %5.1f%%  %llu/%llu  %s  %.1fs wall, ETA %s\033[K",
               bar.c_str(), share * 100, static_cast<unsigned long long>(done),
               static_cast<unsigned long long>(total), detail.c_str(), wall, eta.c_str());
  std::fflush(stream_);
  drawn_ = true;
}

void progress_bar::finish() {
  if (drawn_) {
    std::fputc('\n', stream_);
    std::fflush(stream_);
    drawn_ = false;
  }
}

progress_bar::~progress_bar() {
  finish();
}

} // namespace troupe::cluster::sim
