#include "runtime/transport.hpp"
#include "runtime/openssl_util.hpp"

#include "runtime/errors.hpp"

#include <caf/actor_cast.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/sec.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <memory>
#include <set>

namespace troupe::runtime {

namespace {

// Owning handles for the OpenSSL objects check_tls reads.
struct store_free {
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
};
struct store_ctx_free {
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
};
struct chain_free {
  void operator()(STACK_OF(X509) * p) const { sk_X509_pop_free(p, X509_free); }
};

using openssl::bio_ptr;
using openssl::pkey_ptr;
using openssl::x509_ptr;

caf::error tls_error(const std::string& what) {
  return make_error(errc::invalid_argument, what);
}

/// Hands OpenSSL the passphrase (never prompts on a terminal; an empty one fails the read
/// of an encrypted key).
int passphrase_cb(char* buf, int size, int, void* user) {
  const auto* pass = static_cast<const std::string*>(user);
  if (pass->empty() || size <= 0 || pass->size() >= static_cast<std::size_t>(size))
    return 0;
  std::memcpy(buf, pass->data(), pass->size());
  return static_cast<int>(pass->size());
}

/// Verifies `cert` (with the rest of its file's chain) against `store` for `purpose`.
caf::error verify(X509_STORE* store, X509* cert, STACK_OF(X509) * chain, int purpose,
                  const tls_options& tls, const char* as) {
  std::unique_ptr<X509_STORE_CTX, store_ctx_free> ctx{X509_STORE_CTX_new()};
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store, cert, chain) != 1)
    return tls_error("cannot set up certificate verification: " + openssl::errors());
  X509_STORE_CTX_set_purpose(ctx.get(), purpose);
  if (X509_verify_cert(ctx.get()) != 1) {
    ERR_clear_error();
    return tls_error(tls.cert_file + ": does not verify against " + tls.ca_file + " as a TLS " +
                     as + " certificate: " +
                     X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get())));
  }
  return {};
}

} // namespace

caf::error check_tls(const tls_options& tls) {
  if (!tls.enabled())
    return {};
  if (tls.ca_file.empty() || tls.cert_file.empty() || tls.key_file.empty())
    return tls_error("TLS needs a CA certificate, a certificate and a key together (given: " +
                     std::string(tls.ca_file.empty() ? "" : "CA ") +
                     (tls.cert_file.empty() ? "" : "certificate ") +
                     (tls.key_file.empty() ? "" : "key") + ")");
  ERR_clear_error();
  std::unique_ptr<X509_STORE, store_free> store{X509_STORE_new()};
  if (!store || X509_STORE_load_file(store.get(), tls.ca_file.c_str()) != 1)
    return tls_error(tls.ca_file + ": cannot load CA certificates: " + openssl::errors());

  bio_ptr cert_in{BIO_new_file(tls.cert_file.c_str(), "r")};
  if (!cert_in)
    return tls_error(tls.cert_file + ": cannot open: " + openssl::errors());
  x509_ptr cert{PEM_read_bio_X509(cert_in.get(), nullptr, nullptr, nullptr)};
  if (!cert)
    return tls_error(tls.cert_file + ": not a PEM certificate: " + openssl::errors());
  // CAF loads the file as a chain: certificates after the first are intermediates.
  std::unique_ptr<STACK_OF(X509), chain_free> chain{sk_X509_new_null()};
  while (X509* extra = PEM_read_bio_X509(cert_in.get(), nullptr, nullptr, nullptr))
    sk_X509_push(chain.get(), extra);
  ERR_clear_error(); // the end of the file ends the loop with an error

  bio_ptr key_in{BIO_new_file(tls.key_file.c_str(), "r")};
  if (!key_in)
    return tls_error(tls.key_file + ": cannot open: " + openssl::errors());
  auto pass = tls.passphrase;
  pkey_ptr key{
    PEM_read_bio_PrivateKey(key_in.get(), nullptr, passphrase_cb, &pass)};
  if (!key)
    return tls_error(tls.key_file + ": cannot read the private key (not PEM, or encrypted and "
                     "the passphrase is missing or wrong): " + openssl::errors());
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return tls_error(tls.key_file + ": is not the key of " + tls.cert_file);
  }
  if (auto err = verify(store.get(), cert.get(), chain.get(), X509_PURPOSE_SSL_SERVER, tls,
                        "server"))
    return err;
  return verify(store.get(), cert.get(), chain.get(), X509_PURPOSE_SSL_CLIENT, tls, "client");
}

void configure_transport(caf::actor_system_config& cfg, const tls_options& tls) {
  cfg.load<caf::io::middleman>();
  // Every link is one we made: no direct connections behind the application's back.
  cfg.set("middleman.enable-automatic-connections", false);
  cfg.set("middleman.heartbeat-interval", heartbeat_interval);
  cfg.set("middleman.connection-timeout", link_timeout);
  if (!tls.enabled())
    return;
  cfg.openssl_cafile = tls.ca_file;
  cfg.openssl_certificate = tls.cert_file;
  cfg.openssl_key = tls.key_file;
  cfg.openssl_passphrase = tls.passphrase;
  // After the middleman: the OpenSSL manager wraps its connections.
  cfg.load<caf::openssl::manager>();
}

caf::expected<std::uint16_t> publish_actor(caf::actor_system& sys, const caf::actor& whom,
                                           std::uint16_t port, const std::string& host,
                                           bool reuse) {
  if (!sys.has_middleman())
    return make_error(errc::invalid_argument,
                      "publish_actor: the actor system has no middleman (configure_transport)");
  if (!whom)
    return caf::sec::cannot_publish_invalid_actor;
  const char* in = host.empty() ? nullptr : host.c_str();
  if (sys.has_openssl_manager())
    return caf::openssl::publish(sys, caf::actor_cast<caf::strong_actor_ptr>(whom),
                                 sys.message_types(whom), port, in, reuse);
  return sys.middleman().publish(whom, port, in, reuse);
}

caf::expected<caf::actor> connect_actor(caf::actor_system& sys, const std::string& host,
                                        std::uint16_t port, caf::timespan timeout) {
  if (!sys.has_middleman())
    return make_error(errc::invalid_argument,
                      "connect_actor: the actor system has no middleman (configure_transport)");
  // The OpenSSL manager's middleman actor opens TLS connections on the same BASP broker.
  caf::io::middleman_actor mm = sys.has_openssl_manager() ? sys.openssl_manager().actor_handle()
                                                          : sys.middleman().actor_handle();
  caf::expected<caf::actor> result{caf::make_error(caf::sec::request_timeout)};
  // CAF's remote_actor waits for ever; a request with a timeout bounds a stuck handshake.
  caf::scoped_actor self{sys};
  self->request(mm, timeout, caf::connect_atom_v, host, port)
    .receive(
      [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>& ifs) {
        if (!ptr)
          result = caf::make_error(caf::sec::no_actor_published_at_port);
        else if (!ifs.empty()) // a typed actor: not reachable through a dynamic handle
          result = caf::make_error(caf::sec::unexpected_actor_messaging_interface);
        else
          result = caf::actor_cast<caf::actor>(std::move(ptr));
      },
      [&](caf::error& err) { result = std::move(err); });
  return result;
}

std::string error_text(const caf::error& err) {
  if (!err)
    return "no error";
  if (err.category() == error_category) {
    auto text = to_string(static_cast<errc>(err.code()));
    if (err.context().match_elements<std::string>())
      return err.context().get_as<std::string>(0);
    return text;
  }
  if (err.category() == caf::atom("system"))
    return to_string(static_cast<caf::sec>(err.code()));
  return to_string(err);
}

std::string openssl::errors() {
  std::string text;
  while (auto code = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof buf);
    if (!text.empty())
      text += "; ";
    text += buf;
  }
  return text.empty() ? "no reason given" : text;
}

} // namespace troupe::runtime

// -- CAF 0.17's OpenSSL sessions and the thread's error queue ---------------------------------
//
// OpenSSL reports why an I/O call failed on the calling thread's error queue, and
// SSL_get_error consults that queue before anything else: the queue must be empty before
// SSL_read, SSL_write, SSL_connect or SSL_accept is called, or a plain "would block" is
// reported as a fatal error (SSL_get_error(3)). caf::openssl::session (CAF 0.17.6, Debian's)
// never empties it: it drains the queue only inside log statements, which Debian's build
// compiles out. So once one connection failed (a handshake refused for a foreign certificate,
// or a peer gone without a TLS close — OpenSSL 3 queues "unexpected eof", and CAF 0.17 never
// sends a close), the next SSL_read of every other connection on the same middleman thread
// that would block was taken for an error, and the connection dropped: a killed or refused
// peer took a control process's links to its healthy instances with it. CAF fixed its later
// network layer the same way (libcaf_net's ssl::connection clears the queue before each call).
//
// These definitions in the executable take the place of libssl's for every caller, CAF's
// OpenSSL module included (the dynamic linker binds its calls to the executable's symbols
// first), clear the queue and call libssl's own function. Clearing before a call is what
// OpenSSL asks of every caller, so other users (Boost.Asio's SSL engine already does it) see
// no change. tests/cluster/test_transport.cpp checks a connection survives both failures.
namespace {

template <class F>
F next_ssl_symbol(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "troupe: cannot find libssl's %s (%s)\n", name, dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

} // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto real = next_ssl_symbol<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto real = next_ssl_symbol<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_connect(SSL* ssl) {
  static const auto real = next_ssl_symbol<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

int SSL_accept(SSL* ssl) {
  static const auto real = next_ssl_symbol<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}

} // extern "C"
