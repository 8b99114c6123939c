// progress_bar: the one-line progress display of troupe sim, troupe swarm and bench_sim.
//
// A long simulation or swarm should say how far it is and how long it has left, but a log file
// or a pipe should not fill up with redrawn lines. So the bar is drawn, redrawn in place with
// a carriage return, only when its stream is a terminal, and not at all otherwise; it is
// redrawn at most ten times a second of wall time whatever the caller's rate of updates.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace troupe::cluster::sim {

class progress_bar {
public:
  /// A bar on `stream` (a C stream, e.g. stderr); drawn only when `enabled` and `stream` is a
  /// terminal.
  progress_bar(std::FILE* stream, bool enabled);

  /// Redraws the bar: `done` of `total` units (e.g. requests, seeds) and `detail` (e.g.
  /// virtual time, events/s), with the wall time so far and an ETA from the rate so far.
  /// `force` draws even within a tenth of a second of the last draw.
  void update(std::uint64_t done, std::uint64_t total, const std::string& detail,
              bool force = false);

  /// Ends the line if anything was drawn. Called by the destructor too.
  void finish();

  ~progress_bar();

  /// Whether the bar draws at all.
  bool active() const noexcept { return active_; }

  /// Wall seconds since the bar was made.
  double wall_s() const;

private:
  std::FILE* stream_;
  bool active_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_{};
};

} // namespace troupe::cluster::sim
