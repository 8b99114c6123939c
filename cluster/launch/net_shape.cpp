#include "cluster/launch/net_shape.hpp"

#include "runtime/errors.hpp"

#include <caf/expected.hpp>

#include <netlink/errno.h>
#include <netlink/netlink.h>
#include <netlink/route/class.h>
#include <netlink/route/classifier.h>
#include <netlink/route/cls/u32.h>
#include <netlink/route/qdisc.h>
#include <netlink/route/qdisc/htb.h>
#include <netlink/route/tc.h>
#include <netlink/socket.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/if_ether.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace troupe::cluster {

namespace {

/// Offset of the destination address in an IPv4 header (the u32 key's offset).
constexpr int ipv4_destination = 16;
/// When the kernel reports no speed for the interface (bits per second).
constexpr std::uint64_t default_speed = 10'000'000'000ull;

caf::error failure(const std::string& what, const std::string& address, int nl_error) {
  std::string why = nl_geterror(nl_error);
  if (nl_error == -NLE_PERM)
    why += " (traffic control needs CAP_NET_ADMIN: run the agent as root)";
  return runtime::make_error(runtime::errc::unavailable, what + " " + address + ": " + why);
}

/// The interface the kernel routes `to` through: the one holding the source address a UDP
/// socket connected there gets (0 when none).
int route_interface(const in_addr& to) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(9);
  peer.sin_addr = to;
  sockaddr_in local{};
  socklen_t len = sizeof local;
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof peer) == 0
            && ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  ::close(fd);
  if (!ok)
    return 0;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0)
    return 0;
  int index = 0;
  for (auto* a = all; a != nullptr && index == 0; a = a->ifa_next)
    if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET
        && reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == local.sin_addr.s_addr)
      index = static_cast<int>(::if_nametoindex(a->ifa_name));
  ::freeifaddrs(all);
  return index;
}

/// The interface's speed as the kernel reports it, in bits per second.
std::uint64_t interface_speed(int ifindex) {
  char name[IF_NAMESIZE] = {};
  if (::if_indextoname(static_cast<unsigned>(ifindex), name) == nullptr)
    return default_speed;
  std::ifstream in(std::string("/sys/class/net/") + name + "/speed");
  long long mbits = 0;
  if (!(in >> mbits) || mbits <= 0)
    return default_speed;
  return static_cast<std::uint64_t>(mbits) * 1'000'000ull;
}

template <class T, void (*Free)(T*)>
struct owned {
  T* p;
  ~owned() { Free(p); }
};

} // namespace

link_shaper::link_shaper() = default;

link_shaper::~link_shaper() {
  lift_all();
  if (sock_ != nullptr)
    nl_socket_free(sock_);
}

caf::error link_shaper::connect() {
  if (sock_ != nullptr)
    return {};
  sock_ = nl_socket_alloc();
  if (sock_ == nullptr)
    return runtime::make_error(runtime::errc::unavailable, "netlink socket: out of memory");
  if (int rc = nl_connect(sock_, NETLINK_ROUTE); rc < 0) {
    nl_socket_free(sock_);
    sock_ = nullptr;
    return runtime::make_error(runtime::errc::unavailable,
                               std::string("rtnetlink socket: ") + nl_geterror(rc));
  }
  return {};
}

caf::expected<std::uint64_t> link_shaper::slow(const std::string& address, double factor) {
  in_addr to{};
  if (::inet_pton(AF_INET, address.c_str(), &to) != 1)
    return runtime::make_error(runtime::errc::invalid_argument,
                               "cannot slow the link to '" + address
                                 + "': not a numeric IPv4 address");
  if (!(factor > 1))
    return runtime::make_error(runtime::errc::invalid_argument,
                               "cannot slow the link to " + address + " by a factor of "
                                 + std::to_string(factor) + ": expected more than 1");
  if (auto e = connect())
    return e;
  const int ifindex = route_interface(to);
  if (ifindex == 0)
    return runtime::make_error(runtime::errc::unavailable,
                               "cannot slow the link to " + address
                                 + ": no interface routes there");
  auto known = slowed_.find(address);
  if (known != slowed_.end() && known->second.ifindex != ifindex) {
    if (auto e = lift(address))
      return e;
    known = slowed_.end();
  }
  const bool first_on_interface
    = std::none_of(slowed_.begin(), slowed_.end(),
                   [&](const auto& s) { return s.second.ifindex == ifindex; });
  if (first_on_interface) {
    owned<rtnl_qdisc, rtnl_qdisc_put> q{rtnl_qdisc_alloc()};
    rtnl_tc_set_ifindex(TC_CAST(q.p), ifindex);
    rtnl_tc_set_parent(TC_CAST(q.p), TC_H_ROOT);
    rtnl_tc_set_handle(TC_CAST(q.p), TC_HANDLE(1, 0));
    rtnl_tc_set_kind(TC_CAST(q.p), "htb");
    if (int rc = rtnl_qdisc_add(sock_, q.p, NLM_F_CREATE | NLM_F_REPLACE); rc < 0)
      return failure("cannot shape the traffic to", address, rc);
  }
  const std::uint32_t minor = known != slowed_.end() ? known->second.minor : next_minor_++;
  const auto speed = interface_speed(ifindex);
  const auto bits = std::max<std::uint64_t>(8000, static_cast<std::uint64_t>(
                                                    static_cast<double>(speed) / factor));
  owned<rtnl_class, rtnl_class_put> c{rtnl_class_alloc()};
  rtnl_tc_set_ifindex(TC_CAST(c.p), ifindex);
  rtnl_tc_set_parent(TC_CAST(c.p), TC_HANDLE(1, 0));
  rtnl_tc_set_handle(TC_CAST(c.p), TC_HANDLE(1, minor));
  rtnl_tc_set_kind(TC_CAST(c.p), "htb");
  rtnl_htb_set_rate64(c.p, bits / 8);
  rtnl_htb_set_ceil64(c.p, bits / 8);
  int rc = rtnl_class_add(sock_, c.p, NLM_F_CREATE | NLM_F_REPLACE);
  if (rc >= 0 && known == slowed_.end()) {
    owned<rtnl_cls, rtnl_cls_put> f{rtnl_cls_alloc()};
    rtnl_tc_set_ifindex(TC_CAST(f.p), ifindex);
    rtnl_tc_set_parent(TC_CAST(f.p), TC_HANDLE(1, 0));
    rtnl_tc_set_kind(TC_CAST(f.p), "u32");
    rtnl_cls_set_prio(f.p, static_cast<std::uint16_t>(minor));
    rtnl_cls_set_protocol(f.p, ETH_P_IP);
    rtnl_u32_add_key_in_addr(f.p, &to, 32, ipv4_destination, 0);
    rtnl_u32_set_classid(f.p, TC_HANDLE(1, minor));
    rtnl_u32_set_cls_terminal(f.p);
    rc = rtnl_cls_add(sock_, f.p, NLM_F_CREATE | NLM_F_EXCL);
  }
  if (rc < 0) {
    auto e = failure("cannot shape the traffic to", address, rc);
    slowed_[address] = slowed{ifindex, minor};
    lift(address);
    return e;
  }
  slowed_[address] = slowed{ifindex, minor};
  return bits;
}

caf::error link_shaper::lift(const std::string& address) {
  auto it = slowed_.find(address);
  if (it == slowed_.end())
    return {};
  const auto s = it->second;
  slowed_.erase(it);
  // The filter (its priority: every filter there) and the class; then the qdisc, with the
  // interface's last slowdown. Things already gone are no error.
  int failed = 0;
  auto keep = [&](int rc) {
    if (rc < 0 && rc != -NLE_OBJ_NOTFOUND && rc != -NLE_NOADDR && failed == 0)
      failed = rc;
  };
  {
    owned<rtnl_cls, rtnl_cls_put> f{rtnl_cls_alloc()};
    rtnl_tc_set_ifindex(TC_CAST(f.p), s.ifindex);
    rtnl_tc_set_parent(TC_CAST(f.p), TC_HANDLE(1, 0));
    rtnl_tc_set_kind(TC_CAST(f.p), "u32");
    rtnl_cls_set_prio(f.p, static_cast<std::uint16_t>(s.minor));
    rtnl_cls_set_protocol(f.p, ETH_P_IP);
    keep(rtnl_cls_delete(sock_, f.p, 0));
  }
  {
    owned<rtnl_class, rtnl_class_put> c{rtnl_class_alloc()};
    rtnl_tc_set_ifindex(TC_CAST(c.p), s.ifindex);
    rtnl_tc_set_parent(TC_CAST(c.p), TC_HANDLE(1, 0));
    rtnl_tc_set_handle(TC_CAST(c.p), TC_HANDLE(1, s.minor));
    keep(rtnl_class_delete(sock_, c.p));
  }
  if (std::none_of(slowed_.begin(), slowed_.end(),
                   [&](const auto& x) { return x.second.ifindex == s.ifindex; })) {
    owned<rtnl_qdisc, rtnl_qdisc_put> q{rtnl_qdisc_alloc()};
    rtnl_tc_set_ifindex(TC_CAST(q.p), s.ifindex);
    rtnl_tc_set_parent(TC_CAST(q.p), TC_H_ROOT);
    rtnl_tc_set_handle(TC_CAST(q.p), TC_HANDLE(1, 0));
    keep(rtnl_qdisc_delete(sock_, q.p));
  }
  if (failed == 0)
    return {};
  return failure("cannot lift the slowdown of the link to", address, failed);
}

void link_shaper::lift_all() {
  while (!slowed_.empty())
    lift(slowed_.begin()->first);
}

} // namespace troupe::cluster
