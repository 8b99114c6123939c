// The inter-process transport (runtime/transport.hpp) between two real-world actor systems in
// this process, over loopback: mutual TLS with certificates from `troupe certs`' code, the
// peers it must refuse (another CA, no TLS), and plain TCP.
#include "certs_fixture.hpp"

#include "runtime/errors.hpp"
#include "runtime/ports/store.hpp"
#include "runtime/transport.hpp"
#include "runtime/world.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <doctest/doctest.h>

#include <openssl/evp.h>
#include <openssl/pem.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

using namespace troupe;
using namespace std::chrono_literals;
using runtime::store_key;

namespace {

/// Generous on a loaded 2-core machine; a refused handshake fails long before it.
constexpr auto connect_timeout = std::chrono::seconds(60);

/// A real-world actor system with the network transport, over TLS when `tls` is enabled.
std::unique_ptr<runtime::world> node(const runtime::tls_options& tls) {
  return std::make_unique<runtime::world>(
    runtime::world_options{.mode = runtime::world_mode::real, .seed = 1, .threads = 2,
                           .network = true, .configure = {}, .tls = tls});
}

/// Answers a store_key with the key's halves swapped (a troupe message type, so the request
/// and the reply cross the wire serialized).
caf::behavior swapper(caf::event_based_actor*) {
  return {[](const store_key& k) { return store_key{k.lo, k.hi}; }};
}

/// Sends `remote` a key and returns its answer, or nothing when the request fails.
std::optional<store_key> round_trip(runtime::world& w, const caf::actor& remote, store_key k) {
  std::optional<store_key> got;
  caf::scoped_actor self{w.system()};
  self->request(remote, connect_timeout, k)
    .receive([&](const store_key& reply) { got = reply; },
             [&](caf::error& err) { MESSAGE("request failed: ", runtime::error_text(err)); });
  return got;
}

/// A swapper published on a free loopback port of a world. The middleman holds a published
/// actor, so the world's shutdown would wait for it for ever: it is killed when this goes out
/// of scope (declare it after its world).
struct published {
  caf::actor actor;
  std::uint16_t port = 0;
  ~published() { caf::anon_send_exit(actor, caf::exit_reason::kill); }
};

published publish_swapper(runtime::world& w) {
  auto actor = w.system().spawn(swapper);
  auto port = runtime::publish_actor(w.system(), actor, 0, "127.0.0.1");
  REQUIRE_MESSAGE(port, runtime::error_text(port.error()));
  REQUIRE(*port != 0);
  return published{actor, *port};
}

/// Connects `client` to the swapper at `port` and checks one round trip.
void check_serves(runtime::world& client, std::uint16_t port, std::uint64_t n) {
  auto remote = runtime::connect_actor(client.system(), "127.0.0.1", port, connect_timeout);
  REQUIRE_MESSAGE(remote, runtime::error_text(remote.error()));
  auto got = round_trip(client, *remote, store_key{n, n + 1});
  REQUIRE(got.has_value());
  CHECK(*got == store_key{n + 1, n});
}

/// Connects `client` to `port` and expects a refusal well before the timeout.
void check_refused(runtime::world& client, std::uint16_t port) {
  auto start = std::chrono::steady_clock::now();
  auto remote = runtime::connect_actor(client.system(), "127.0.0.1", port, connect_timeout);
  auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(remote);
  MESSAGE("refused: ", runtime::error_text(remote.error()));
  CHECK(remote.error() != caf::sec::request_timeout);
  CHECK(took < connect_timeout / 2);
}

} // namespace

TEST_CASE("over mutual TLS a published actor answers a request from another actor system (tls)") {
  test::cluster_certs certs({"control", "engine0"});
  REQUIRE_FALSE(runtime::check_tls(certs.tls("control")));
  REQUIRE_FALSE(runtime::check_tls(certs.tls("engine0")));
  auto server = node(certs.tls("control"));
  auto client = node(certs.tls("engine0"));
  REQUIRE(server->system().has_openssl_manager());
  auto swap = publish_swapper(*server);
  check_serves(*client, swap.port, 7);
  // Connecting again to the same endpoint reuses the connection and still works.
  check_serves(*client, swap.port, 1000);
}

TEST_CASE("a peer with a certificate from another CA cannot connect; the server keeps serving (tls)") {
  test::cluster_certs cluster({"control", "engine0"});
  test::cluster_certs stranger({"intruder"});
  auto server = node(cluster.tls("control"));
  auto swap = publish_swapper(*server);
  {
    // Its own CA and certificate: neither side accepts the other.
    auto intruder = node(stranger.tls("intruder"));
    check_refused(*intruder, swap.port);
  }
  {
    // Trusting the cluster CA but presenting a certificate of another CA: the server refuses.
    auto tls = stranger.tls("intruder");
    tls.ca_file = cluster.tls("control").ca_file;
    CHECK(runtime::check_tls(tls)); // check_tls would have stopped such a process
    auto intruder = node(tls);
    check_refused(*intruder, swap.port);
  }
  auto member = node(cluster.tls("engine0"));
  check_serves(*member, swap.port, 42);
}

// OpenSSL reports a failed I/O call by leaving errors on the calling thread's queue, and
// SSL_get_error trusts that queue: CAF 0.17's OpenSSL sessions never clear it, so one peer's
// failure (a refused handshake, or a peer gone without a TLS close, which is how every CAF
// 0.17 peer leaves) made the next "would block" of every other connection served by the
// same middleman thread look like an error, and dropped them. runtime/transport.cpp clears
// the queue before each call.
TEST_CASE("an established TLS connection survives a refused peer and a peer that leaves (tls)") {
  test::cluster_certs cluster({"control", "engine0", "engine1"});
  test::cluster_certs stranger({"intruder"});
  auto server = node(cluster.tls("control"));
  auto swap = publish_swapper(*server);
  auto member = node(cluster.tls("engine0"));
  auto remote = runtime::connect_actor(member->system(), "127.0.0.1", swap.port, connect_timeout);
  REQUIRE_MESSAGE(remote, runtime::error_text(remote.error()));
  REQUIRE(round_trip(*member, *remote, store_key{1, 2}).has_value());
  {
    auto intruder = node(stranger.tls("intruder"));
    check_refused(*intruder, swap.port);
  }
  for (std::uint64_t n = 0; n < 5; ++n) {
    auto got = round_trip(*member, *remote, store_key{n, 10 + n});
    REQUIRE_MESSAGE(got.has_value(), "round trip ", n, " after the refused peer");
    CHECK(*got == store_key{10 + n, n});
  }
  {
    auto leaving = node(cluster.tls("engine1"));
    check_serves(*leaving, swap.port, 77);
  }  // its actor system ends: its connection closes without a TLS close
  for (std::uint64_t n = 0; n < 5; ++n) {
    auto got = round_trip(*member, *remote, store_key{n, 20 + n});
    REQUIRE_MESSAGE(got.has_value(), "round trip ", n, " after the peer that left");
    CHECK(*got == store_key{20 + n, n});
  }
}

TEST_CASE("a peer without TLS cannot talk to a TLS-published actor, nor a TLS peer to a plain one (tls)") {
  test::cluster_certs certs({"control", "engine0"});
  auto tls_server = node(certs.tls("control"));
  auto tls_swap = publish_swapper(*tls_server);
  auto plain_client = node({});
  REQUIRE_FALSE(plain_client->system().has_openssl_manager());
  check_refused(*plain_client, tls_swap.port);

  auto plain_server = node({});
  auto plain_swap = publish_swapper(*plain_server);
  auto tls_client = node(certs.tls("engine0"));
  check_refused(*tls_client, plain_swap.port);
  // Both servers still serve their own kind.
  check_serves(*plain_client, plain_swap.port, 5);
  check_serves(*tls_client, tls_swap.port, 9);
}

TEST_CASE("plain publish and connect work without TLS (tls)") {
  auto server = node({});
  auto client = node({});
  auto swap = publish_swapper(*server);
  check_serves(*client, swap.port, 3);
  // With SO_REUSEADDR (as a restarted process takes its fixed port again) it works the same.
  auto again = server->system().spawn(swapper);
  auto port = runtime::publish_actor(server->system(), again, 0, "127.0.0.1", true);
  REQUIRE(port);
  check_serves(*client, *port, 4);
  caf::anon_send_exit(again, caf::exit_reason::kill);
}

TEST_CASE("connect_actor returns an error for a port where nothing listens (tls)") {
  // Port 1 (tcpmux) is privileged and served by nothing on a test machine: refused at once.
  auto client = node({});
  auto refused = runtime::connect_actor(client->system(), "127.0.0.1", 1, connect_timeout);
  REQUIRE_FALSE(refused);
  CHECK(refused.error() != caf::sec::request_timeout);
  // The failure leaves the client able to connect elsewhere.
  auto server = node({});
  auto swap = publish_swapper(*server);
  check_serves(*client, swap.port, 11);
}

TEST_CASE("check_tls names what is wrong with a TLS identity (tls)") {
  test::cluster_certs certs({"control", "engine0"});
  CHECK_FALSE(runtime::check_tls({}));
  CHECK_FALSE(runtime::check_tls(certs.tls("control")));

  auto text = [](const caf::error& e) { return runtime::error_text(e); };
  auto partial = certs.tls("control");
  partial.key_file.clear();
  CHECK(text(runtime::check_tls(partial)).find("together") != std::string::npos);

  auto missing = certs.tls("control");
  missing.cert_file = (certs.dir() / "nope.pem").string();
  CHECK(text(runtime::check_tls(missing)).find("nope.pem") != std::string::npos);

  auto mismatched = certs.tls("control");
  mismatched.key_file = certs.tls("engine0").key_file;
  CHECK(text(runtime::check_tls(mismatched)).find("is not the key of") != std::string::npos);

  test::cluster_certs other({"control"});
  auto foreign = certs.tls("control");
  foreign.ca_file = other.tls("control").ca_file;
  CHECK(text(runtime::check_tls(foreign)).find("does not verify") != std::string::npos);
  CHECK(runtime::is(runtime::check_tls(foreign), runtime::errc::invalid_argument));
}

TEST_CASE("a key encrypted with a passphrase serves over TLS when the passphrase is given (tls)") {
  test::cluster_certs certs({"control", "engine0"});
  // engine0's key again, encrypted (AES-256-CBC) under a passphrase.
  auto encrypted = (certs.dir() / "engine0-encrypted.key").string();
  {
    FILE* in = std::fopen(certs.tls("engine0").key_file.c_str(), "r");
    REQUIRE(in != nullptr);
    EVP_PKEY* key = PEM_read_PrivateKey(in, nullptr, nullptr, nullptr);
    std::fclose(in);
    REQUIRE(key != nullptr);
    FILE* out = std::fopen(encrypted.c_str(), "w");
    REQUIRE(out != nullptr);
    char pass[] = "s3cret";
    CHECK(PEM_write_PrivateKey(out, key, EVP_aes_256_cbc(), nullptr, 0, nullptr, pass) == 1);
    std::fclose(out);
    EVP_PKEY_free(key);
  }
  auto tls = certs.tls("engine0");
  tls.key_file = encrypted;
  CHECK(runtime::error_text(runtime::check_tls(tls)).find("passphrase") != std::string::npos);
  tls.passphrase = "wrong";
  CHECK(runtime::check_tls(tls));
  tls.passphrase = "s3cret";
  REQUIRE_FALSE(runtime::check_tls(tls));

  auto server = node(certs.tls("control"));
  auto swap = publish_swapper(*server);
  auto client = node(tls);
  check_serves(*client, swap.port, 77);
}

TEST_CASE("the simulated world ignores the transport options (tls)") {
  test::cluster_certs certs({"control"});
  runtime::world w{runtime::world_options{
    .mode = runtime::world_mode::sim, .seed = 1, .network = true, .configure = {},
    .tls = certs.tls("control")}};
  CHECK_FALSE(w.system().has_middleman());
  CHECK_FALSE(w.system().has_openssl_manager());
}
