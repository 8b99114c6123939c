// fabric_link: bulk bytes between processes over libfabric (RDM endpoints), and its port actor.
//
// A request's KV is prefilled in one process and decoded in another; SWA rings live in the
// host memory of the machine that produced them and are fetched on demand. Those bytes (112
// KiB per 128-token block, many MiB per request) must move between processes at close to the
// machine's copy or network speed, without going through CAF's middleman. A
// `fabric_endpoint` owns one reliable-datagram (FI_EP_RDM) endpoint of a libfabric provider
// chosen by name, as in the topology: "shm" (processes on one machine), "tcp" (any IP
// network; libfabric layers ofi_rxm over it for RDM), and "verbs", "efa", "cxi" in production
// (passed through to libfabric, not tested here).
//
// **Protocol: offer, then pull by tagged request + tagged reply.** The producer offers bytes
// under a 64-bit id (`offer`): nothing moves yet. A consumer that holds the producer's address
// and the id pulls: it first posts tagged receives for the reply (a 16-byte header and the
// data, split into chunks of at most the provider's maximum message size), then sends a small
// tagged request carrying its own address, the id, and how many bytes it has room for. The
// producer's progress thread answers with the header (status, size) and, when the bytes fit,
// sends them straight from the offered buffer to the posted receives: one round trip, zero
// copies on our side. When they do not fit (the consumer guessed too small a size), the header
// says so and the consumer re-asks with a buffer of the exact size; a ticket carries the size,
// so a consumer that knows it never needs the second round. Unknown (or withdrawn) ids get a
// "not found" header.
//
// Why tagged messages rather than an RMA read of registered memory: both providers here do
// tagged messages natively and move large ones with their rendezvous paths (shm: one
// cross-memory-attach copy, process_vm_readv, when the kernel allows it; tcp: the socket),
// so the data copy is the same as an RMA read's, while RMA needs memory registration, key
// and address exchange and a completion message telling the producer the read is over (and
// tcp;ofi_rxm emulates RMA over the same socket anyway). The receives are posted before the
// request leaves, so the data never lands as an unexpected message in a provider bounce
// buffer.
//
// Threading: every libfabric call of an endpoint runs on its own progress thread (both
// providers need manual data progress: nothing moves unless someone polls the completion
// queue). The thread polls while transfers are in flight or were recently, and sleeps in
// short naps (at most 250 us) when idle, so an idle endpoint costs little CPU. The public
// functions are thread-safe; pull callbacks run on the progress thread and must not block.
// `spawn_fabric_link` wraps an endpoint in a port actor (runtime/ports/fabric.hpp): the actor
// never blocks a CAF scheduler thread, a pull's reply comes back to it by message.
//
// Not done here: memory registration for providers that demand FI_MR_LOCAL of the application
// (the endpoint does not ask for it, so such a provider is simply not found; rxm over verbs
// and efa register internally), and an authentication of peers (an endpoint serves any peer
// that can reach it and knows an id: bind it to a private network).
#pragma once

#include "runtime/ports/fabric.hpp"
#include "runtime/time.hpp"

#include <caf/expected.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace troupe::ports {

/// What a fabric endpoint is opened with.
struct fabric_params {
  /// The provider, as named in the topology: "shm", "tcp", "verbs", "efa" or "cxi".
  std::string provider = "tcp";
  /// For network providers, the local address (host name or IP) to bind to; the port is
  /// chosen by the system. Empty: the provider's default interface. Ignored by shm.
  std::string host = "127.0.0.1";
  /// The largest message this endpoint sends or receives; bigger transfers are split. 0: the
  /// provider's maximum message size, capped at 64 MiB (so a huge transfer is pipelined).
  std::uint64_t max_chunk_bytes = 0;
  /// Room a pull without a size hint (ticket bytes 0) posts before asking; bigger offers
  /// then take a second round trip.
  std::uint64_t default_pull_bytes = 256 * 1024;
  /// How long the receives of a pull that timed out stay posted (so a late reply lands in
  /// them instead of as an unexpected message) before they are cancelled.
  runtime::duration linger = std::chrono::seconds(10);
};

/// Counters of one endpoint, all since it opened.
struct fabric_stats {
  std::uint64_t offers = 0;          // offers currently held
  std::uint64_t served = 0;          // pull requests answered with data
  std::uint64_t served_bytes = 0;    // bytes sent in those answers
  std::uint64_t sending = 0;         // answers with sends not all completed yet
  std::uint64_t not_found = 0;       // pull requests for unknown ids
  std::uint64_t pulls_ok = 0;        // own pulls completed with data
  std::uint64_t pulls_failed = 0;    // own pulls completed with an error
  std::uint64_t second_rounds = 0;   // own pulls that had to re-ask with a bigger buffer
};

/// One RDM endpoint of a libfabric provider with its own progress thread. Shared bytes are
/// offered under ids and pulled by peers; see the file comment for the protocol.
class fabric_endpoint {
public:
  /// The bytes of an offer, shared with the endpoint until withdrawn and no longer sent.
  using bytes_ptr = std::shared_ptr<const std::string>;
  /// Called once per pull, on the progress thread, with the bytes or the error.
  using pull_callback = std::function<void(caf::expected<std::string>)>;

  /// Opens an endpoint: finds the provider (FI_EP_RDM, FI_TAGGED), opens fabric, domain,
  /// completion queue, address vector and endpoint, posts the request receives and starts
  /// the progress thread. Errors (errc::unavailable) name the provider and libfabric's
  /// message (fi_strerror); an unknown provider name is errc::invalid_argument.
  static caf::expected<std::unique_ptr<fabric_endpoint>> open(fabric_params params);

  /// Stops the progress thread: pulls still pending complete with errc::unavailable
  /// ("endpoint closed"), offers are dropped, the endpoint is closed. Blocks until the
  /// thread has exited (at most one nap).
  ~fabric_endpoint();

  fabric_endpoint(const fabric_endpoint&) = delete;
  fabric_endpoint& operator=(const fabric_endpoint&) = delete;

  /// The endpoint's address (fi_getname): opaque bytes that a peer of the same provider
  /// passes to `pull`. Safe to put in an actor message (a std::string of bytes).
  const std::string& address() const;

  /// The provider libfabric chose, e.g. "tcp;ofi_rxm" or "shm".
  const std::string& provider_name() const;

  /// The chunk size this endpoint splits transfers into.
  std::uint64_t chunk_bytes() const;

  /// Makes `bytes` (non-null) available to peers under `id`, replacing an earlier offer of
  /// that id (pulls already being answered keep the old bytes). Returns the ticket.
  runtime::fabric_ticket offer(std::uint64_t id, bytes_ptr bytes);

  /// Withdraws offer `id`: later pull requests for it get "not found"; answers already being
  /// sent finish. Returns false if nothing was offered under `id`.
  bool withdraw(std::uint64_t id);

  /// Pulls offer `id` from the endpoint at `peer`. `expected_bytes` is a size hint (0: use
  /// `default_pull_bytes`); a wrong hint costs a second round trip, never a wrong result.
  /// Calls `done` exactly once, on the progress thread: with the bytes, or errc::not_found
  /// (no such offer there), errc::unavailable (peer unreachable, malformed address, endpoint
  /// closed) or caf::sec::request_timeout (no complete answer within `timeout`).
  void pull_async(std::string peer, std::uint64_t id, std::uint64_t expected_bytes,
                  runtime::duration timeout, pull_callback done);

  /// Pulls offer `id` from `peer` into the caller's buffer `dst` of `capacity` bytes (no
  /// allocation, no zero-filling: the path for buffers that are reused). `dst` must stay
  /// valid until `done` is called. Calls `done` once, on the progress thread, with the
  /// number of bytes received, or the errors of `pull_async`, or errc::invalid_argument when
  /// the offer is bigger than `capacity`.
  void pull_into_async(std::string peer, std::uint64_t id, char* dst, std::uint64_t capacity,
                       runtime::duration timeout,
                       std::function<void(caf::expected<std::uint64_t>)> done);

  /// `pull_async`, waiting for the outcome on the calling thread (never longer than the
  /// timeout plus one progress step). Do not call it from the progress thread (a callback).
  caf::expected<std::string> pull(const std::string& peer, std::uint64_t id,
                                  std::uint64_t expected_bytes, runtime::duration timeout);

  /// A snapshot of the counters.
  fabric_stats stats() const;

  struct impl;

private:
  explicit fabric_endpoint(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Opens an endpoint with `params` and spawns the fabric link port around it
/// (runtime::fabric_link_port: offer, withdraw, pull). The actor is event-based and never
/// blocks: offers and withdrawals are answered at once; a pull is handed to the endpoint's
/// progress thread, which answers the actor by message, and the actor then replies. The
/// endpoint closes when the actor exits (pending pulls then fail). Errors: those of
/// `fabric_endpoint::open`.
caf::expected<runtime::fabric_link_port> spawn_fabric_link(caf::actor_system& sys,
                                                           fabric_params params);

} // namespace troupe::ports
