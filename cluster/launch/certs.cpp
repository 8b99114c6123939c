#include "cluster/launch/certs.hpp"

#include "runtime/openssl_util.hpp"

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <system_error>

namespace troupe::cluster {

namespace fs = std::filesystem;

namespace {

using runtime::openssl::bio_ptr;
using runtime::openssl::pkey_ptr;
using runtime::openssl::x509_ptr;

struct bn_free {
  void operator()(BIGNUM* p) const { BN_free(p); }
};

/// A value, or the one-line reason there is none.
template <class T>
struct made {
  T value;
  std::string error;
};

/// A fresh P-256 key.
made<pkey_ptr> new_key() {
  pkey_ptr key{EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")};
  if (!key)
    return {nullptr, "cannot generate a P-256 key: " + runtime::openssl::errors()};
  return {std::move(key), ""};
}

/// Adds one X.509v3 extension given in OpenSSL's configuration syntax (`value`), with the
/// issuer and subject of `ctx`.
bool add_ext(X509* cert, X509V3_CTX* ctx, int nid, const std::string& value) {
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, ctx, nid, value.c_str());
  if (ext == nullptr)
    return false;
  int rc = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return rc == 1;
}

/// A certificate for `key` named `common_name`, signed by `issuer_key` (self-signed when
/// `issuer` is null), valid from five minutes ago (clock skew between machines) for `days`.
made<x509_ptr> new_cert(EVP_PKEY* key, const std::string& common_name, X509* issuer,
                        EVP_PKEY* issuer_key, int days, bool is_ca,
                        const std::string& subject_alt_names) {
  auto fail = [&](const std::string& what) {
    return made<x509_ptr>{nullptr, "cannot make the certificate of " + common_name + ": " +
                                     what + ": " + runtime::openssl::errors()};
  };
  x509_ptr cert{X509_new()};
  if (!cert || X509_set_version(cert.get(), X509_VERSION_3) != 1)
    return fail("X509_new");
  // A random positive 127-bit serial: unique without a serial file.
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1)
    return fail("RAND_bytes");
  serial[0] &= 0x7f;
  std::unique_ptr<BIGNUM, bn_free> bn{BN_bin2bn(serial, sizeof serial, nullptr)};
  if (!bn || BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert.get())) == nullptr)
    return fail("serial number");
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300) == nullptr ||
      X509_time_adj_ex(X509_getm_notAfter(cert.get()), days, 0, nullptr) == nullptr)
    return fail("validity");
  if (X509_set_pubkey(cert.get(), key) != 1)
    return fail("public key");
  X509_NAME* name = X509_get_subject_name(cert.get());
  auto text = [](const char* s) { return reinterpret_cast<const unsigned char*>(s); };
  if (X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, text("troupe"), -1, -1, 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, text(common_name.c_str()), -1, -1,
                                 0) != 1)
    return fail("subject");
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1)
    return fail("issuer");
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, signer, cert.get(), nullptr, nullptr, 0);
  bool exts = true;
  if (is_ca) {
    exts = add_ext(cert.get(), &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
           add_ext(cert.get(), &ctx, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    exts = add_ext(cert.get(), &ctx, NID_basic_constraints, "critical,CA:FALSE") &&
           add_ext(cert.get(), &ctx, NID_key_usage, "critical,digitalSignature,keyAgreement") &&
           add_ext(cert.get(), &ctx, NID_ext_key_usage, "serverAuth,clientAuth") &&
           add_ext(cert.get(), &ctx, NID_subject_alt_name, subject_alt_names);
  }
  // The subject key id first: the authority key id of a self-signed CA refers to it.
  exts = exts && add_ext(cert.get(), &ctx, NID_subject_key_identifier, "hash") &&
         add_ext(cert.get(), &ctx, NID_authority_key_identifier, "keyid:always");
  if (!exts)
    return fail("extensions");
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0)
    return fail("signature");
  return {std::move(cert), ""};
}

/// Writes `bytes` to `path` through a temporary file in the same directory, created with
/// `mode`, synced and renamed into place. Returns the error, empty on success.
std::string write_file(const fs::path& path, const std::string& bytes, mode_t mode) {
  auto tmp = path;
  tmp += ".tmp";
  ::unlink(tmp.c_str()); // a leftover of an interrupted run
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0)
    return tmp.string() + ": " + std::strerror(errno);
  auto fail = [&](const char* what) {
    std::string err = tmp.string() + ": " + what + ": " + std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    return err;
  };
  // The umask may have narrowed the mode; a key must be exactly 0600 (never wider).
  if (::fchmod(fd, mode) != 0)
    return fail("chmod");
  std::size_t done = 0;
  while (done < bytes.size()) {
    auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return fail("write");
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0)
    return fail("fsync");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return tmp.string() + ": close: " + std::strerror(errno);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = path.string() + ": rename: " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return err;
  }
  return "";
}

/// The PEM text a writer puts into a memory BIO.
template <class Write>
made<std::string> pem(Write&& write) {
  bio_ptr mem{BIO_new(BIO_s_mem())};
  if (!mem || write(mem.get()) != 1)
    return {"", "cannot encode PEM: " + runtime::openssl::errors()};
  char* data = nullptr;
  long len = BIO_get_mem_data(mem.get(), &data);
  return {std::string(data, static_cast<std::size_t>(len)), ""};
}

/// Writes a key (mode 0600) and its certificate (mode 0644).
std::string write_pair(const fs::path& key_path, EVP_PKEY* key, const fs::path& cert_path,
                       X509* cert) {
  auto key_pem = pem([&](BIO* b) {
    return PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
  if (!key_pem.error.empty())
    return key_path.string() + ": " + key_pem.error;
  auto cert_pem = pem([&](BIO* b) { return PEM_write_bio_X509(b, cert); });
  if (!cert_pem.error.empty())
    return cert_path.string() + ": " + cert_pem.error;
  if (auto err = write_file(key_path, key_pem.value, 0600); !err.empty())
    return err;
  return write_file(cert_path, cert_pem.value, 0644);
}

made<x509_ptr> read_cert(const fs::path& path) {
  bio_ptr in{BIO_new_file(path.c_str(), "r")};
  if (!in)
    return {nullptr, path.string() + ": cannot open: " + runtime::openssl::errors()};
  x509_ptr cert{PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr)};
  if (!cert)
    return {nullptr, path.string() + ": not a PEM certificate: " + runtime::openssl::errors()};
  return {std::move(cert), ""};
}

/// Never prompts: the keys troupe writes are unencrypted, an encrypted one is an error.
int no_passphrase(char*, int, int, void*) {
  return 0;
}

made<pkey_ptr> read_key(const fs::path& path) {
  bio_ptr in{BIO_new_file(path.c_str(), "r")};
  if (!in)
    return {nullptr, path.string() + ": cannot open: " + runtime::openssl::errors()};
  pkey_ptr key{PEM_read_bio_PrivateKey(in.get(), nullptr, no_passphrase, nullptr)};
  if (!key)
    return {nullptr, path.string() + ": not an unencrypted PEM private key: " + runtime::openssl::errors()};
  return {std::move(key), ""};
}

bool file_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

} // namespace

std::string check_node_names(const std::vector<std::string>& nodes) {
  if (nodes.empty())
    return "no node names given";
  std::set<std::string> seen;
  for (const auto& n : nodes) {
    if (n.empty() || n.size() > 64)
      return "node name '" + n + "': must have 1 to 64 characters";
    for (char c : n) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-';
      if (!ok)
        return "node name '" + n + "': only letters, digits, '.', '_' and '-' are allowed";
    }
    if (n == "ca")
      return "node name 'ca' is taken by the CA's own files";
    if (n.front() == '.' || n.front() == '-')
      return "node name '" + n + "': must not start with '.' or '-'";
    if (!seen.insert(n).second)
      return "node name '" + n + "' is given twice";
  }
  return "";
}

certs_outcome make_certs(const certs_options& opts) {
  certs_outcome out;
  if (auto err = check_node_names(opts.nodes); !err.empty()) {
    out.error = err;
    return out;
  }
  if (opts.days < 1 || opts.days > 36500) {
    out.error = "--days must be between 1 and 36500 (got " + std::to_string(opts.days) + ")";
    return out;
  }
  ERR_clear_error();
  std::error_code ec;
  if (!fs::exists(opts.out, ec)) {
    fs::create_directories(opts.out, ec);
    if (ec) {
      out.error = opts.out.string() + ": cannot create: " + ec.message();
      return out;
    }
    // Only its owner may list the keys of a directory we made.
    fs::permissions(opts.out, fs::perms::owner_all, ec);
  } else if (!fs::is_directory(opts.out, ec)) {
    out.error = opts.out.string() + ": not a directory";
    return out;
  }

  // The CA: reused when both files are there, made when neither is.
  const auto ca_cert_path = opts.out / "ca.pem";
  const auto ca_key_path = opts.out / "ca.key";
  x509_ptr ca_cert;
  pkey_ptr ca_key;
  bool have_cert = file_exists(ca_cert_path), have_key = file_exists(ca_key_path);
  if (have_cert != have_key) {
    out.error = (have_cert ? ca_cert_path : ca_key_path).string() + " exists without " +
                (have_cert ? ca_key_path : ca_cert_path).string() +
                ": restore it, or remove both to make a new CA (every node certificate must "
                "then be made again)";
    return out;
  }
  if (have_cert) {
    auto c = read_cert(ca_cert_path);
    if (!c.error.empty()) {
      out.error = c.error;
      return out;
    }
    auto k = read_key(ca_key_path);
    if (!k.error.empty()) {
      out.error = k.error;
      return out;
    }
    if (X509_check_private_key(c.value.get(), k.value.get()) != 1) {
      ERR_clear_error();
      out.error = ca_key_path.string() + ": is not the key of " + ca_cert_path.string();
      return out;
    }
    if (X509_check_ca(c.value.get()) == 0) {
      out.error = ca_cert_path.string() + ": is not a CA certificate";
      return out;
    }
    if (X509_cmp_current_time(X509_get0_notAfter(c.value.get())) <= 0) {
      out.error = ca_cert_path.string() + ": the CA has expired: remove ca.pem and ca.key to "
                  "make a new one (every node certificate must then be made again)";
      return out;
    }
    ca_cert = std::move(c.value);
    ca_key = std::move(k.value);
  } else {
    auto k = new_key();
    if (!k.error.empty()) {
      out.error = k.error;
      return out;
    }
    auto c = new_cert(k.value.get(), "troupe cluster CA", nullptr, k.value.get(), opts.days,
                      true, "");
    if (!c.error.empty()) {
      out.error = c.error;
      return out;
    }
    if (auto err = write_pair(ca_key_path, k.value.get(), ca_cert_path, c.value.get());
        !err.empty()) {
      out.error = err;
      return out;
    }
    ca_cert = std::move(c.value);
    ca_key = std::move(k.value);
    out.ca_created = true;
  }

  for (const auto& node : opts.nodes) {
    const auto cert_path = opts.out / (node + ".pem");
    const auto key_path = opts.out / (node + ".key");
    bool node_cert = file_exists(cert_path), node_key = file_exists(key_path);
    if (node_cert != node_key) {
      out.error = (node_cert ? cert_path : key_path).string() + " exists without " +
                  (node_cert ? key_path : cert_path).string() +
                  ": remove it to make a new pair for " + node;
      return out;
    }
    if (node_cert) {
      auto c = read_cert(cert_path);
      if (!c.error.empty()) {
        out.error = c.error;
        return out;
      }
      if (X509_verify(c.value.get(), ca_key.get()) != 1) {
        ERR_clear_error();
        out.error = cert_path.string() + ": not signed by " + ca_cert_path.string() +
                    ": remove " + cert_path.string() + " and " + key_path.string() +
                    " to make a new pair";
        return out;
      }
      out.kept.push_back(node);
      continue;
    }
    auto k = new_key();
    if (!k.error.empty()) {
      out.error = k.error;
      return out;
    }
    auto c = new_cert(k.value.get(), node, ca_cert.get(), ca_key.get(), opts.days, false,
                      "DNS:" + node + ",DNS:localhost,IP:127.0.0.1");
    if (!c.error.empty()) {
      out.error = c.error;
      return out;
    }
    if (auto err = write_pair(key_path, k.value.get(), cert_path, c.value.get()); !err.empty()) {
      out.error = err;
      return out;
    }
    out.created.push_back(node);
  }
  return out;
}

} // namespace troupe::cluster
