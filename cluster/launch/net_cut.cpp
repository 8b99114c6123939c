#include "cluster/launch/net_cut.hpp"

#include "runtime/errors.hpp"

#include <array>
#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <linux/fib_rules.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <unistd.h>

namespace troupe::cluster {

namespace {

/// Ahead of the main (32766) and default tables' rules.
constexpr std::uint32_t rule_priority = 50;

struct rule_request {
  nlmsghdr header;
  fib_rule_hdr rule;
  std::array<char, 64> attributes;
};

void add_attribute(rule_request& r, std::uint16_t type, const void* data, std::size_t size) {
  auto* a = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(&r) + NLMSG_ALIGN(r.header.nlmsg_len));
  a->rta_type = type;
  a->rta_len = static_cast<std::uint16_t>(RTA_LENGTH(size));
  std::memcpy(RTA_DATA(a), data, size);
  r.header.nlmsg_len = NLMSG_ALIGN(r.header.nlmsg_len) + RTA_ALIGN(a->rta_len);
}

/// Sends one rule message on `fd` and returns the kernel's answer (0 or a negative errno).
int send_rule(int fd, bool on, int family, const void* address, std::size_t size, bool to) {
  rule_request r{};
  r.header.nlmsg_len = NLMSG_LENGTH(sizeof(fib_rule_hdr));
  r.header.nlmsg_type = on ? RTM_NEWRULE : RTM_DELRULE;
  r.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | (on ? NLM_F_CREATE | NLM_F_EXCL : 0);
  r.header.nlmsg_seq = to ? 1 : 2;
  r.rule.family = static_cast<std::uint8_t>(family);
  r.rule.action = FR_ACT_BLACKHOLE;
  const auto bits = static_cast<std::uint8_t>(size * 8);
  (to ? r.rule.dst_len : r.rule.src_len) = bits;
  add_attribute(r, to ? FRA_DST : FRA_SRC, address, size);
  add_attribute(r, FRA_PRIORITY, &rule_priority, sizeof rule_priority);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd, &r, r.header.nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel)
      < 0)
    return -errno;
  std::array<char, 1024> answer{};
  auto n = ::recv(fd, answer.data(), answer.size(), 0);
  if (n < 0)
    return -errno;
  const auto* h = reinterpret_cast<const nlmsghdr*>(answer.data());
  if (!NLMSG_OK(h, static_cast<std::uint32_t>(n)) || h->nlmsg_type != NLMSG_ERROR)
    return -EPROTO;
  return static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
}

} // namespace

caf::error set_cut_off(const std::string& address, bool on) {
  std::array<unsigned char, 16> bytes{};
  int family = AF_INET;
  std::size_t size = 4;
  if (::inet_pton(AF_INET, address.c_str(), bytes.data()) != 1) {
    family = AF_INET6;
    size = 16;
    if (::inet_pton(AF_INET6, address.c_str(), bytes.data()) != 1)
      return runtime::make_error(runtime::errc::invalid_argument,
                                 "cannot cut off '" + address + "': not a numeric IP address");
  }
  int fd = ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0)
    return runtime::make_error(runtime::errc::unavailable,
                               std::string("rtnetlink socket: ") + std::strerror(errno));
  int failed = 0;
  for (bool to : {true, false}) {
    int rc = send_rule(fd, on, family, bytes.data(), size, to);
    // Adding a rule that is there, or removing one that is not: the state asked for holds.
    if (rc != 0 && !(on ? rc == -EEXIST : rc == -ENOENT) && failed == 0)
      failed = -rc;
  }
  ::close(fd);
  if (failed == 0)
    return {};
  return runtime::make_error(
    runtime::errc::unavailable,
    std::string(on ? "cannot cut off " : "cannot reconnect ") + address + ": "
      + std::strerror(failed)
      + (failed == EPERM ? " (routing rules need CAP_NET_ADMIN: run the agent as root)" : ""));
}

} // namespace troupe::cluster
