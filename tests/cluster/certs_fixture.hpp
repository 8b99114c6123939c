// A temporary directory of `troupe certs` output for the TLS tests, removed at scope exit.
#pragma once

#include "cluster/launch/certs.hpp"
#include "runtime/transport.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace troupe::test {

/// A fresh directory under the system temp dir (mkdtemp: unique per call and process).
class temp_dir {
public:
  temp_dir() {
    auto pattern = (std::filesystem::temp_directory_path() / "troupe-test-certs-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }

private:
  std::filesystem::path path_;
};

/// A cluster: a CA and the named nodes' keys and certificates, made by make_certs.
class cluster_certs {
public:
  explicit cluster_certs(std::vector<std::string> nodes) {
    auto res = cluster::make_certs({dir_.path(), std::move(nodes), 30});
    REQUIRE_MESSAGE(res.ok(), res.error);
  }

  const std::filesystem::path& dir() const { return dir_.path(); }

  /// The TLS identity of `node`, trusting this cluster's CA.
  runtime::tls_options tls(const std::string& node) const {
    return {(dir() / "ca.pem").string(), (dir() / (node + ".pem")).string(),
            (dir() / (node + ".key")).string(), ""};
  }

private:
  temp_dir dir_;
};

} // namespace troupe::test
