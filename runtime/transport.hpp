// transport: publishing and reaching actors across processes, optionally over mutual TLS.
//
// troupe's processes (`troupe launch` and the `troupe node`s it starts) talk through CAF's
// middleman: one process publishes an actor on a TCP port, another connects and gets a proxy
// that it messages like a local actor. In a cluster those links carry prompts and tokens, so
// they must be private and must not accept a stranger: with TLS options the middleman runs
// over CAF's OpenSSL module, every connection is encrypted, and both ends present a
// certificate that must be signed by the cluster's CA (`troupe certs` makes them), so a
// process without such a certificate can neither publish to nor connect to the cluster. There
// is no per-role authorization: any holder of a cluster certificate may message any published
// actor. This file is the one place that knows how CAF is configured for that; callers publish
// and connect through it and get failures as values. The simulated world never loads any of
// it: its "network" is in-process messages.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/timespan.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe::runtime {

/// The files of one process's TLS identity (PEM). All empty: plain TCP.
struct tls_options {
  /// The cluster CA's certificate: peers must present a certificate it signed.
  std::string ca_file;
  /// This process's certificate (signed by the CA) and its private key.
  std::string cert_file;
  std::string key_file;
  /// The key's passphrase, if the key is encrypted (`troupe certs` writes unencrypted keys).
  std::string passphrase;

  /// True when any file is named: the process means to use TLS (check_tls says whether the
  /// set is complete and usable).
  bool enabled() const {
    return !ca_file.empty() || !cert_file.empty() || !key_file.empty();
  }
};

/// Checks, before any actor system starts, that `tls` can serve: all three files are named
/// and readable, the certificate and the key parse (with the passphrase) and belong together,
/// and the certificate verifies against the CA file and is valid now. Returns an empty error
/// when TLS is not enabled or everything holds; otherwise a troupe `invalid_argument` error
/// whose context names the file and the problem (see error_text). CAF's OpenSSL module
/// aborts the process when it cannot load these files at connection time, so a process
/// calls this first and refuses to start on an error.
caf::error check_tls(const tls_options& tls);

/// Every link sends a heartbeat this often, and a link on which nothing arrived for
/// `link_timeout` is closed: a peer that stopped (SIGSTOP, a hung host, a cut cable) is then
/// gone for its peers as one that exited is — the monitors of its actors get down messages,
/// so requests reroute — instead of holding them for ever. A process that resumes finds its
/// links closed.
inline constexpr caf::timespan heartbeat_interval = std::chrono::seconds(1);
inline constexpr caf::timespan link_timeout = std::chrono::seconds(8);

/// Adds to `cfg` what inter-process messaging needs: loads caf::io::middleman (with the
/// heartbeats above) and, when
/// `tls.enabled()`, caf::openssl::manager with the CA, certificate, key and passphrase, so
/// that every connection requires a peer certificate signed by that CA (mutual
/// authentication). Automatic (direct) connections between nodes are turned off, so every
/// link is one that publish_actor / connect_actor made. Call it at most once per config,
/// before the actor system is constructed; call check_tls first.
void configure_transport(caf::actor_system_config& cfg, const tls_options& tls);

/// Makes `whom` reachable on `host`:`port` (port 0: a free port the OS picks; host "" or
/// "0.0.0.0": every interface; `reuse`: bind with SO_REUSEADDR, e.g. to take a fixed port
/// again right after a restart) and returns the port bound. In a system configured with TLS
/// only peers with a certificate signed by the cluster CA complete a connection; peers that
/// fail the handshake are dropped and the actor stays published. Errors (no middleman
/// loaded, invalid actor, port in use) are values. The middleman keeps the published actor
/// alive: it must exit (be sent an exit) before the actor system shuts down, or the shutdown
/// waits for it. Blocks the calling thread briefly: call it from a process's setup code,
/// never from an actor handler.
caf::expected<std::uint16_t> publish_actor(caf::actor_system& sys, const caf::actor& whom,
                                           std::uint16_t port, const std::string& host,
                                           bool reuse = false);

/// How long connect_actor waits for a connection and both handshakes by default.
inline constexpr caf::timespan default_connect_timeout = std::chrono::seconds(10);

/// A handle to the actor published at `host`:`port`, over TLS when `sys` was configured with
/// it. Errors are values: connection refused, a failed TLS handshake (the peer's certificate
/// is not signed by our CA, or ours not by theirs, or one side does not speak TLS) as
/// `sec::disconnect_during_handshake` or `sec::cannot_connect_to_node`, nothing published there as
/// `sec::no_actor_published_at_port`, and no answer within `timeout` as
/// `sec::request_timeout`. Connecting again to an endpoint already connected returns the
/// same proxy. Blocks the calling thread up to `timeout`: call it from setup code or a
/// thread of one's own, never from an actor handler.
caf::expected<caf::actor> connect_actor(caf::actor_system& sys, const std::string& host,
                                        std::uint16_t port,
                                        caf::timespan timeout = default_connect_timeout);

/// A one-line text for an error of the transport (or any troupe or CAF error): a troupe
/// error's context message, else CAF's rendering of the code.
std::string error_text(const caf::error& err);

} // namespace troupe::runtime
