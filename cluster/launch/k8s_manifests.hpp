// Kubernetes manifests for a topology: what `troupe k8s` emits.
//
// troupe does not grow its own scheduler for big deployments: on a Kubernetes cluster the
// topology becomes ordinary Kubernetes objects that kubectl applies and the cluster's
// controllers keep running. The control process (KV CHECK role, load balancers, HTTP
// entrypoint) is a one-replica Deployment behind two Services: a ClusterIP Service for the
// HTTP API and a headless Service through which the instance processes reach its control
// port. The KV block store, when the cluster has one (a store claim, or a topology with a
// posix store), is a one-replica Deployment per shard (`storage.shards`) that mounts the
// claim and registers with the control process (cluster/launch/store_bridge.hpp). Each EP
// instance of each pool is one StatefulSet (one pod per machine the instance
// spans, see deploy_layout.hpp) with its own headless Service, so the ranks of an instance
// have stable DNS names and an instance can be restarted, scaled or deleted as one unit
// without a custom resource definition. The topology file itself travels as a ConfigMap that
// every pod mounts. GPU requests come from gpus_per_instance, the decode pods' termination
// grace period from the pool's drain grace, and their preStop hook starts the drain. A
// prefill instance of one pod, in a cluster with a block store, has its block fetcher
// (block_fetcher.hpp) as a second container that shares the pod's /dev/shm. With a TLS
// Secret every container mounts it and every process talks mutual TLS.
//
// The output is deterministic: the same topology text and options give the same objects in
// the same order with the same keys, so manifests can be diffed and reviewed.
#pragma once

#include "cluster/sim/result.hpp"
#include "cluster/topology.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::cluster {

/// What the manifests are built from besides the topology.
struct k8s_options {
  std::string image;                   // the container image with `troupe` on its PATH; required
  std::string namespace_name;          // metadata.namespace of every object; empty: none
  std::uint32_t gpus_per_node = 0;     // GPUs per machine; 0: the hardware profile's
  std::string gpu_resource = "nvidia.com/gpu"; // the extended resource GPUs are requested as
  std::uint16_t http_port = 8000;      // the control's HTTP API (/v1/..., /health, /ready)
  std::uint16_t control_port = 4242;   // the control's port that instance processes join
  std::uint32_t cpus_per_gpu = 8;      // CPU request per GPU (per CPU device on hardware cpu)
  std::uint32_t memory_gib_per_gpu = 64; // memory request per GPU, GiB
  std::uint32_t control_cpus = 4;      // the control pod's CPU request
  std::uint32_t control_memory_gib = 16; // the control pod's memory request, GiB
  std::uint32_t store_cpus = 2;          // the store pod's CPU request
  std::uint32_t store_memory_gib = 8;    // the store pod's memory request, GiB
  std::string model_pvc;               // a PersistentVolumeClaim holding the model directory
  std::string model_host_path;         // or a directory on every machine (hostPath)
  std::string store_pvc;               // a claim for the KV block store (the store pod's)
  /// A block fetcher container beside each one-pod prefill instance (cluster has a store).
  bool block_fetchers = true;
  /// A Secret holding `ca.crt`, `tls.crt` and `tls.key` (the layout cert-manager writes):
  /// every troupe container mounts it at k8s_tls_dir and its processes talk mutual TLS
  /// (docs/tls.md); empty: plain TCP between the pods.
  std::string tls_secret;
  /// A NetworkPolicy: the cluster's pods take connections from one another only, but for the
  /// HTTP API's port, open to every client.
  bool network_policy = false;
};

/// Where the TLS Secret is mounted (beside, not under, the topology's read-only mount).
inline constexpr std::string_view k8s_tls_dir = "/etc/troupe-tls";

/// The name of the ConfigMap key (and of the mounted file) that holds the topology.
inline constexpr std::string_view k8s_topology_key = "topology.toml";

/// The directory every pod mounts the topology ConfigMap at.
inline constexpr std::string_view k8s_topology_dir = "/etc/troupe";

/// The Kubernetes objects for `topo`, whose file text is `topology_text` (stored verbatim in
/// the ConfigMap), in apply order: the ConfigMap, the NetworkPolicy (`network_policy`), the
/// control's headless and HTTP Services,
/// the control Deployment, the store Deployments (when there is a store, one per shard),
/// then per pool (file order) and per instance index 0 … initial−1 a headless Service and a
/// StatefulSet. Pools of zero initial instances emit nothing.
/// Fails with one message when an option is invalid (empty image, both model sources given),
/// an instance does not fit the machines (deploy_layout.hpp), or a generated name would not
/// be a valid Kubernetes name (over 63 characters for Services, 52 for StatefulSets).
sim::result<std::vector<nlohmann::ordered_json>>
k8s_manifests(const topology& topo, std::string_view topology_text, const k8s_options& opts);

/// A DNS-1123 label made from `name`: lowercase, every character other than a-z, 0-9 and
/// '-' becomes '-', leading and trailing '-' removed. May return an empty string.
std::string k8s_name(std::string_view name);

/// The file name `troupe k8s --out` gives the `index`-th object: "NNN-kind-name.yaml"
/// (NNN zero-padded, so `kubectl apply -f DIR` applies the objects in order).
std::string k8s_file_name(std::size_t index, const nlohmann::ordered_json& object);

} // namespace troupe::cluster
