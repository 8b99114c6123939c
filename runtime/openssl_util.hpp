// openssl_util: owning handles for OpenSSL objects and OpenSSL's error queue as text.
//
// The TLS transport (transport.cpp) reads certificates and keys to check them, and
// `troupe certs` (cluster/launch/certs.cpp) makes them; both hold OpenSSL's C objects in
// unique_ptrs with OpenSSL's own free functions, and both report OpenSSL's queued reasons.
#pragma once

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include <memory>
#include <string>

namespace troupe::runtime::openssl {

struct bio_free {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct x509_free {
  void operator()(X509* p) const { X509_free(p); }
};
struct pkey_free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using bio_ptr = std::unique_ptr<BIO, bio_free>;
using x509_ptr = std::unique_ptr<X509, x509_free>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;

/// The reasons OpenSSL queued on this thread, oldest first, joined by "; " (and cleared);
/// "no reason given" when there are none.
std::string errors();

} // namespace troupe::runtime::openssl
