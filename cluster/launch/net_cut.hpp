// net_cut: cuts this host off from another host's address, for `troupe launch`'s link faults.
//
// A link partition of a fault plan (real_faults.hpp) between processes on two hosts is carried
// out by the agent of one of them: it adds two policy routing rules of action blackhole, one
// for packets to the other host's address and one for packets from it, ahead of the main
// table (priority 50). Every packet between the two hosts is then dropped in both directions
// as by a broken link: TCP connections stall and retransmit (the kernel flushes its cached
// routes when rules change, so established connections are cut too), new ones time out. The
// rules go when the cut is lifted, and the connections carry on if nothing timed them out in
// between. Needs CAP_NET_ADMIN in the host's network namespace (the tests' hosts are network
// namespaces; an agent run as root). Calls the kernel through rtnetlink, no `ip` process.
#pragma once

#include <caf/error.hpp>

#include <string>

namespace troupe::cluster {

/// Adds (`on`) or removes the two blackhole rules for numeric IPv4 or IPv6 `address`. Removing
/// rules that are not there is not an error. Errors name the address and the kernel's reason
/// (errc::invalid_argument for an address that is not numeric, errc::unavailable otherwise).
caf::error set_cut_off(const std::string& address, bool on);

} // namespace troupe::cluster
