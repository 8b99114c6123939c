// `troupe certs` (cluster/launch/certs.hpp): the CA and node certificates it writes, checked
// with OpenSSL's own verification, their file modes, and reuse of the CA on a second run.
#include "certs_fixture.hpp"

#include "cluster/launch/certs.hpp"

#include <doctest/doctest.h>

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>

using namespace troupe;
namespace fs = std::filesystem;

namespace {

struct x509_free {
  void operator()(X509* p) const { X509_free(p); }
};
using x509_ptr = std::unique_ptr<X509, x509_free>;

x509_ptr load_cert(const fs::path& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  REQUIRE_MESSAGE(f != nullptr, p.string());
  x509_ptr cert{PEM_read_X509(f, nullptr, nullptr, nullptr)};
  std::fclose(f);
  REQUIRE_MESSAGE(cert != nullptr, p.string());
  return cert;
}

EVP_PKEY* load_key(const fs::path& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  REQUIRE_MESSAGE(f != nullptr, p.string());
  EVP_PKEY* key = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  REQUIRE_MESSAGE(key != nullptr, p.string());
  return key;
}

/// X509_verify_cert of `cert` against the CA file `ca` for `purpose`: the error code
/// (X509_V_OK when it verifies).
int verify(const fs::path& ca, const fs::path& cert, int purpose) {
  X509_STORE* store = X509_STORE_new();
  REQUIRE(X509_STORE_load_file(store, ca.c_str()) == 1);
  auto c = load_cert(cert);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  REQUIRE(X509_STORE_CTX_init(ctx, store, c.get(), nullptr) == 1);
  X509_STORE_CTX_set_purpose(ctx, purpose);
  int rc = X509_verify_cert(ctx);
  int err = X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return rc == 1 ? X509_V_OK : (err == X509_V_OK ? -1 : err);
}

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

} // namespace

TEST_CASE("troupe certs makes a CA and node certificates that verify against it (tls)") {
  test::temp_dir tmp;
  auto dir = tmp.path() / "certs"; // not there yet: make_certs creates it
  auto res = cluster::make_certs({dir, {"control", "engine0"}, 30});
  REQUIRE_MESSAGE(res.ok(), res.error);
  CHECK(res.ca_created);
  CHECK(res.created == std::vector<std::string>{"control", "engine0"});
  CHECK(res.kept.empty());

  for (const char* node : {"control", "engine0"}) {
    CAPTURE(node);
    auto pem = dir / (std::string(node) + ".pem");
    auto key = dir / (std::string(node) + ".key");
    CHECK(verify(dir / "ca.pem", pem, X509_PURPOSE_SSL_SERVER) == X509_V_OK);
    CHECK(verify(dir / "ca.pem", pem, X509_PURPOSE_SSL_CLIENT) == X509_V_OK);
    CHECK(mode_of(key) == 0600);
    auto cert = load_cert(pem);
    EVP_PKEY* k = load_key(key);
    CHECK(X509_check_private_key(cert.get(), k) == 1);
    EVP_PKEY_free(k);
    CHECK(X509_check_ca(cert.get()) == 0);
    // Its subject alternative names: its own name, localhost and 127.0.0.1; not another node.
    CHECK(X509_check_host(cert.get(), node, 0, 0, nullptr) == 1);
    CHECK(X509_check_host(cert.get(), "localhost", 0, 0, nullptr) == 1);
    CHECK(X509_check_ip_asc(cert.get(), "127.0.0.1", 0) == 1);
    CHECK(X509_check_host(cert.get(), std::string(node) == "control" ? "engine0" : "control", 0,
                          0, nullptr) != 1);
    // Valid for the 30 days asked for (from now, give or take the run's duration).
    int days = 0, secs = 0;
    REQUIRE(ASN1_TIME_diff(&days, &secs, nullptr, X509_get0_notAfter(cert.get())) == 1);
    CHECK(days >= 29);
    CHECK(days <= 30);
  }
  CHECK(mode_of(dir / "ca.key") == 0600);
  CHECK(mode_of(dir) == 0700);
  auto ca = load_cert(dir / "ca.pem");
  CHECK(X509_check_ca(ca.get()) > 0);
  // No temporary files left behind.
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    CHECK(e.path().extension() != ".tmp");
    ++files;
  }
  CHECK(files == 6);
}

TEST_CASE("a second troupe certs run with more nodes reuses the CA and keeps existing nodes (tls)") {
  test::temp_dir tmp;
  auto first = cluster::make_certs({tmp.path(), {"control"}, 30});
  REQUIRE_MESSAGE(first.ok(), first.error);
  auto ca_before = read_all(tmp.path() / "ca.pem");
  auto control_before = read_all(tmp.path() / "control.pem");
  REQUIRE_FALSE(ca_before.empty());

  auto second = cluster::make_certs({tmp.path(), {"control", "engine1"}, 30});
  REQUIRE_MESSAGE(second.ok(), second.error);
  CHECK_FALSE(second.ca_created);
  CHECK(second.created == std::vector<std::string>{"engine1"});
  CHECK(second.kept == std::vector<std::string>{"control"});
  CHECK(read_all(tmp.path() / "ca.pem") == ca_before);
  CHECK(read_all(tmp.path() / "control.pem") == control_before);
  CHECK(verify(tmp.path() / "ca.pem", tmp.path() / "engine1.pem", X509_PURPOSE_SSL_CLIENT) ==
        X509_V_OK);
  CHECK(mode_of(tmp.path() / "engine1.key") == 0600);
}

TEST_CASE("a node certificate of another cluster does not verify against this CA (tls)") {
  test::cluster_certs a({"control"});
  test::cluster_certs b({"control"});
  CHECK(verify(a.dir() / "ca.pem", a.dir() / "control.pem", X509_PURPOSE_SSL_CLIENT) ==
        X509_V_OK);
  CHECK(verify(a.dir() / "ca.pem", b.dir() / "control.pem", X509_PURPOSE_SSL_CLIENT) ==
        X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY);

  // Copied into a's directory, b's pair is not taken for one of a's nodes.
  fs::copy_file(b.dir() / "control.pem", a.dir() / "stray.pem");
  fs::copy_file(b.dir() / "control.key", a.dir() / "stray.key");
  auto res = cluster::make_certs({a.dir(), {"stray"}, 30});
  CHECK_FALSE(res.ok());
  CHECK(res.error.find("not signed by") != std::string::npos);
}

TEST_CASE("troupe certs refuses bad node names and a CA certificate without its key (tls)") {
  test::temp_dir tmp;
  const std::vector<std::vector<std::string>> bad = {
    {}, {""}, {"ca"}, {"a b"}, {"../x"}, {"-x"}, {"n1", "n1"}, {std::string(65, 'n')}};
  for (const auto& names : bad) {
    auto res = cluster::make_certs({tmp.path(), names, 30});
    CAPTURE(res.error);
    CHECK_FALSE(res.ok());
  }
  CHECK_FALSE(cluster::make_certs({tmp.path(), {"n1"}, 0}).ok());
  CHECK(fs::is_empty(tmp.path())); // nothing was written for any of them

  REQUIRE(cluster::make_certs({tmp.path(), {"n1"}, 30}).ok());
  auto ca = read_all(tmp.path() / "ca.pem");
  fs::remove(tmp.path() / "ca.key");
  auto res = cluster::make_certs({tmp.path(), {"n2"}, 30});
  CHECK_FALSE(res.ok());
  CHECK(res.error.find("ca.key") != std::string::npos);
  CHECK(read_all(tmp.path() / "ca.pem") == ca);
  CHECK_FALSE(fs::exists(tmp.path() / "n2.pem"));
}
