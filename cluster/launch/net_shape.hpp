// net_shape: slows this host's traffic to another host's address, for `troupe launch`'s link
// slowdowns.
//
// A `slow` fault of a link (real_faults.hpp) between processes on two hosts is carried out by
// the agents of both: each caps what its host sends to the other host's address at the
// interface's speed divided by the fault's factor, so a transfer between them takes about
// `factor` times as long as the interface's nominal rate allows, the real counterpart of the
// simulator's "each transfer takes factor times its bandwidth time". On the interface that
// routes to the address (the kernel's choice, found by a connected UDP socket) the shaper puts
// an HTB root qdisc (handle 1:, replacing the interface's own until the last slowdown on it
// ends, when the kernel's default comes back); each slowed address gets a class 1:k of that
// rate and a u32 filter on its destination address, at priority k; other traffic is not
// classified and leaves unshaped. The interface's speed is what the kernel reports in
// /sys/class/net/IF/speed (a veth says 10000 Mbit/s), 10 Gbit/s when it reports none.
// IPv4 only. Needs CAP_NET_ADMIN in the host's network namespace, as net_cut.hpp. Calls the
// kernel through rtnetlink with libnl-route, no `tc` process.
#pragma once

#include <caf/error.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

struct nl_sock;

namespace troupe::cluster {

class link_shaper {
public:
  link_shaper();
  ~link_shaper();
  link_shaper(const link_shaper&) = delete;
  link_shaper& operator=(const link_shaper&) = delete;

  /// Caps traffic to numeric IPv4 `address` at the speed of the interface that routes there
  /// divided by `factor` (> 1), replacing the address's previous cap. Returns the cap in
  /// bits per second, or an error naming the address and the kernel's reason.
  caf::expected<std::uint64_t> slow(const std::string& address, double factor);

  /// Lifts the cap on `address` (none: nothing to do); the interface's root qdisc goes with
  /// its last cap.
  caf::error lift(const std::string& address);

  /// Lifts every cap (the agent's stop).
  void lift_all();

private:
  struct slowed {
    int ifindex = 0;
    std::uint32_t minor = 0;
  };
  caf::error connect();
  nl_sock* sock_ = nullptr;
  std::map<std::string, slowed> slowed_;
  std::uint32_t next_minor_ = 0x10;
};

} // namespace troupe::cluster
