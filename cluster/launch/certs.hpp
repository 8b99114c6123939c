// certs: the cluster CA and the per-node TLS certificates `troupe certs` writes.
//
// troupe's processes authenticate each other with mutual TLS (runtime/transport.hpp): each
// presents a certificate, and each accepts only certificates signed by the cluster's own CA.
// Running a cluster therefore needs a CA and one key + certificate per node, and adding a
// node later needs a certificate from the same CA. make_certs creates them with OpenSSL's C
// API: a self-signed CA the first time (reused on later runs), then for each node a P-256 key
// and a certificate for both TLS client and server use whose subject alternative names are
// the node's name, localhost and 127.0.0.1. Keys are written unencrypted with mode 0600; the
// directory is the secret.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace troupe::cluster {

struct certs_options {
  /// The directory the files go to (created if missing): ca.pem, ca.key, NAME.pem, NAME.key.
  std::filesystem::path out;
  /// Node names: letters, digits, '.', '_' and '-', at most 64 characters, not "ca".
  std::vector<std::string> nodes;
  /// Validity of the certificates made in this run, in days from now (1..36500).
  int days = 365;
};

/// What make_certs did; `error` is empty on success.
struct certs_outcome {
  /// One line on what went wrong (the file and the reason); nothing after the failure was
  /// written, what was written before it stays.
  std::string error;
  /// True when this run made the CA; false when it reused ca.pem + ca.key from `out`.
  bool ca_created = false;
  /// Nodes whose key and certificate this run wrote.
  std::vector<std::string> created;
  /// Nodes that already had NAME.pem and NAME.key, signed by this CA: left as they were.
  std::vector<std::string> kept;

  bool ok() const { return error.empty(); }
};

/// Makes (or reuses) the cluster CA in `opts.out` and a key + certificate per node. A CA is
/// reused when ca.pem and ca.key are both there and belong together; one without the other
/// is an error (nothing is overwritten), and so is an expired CA. A node whose files exist
/// is kept if its certificate was signed by this CA and fails otherwise. Each file is written to a
/// temporary name and renamed into place; keys are created with mode 0600.
certs_outcome make_certs(const certs_options& opts);

/// The error of a node name list (empty when every name is valid and none repeats).
std::string check_node_names(const std::vector<std::string>& nodes);

} // namespace troupe::cluster
