// Kubernetes manifests for a topology (see k8s_manifests.hpp).
#include "cluster/launch/k8s_manifests.hpp"

#include "cluster/launch/deploy_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>

namespace troupe::cluster {
namespace {

using json = nlohmann::ordered_json;
using failure = sim::result<std::vector<json>>;

// Seconds a decode process gets beyond its drain grace to hand its requests over and exit.
constexpr std::int64_t handoff_margin_s = 60;
// The termination grace of processes that do not drain (prefill, vision).
constexpr std::int64_t default_termination_s = 30;

std::int64_t ceil_seconds(caf::timespan t) {
  auto ns = t.count();
  return (ns + 999'999'999) / 1'000'000'000;
}

json labels(const std::string& cluster, std::string_view component) {
  json l;
  l["app.kubernetes.io/name"] = "troupe";
  l["app.kubernetes.io/instance"] = cluster;
  l["app.kubernetes.io/component"] = std::string(component);
  l["app.kubernetes.io/managed-by"] = "troupe-k8s";
  return l;
}

json metadata(const std::string& name, const json& object_labels, const k8s_options& o) {
  json m;
  m["name"] = name;
  if (!o.namespace_name.empty())
    m["namespace"] = o.namespace_name;
  m["labels"] = object_labels;
  return m;
}

// The selector labels of a set of pods: the object labels minus managed-by.
json selector_of(json l) {
  l.erase("app.kubernetes.io/managed-by");
  return l;
}

// `store`: the pod holds the KV block store (the store pod; the others reach it through the
// control process's store registry), so it mounts the store's claim, and no model.
json volumes(const std::string& cluster, const k8s_options& o, bool gpu, bool store) {
  json v = json::array();
  v.push_back({{"name", "topology"}, {"configMap", {{"name", cluster + "-topology"}}}});
  if (!store && !o.model_pvc.empty())
    v.push_back({{"name", "model"},
                 {"persistentVolumeClaim", {{"claimName", o.model_pvc}, {"readOnly", true}}}});
  else if (!store && !o.model_host_path.empty())
    v.push_back(
      {{"name", "model"}, {"hostPath", {{"path", o.model_host_path}, {"type", "Directory"}}}});
  if (store && !o.store_pvc.empty())
    v.push_back({{"name", "kv-store"}, {"persistentVolumeClaim", {{"claimName", o.store_pvc}}}});
  if (gpu) // NCCL and the block fetcher's host staging use shared memory; 64 MiB is too little
    v.push_back({{"name", "dshm"}, {"emptyDir", {{"medium", "Memory"}}}});
  if (!o.tls_secret.empty()) // readable by the owner only (mode 0400)
    v.push_back({{"name", "tls"}, {"secret", {{"secretName", o.tls_secret}, {"defaultMode", 256}}}});
  return v;
}

json tls_mount() {
  return {{"name", "tls"}, {"mountPath", std::string(k8s_tls_dir)}, {"readOnly", true}};
}

// --tls-ca / --tls-cert / --tls-key from the mounted Secret, when there is one.
void add_tls_args(json& command, const k8s_options& o) {
  if (o.tls_secret.empty())
    return;
  for (auto [flag, file] : {std::pair{"--tls-ca", "ca.crt"}, std::pair{"--tls-cert", "tls.crt"},
                            std::pair{"--tls-key", "tls.key"}}) {
    command.push_back(flag);
    command.push_back(fmt::format("{}/{}", k8s_tls_dir, file));
  }
}

json volume_mounts(const k8s_options& o, bool gpu, bool store) {
  json m = json::array();
  m.push_back({{"name", "topology"}, {"mountPath", std::string(k8s_topology_dir)},
               {"readOnly", true}});
  if (!store && (!o.model_pvc.empty() || !o.model_host_path.empty()))
    m.push_back({{"name", "model"}, {"mountPath", "/model"}, {"readOnly", true}});
  if (store && !o.store_pvc.empty())
    m.push_back({{"name", "kv-store"}, {"mountPath", "/kv"}});
  if (gpu)
    m.push_back({{"name", "dshm"}, {"mountPath", "/dev/shm"}});
  if (!o.tls_secret.empty())
    m.push_back(tls_mount());
  return m;
}

// --model (the store pod needs none) and (the store pod's) --kv-dir as the pods see them.
void add_data_args(json& command, const k8s_options& o, bool store) {
  if (!store && (!o.model_pvc.empty() || !o.model_host_path.empty())) {
    command.push_back("--model");
    command.push_back("/model");
  }
  if (store && !o.store_pvc.empty()) {
    command.push_back("--kv-dir");
    command.push_back("/kv");
  }
}

// The pod's fabric endpoint binds to the pod's IP (Kubernetes expands $(POD_IP) in a
// command from the container's environment): other pods pull KV and block payloads there.
void add_fabric_args(json& command) {
  command.push_back("--fabric-host");
  command.push_back("$(POD_IP)");
}

json pod_ip_env() {
  return {{"name", "POD_IP"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "status.podIP"}}}}}};
}

std::string topology_path() {
  return fmt::format("{}/{}", k8s_topology_dir, k8s_topology_key);
}

json http_probe(std::string_view path, int period, int failures) {
  return {{"httpGet", {{"path", std::string(path)}, {"port", "http"}}},
          {"periodSeconds", period},
          {"timeoutSeconds", 5},
          {"failureThreshold", failures}};
}

} // namespace

std::string k8s_name(std::string_view name) {
  std::string out;
  for (char c : name) {
    auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u))
      out += static_cast<char>(std::tolower(u));
    else
      out += '-';
  }
  auto first = out.find_first_not_of('-');
  if (first == std::string::npos)
    return {};
  auto last = out.find_last_not_of('-');
  return out.substr(first, last - first + 1);
}

std::string k8s_file_name(std::size_t index, const json& object) {
  std::string kind = object.value("kind", "object");
  std::transform(kind.begin(), kind.end(), kind.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string name = object.contains("metadata") ? object["metadata"].value("name", "") : "";
  return fmt::format("{:03}-{}-{}.yaml", index, kind, name);
}

sim::result<std::vector<json>>
k8s_manifests(const topology& topo, std::string_view topology_text, const k8s_options& o) {
  if (o.image.empty())
    return failure::failure("an image is needed (--image)");
  if (!o.model_pvc.empty() && !o.model_host_path.empty())
    return failure::failure("give the model as a claim (--model-pvc) or a host path "
                            "(--model-host-path), not both");
  if (o.http_port == 0 || o.control_port == 0 || o.http_port == o.control_port)
    return failure::failure("the HTTP and control ports must be distinct and non-zero");
  if (!o.tls_secret.empty() && (k8s_name(o.tls_secret) != o.tls_secret || o.tls_secret.size() > 253))
    return failure::failure("--tls-secret '" + o.tls_secret
                            + "': not a Kubernetes object name (lowercase letters, digits and "
                              "'-', e.g. troupe-tls)");
  auto gpn = gpus_per_machine(topo, o.gpus_per_node);
  if (!gpn)
    return failure::failure(gpn.error());
  const bool gpu = *gpn > 0;
  // The cluster has a block store: a claim for it, or a directory the topology names.
  const bool store = !o.store_pvc.empty() || topo.storage.backend == storage_backend::posix;

  const std::string cluster = k8s_name(topo.cluster.name);
  if (cluster.empty())
    return failure::failure(fmt::format(
      "the cluster name '{}' has no letter or digit to name Kubernetes objects after",
      topo.cluster.name));
  auto check_name = [](const std::string& name, std::size_t limit) -> std::string {
    if (name.size() > limit)
      return fmt::format("the Kubernetes name '{}' is longer than {} characters (shorten the "
                         "cluster or pool name)",
                         name, limit);
    return {};
  };

  // The longest decode drain: the control outlives it so that hand-offs can complete.
  std::int64_t longest_grace = 0;
  for (const auto& p : topo.pools)
    longest_grace = std::max(longest_grace, ceil_seconds(p.grace));

  std::vector<json> out;

  // The topology, verbatim.
  {
    json cm;
    cm["apiVersion"] = "v1";
    cm["kind"] = "ConfigMap";
    cm["metadata"] = metadata(cluster + "-topology", labels(cluster, "topology"), o);
    cm["data"] = {{std::string(k8s_topology_key), std::string(topology_text)}};
    out.push_back(std::move(cm));
  }

  // Connections among the cluster's pods only (the middleman's links, the fabric's, which
  // carry KV in the clear), and to the HTTP API from anywhere.
  if (o.network_policy) {
    json np;
    np["apiVersion"] = "networking.k8s.io/v1";
    np["kind"] = "NetworkPolicy";
    np["metadata"] = metadata(cluster, labels(cluster, "network"), o);
    const json pods = {{"matchLabels",
                        {{"app.kubernetes.io/name", "troupe"},
                         {"app.kubernetes.io/instance", cluster}}}};
    np["spec"] = {
      {"podSelector", pods},
      {"policyTypes", json::array({"Ingress"})},
      {"ingress", json::array({{{"from", json::array({{{"podSelector", pods}}})}},
                               {{"ports", json::array({{{"protocol", "TCP"},
                                                        {"port", o.http_port}}})}}})}};
    out.push_back(std::move(np));
  }

  const std::string control = cluster + "-control";
  if (auto e = check_name(control, 63); !e.empty())
    return failure::failure(e);
  const json control_labels = labels(cluster, "control");
  const json control_selector = selector_of(control_labels);

  // Headless: instance processes resolve the control pod itself, also before it is ready
  // (the control is ready only once the instances have joined).
  {
    json svc;
    svc["apiVersion"] = "v1";
    svc["kind"] = "Service";
    svc["metadata"] = metadata(control, control_labels, o);
    svc["spec"] = {{"clusterIP", "None"},
                   {"publishNotReadyAddresses", true},
                   {"selector", control_selector},
                   {"ports", json::array({{{"name", "control"},
                                           {"port", o.control_port},
                                           {"targetPort", "control"},
                                           {"protocol", "TCP"}}})}};
    out.push_back(std::move(svc));
  }
  {
    json svc;
    svc["apiVersion"] = "v1";
    svc["kind"] = "Service";
    svc["metadata"] = metadata(cluster + "-http", control_labels, o);
    svc["spec"] = {{"type", "ClusterIP"},
                   {"selector", control_selector},
                   {"ports", json::array({{{"name", "http"},
                                           {"port", o.http_port},
                                           {"targetPort", "http"},
                                           {"protocol", "TCP"}}})}};
    out.push_back(std::move(svc));
  }
  {
    json command = json::array({"troupe", "node", topology_path(), "--role", "control",
                                "--control", fmt::format("0.0.0.0:{}", o.control_port), "--listen",
                                fmt::format("0.0.0.0:{}", o.http_port)});
    add_data_args(command, o, false);
    if (store)
      command.push_back("--external-store");
    add_fabric_args(command);
    add_tls_args(command, o);
    json container;
    container["name"] = "control";
    container["image"] = o.image;
    container["command"] = command;
    container["env"] = json::array({pod_ip_env()});
    container["ports"] = json::array(
      {{{"name", "http"}, {"containerPort", o.http_port}, {"protocol", "TCP"}},
       {{"name", "control"}, {"containerPort", o.control_port}, {"protocol", "TCP"}}});
    container["resources"] = {
      {"requests",
       {{"cpu", std::to_string(o.control_cpus)},
        {"memory", fmt::format("{}Gi", o.control_memory_gib)}}}};
    container["readinessProbe"] = http_probe("/ready", 5, 3);
    container["livenessProbe"] = http_probe("/health", 10, 6);
    container["volumeMounts"] = volume_mounts(o, false, false);
    json pod_spec;
    pod_spec["terminationGracePeriodSeconds"] = longest_grace + handoff_margin_s;
    pod_spec["containers"] = json::array({container});
    pod_spec["volumes"] = volumes(cluster, o, false, false);
    json dep;
    dep["apiVersion"] = "apps/v1";
    dep["kind"] = "Deployment";
    dep["metadata"] = metadata(control, control_labels, o);
    // One control process at a time: the KV CHECK role is a single owner of its index.
    dep["spec"] = {{"replicas", 1},
                   {"strategy", {{"type", "Recreate"}}},
                   {"selector", {{"matchLabels", control_selector}}},
                   {"template",
                    {{"metadata", {{"labels", control_selector}}}, {"spec", pod_spec}}}};
    out.push_back(std::move(dep));
  }

  const std::string control_address = fmt::format("{}:{}", control, o.control_port);
  // The block store: one Deployment per shard (storage.shards). Each shard has a directory
  // of its own under the store's (ports/store_router.hpp), so several shards may share one
  // claim that every node can mount (ReadWriteMany).
  const std::uint32_t store_shards = store ? topo.storage.real_shards() : 0;
  for (std::uint32_t shard = 0; shard < store_shards; ++shard) {
    const bool one = store_shards == 1;
    const std::string name = one ? cluster + "-store" : fmt::format("{}-store-{}", cluster, shard);
    if (auto e = check_name(name, 63); !e.empty())
      return failure::failure(e);
    json l = labels(cluster, "store");
    if (!one)
      l["troupe/shard"] = std::to_string(shard);
    json command = json::array({"troupe", "node", topology_path(), "--role", "store"});
    if (!one) {
      command.push_back("--index");
      command.push_back(std::to_string(shard));
    }
    command.push_back("--control");
    command.push_back(control_address);
    add_data_args(command, o, true);
    add_fabric_args(command);
    add_tls_args(command, o);
    json container;
    container["name"] = "store";
    container["image"] = o.image;
    container["command"] = command;
    container["env"] = json::array({pod_ip_env()});
    container["resources"] = {{"requests",
                               {{"cpu", std::to_string(o.store_cpus)},
                                {"memory", fmt::format("{}Gi", o.store_memory_gib)}}}};
    container["volumeMounts"] = volume_mounts(o, false, true);
    json pod_spec;
    pod_spec["terminationGracePeriodSeconds"] = default_termination_s;
    pod_spec["containers"] = json::array({container});
    pod_spec["volumes"] = volumes(cluster, o, false, true);
    json dep;
    dep["apiVersion"] = "apps/v1";
    dep["kind"] = "Deployment";
    dep["metadata"] = metadata(name, l, o);
    // One store of a shard at a time: a store owns its directory.
    dep["spec"] = {{"replicas", 1},
                   {"strategy", {{"type", "Recreate"}}},
                   {"selector", {{"matchLabels", selector_of(l)}}},
                   {"template", {{"metadata", {{"labels", selector_of(l)}}}, {"spec", pod_spec}}}};
    out.push_back(std::move(dep));
  }
  for (const auto& pool : topo.pools) {
    auto layout = layout_of(pool, *gpn);
    if (!layout)
      return failure::failure(layout.error());
    const std::string pool_name = k8s_name(pool.name);
    if (pool_name.empty())
      return failure::failure(
        fmt::format("the pool name '{}' has no letter or digit to name objects after",
                    pool.name));
    const std::string role(to_string(pool.role));
    const std::uint64_t devices = gpu ? layout->gpus_per_process : pool.gpus_per_instance;
    const std::int64_t termination = pool.role == pool_role::decode
                                       ? ceil_seconds(pool.grace) + handoff_margin_s
                                       : default_termination_s;
    for (std::uint32_t index = 0; index < pool.instances.initial; ++index) {
      const std::string name = fmt::format("{}-{}-{}", cluster, pool_name, index);
      // A StatefulSet's pods carry a controller-revision-hash label "<name>-<10 chars>".
      if (auto e = check_name(name, 52); !e.empty())
        return failure::failure(e);
      json l = labels(cluster, role);
      l["troupe/pool"] = pool_name;
      l["troupe/instance"] = std::to_string(index);
      const json sel = selector_of(l);

      json svc;
      svc["apiVersion"] = "v1";
      svc["kind"] = "Service";
      svc["metadata"] = metadata(name, l, o);
      svc["spec"] = {{"clusterIP", "None"}, {"publishNotReadyAddresses", true},
                     {"selector", sel}};
      out.push_back(std::move(svc));

      json command = json::array({"troupe", "node", topology_path(), "--role", role, "--index",
                                  std::to_string(index), "--control", control_address});
      add_data_args(command, o, false);
      add_fabric_args(command);
      add_tls_args(command, o);
      json container;
      container["name"] = role;
      container["image"] = o.image;
      container["command"] = command;
      // Which rank of the instance this pod is: its ordinal ends the pod name; rank 0's
      // stable DNS name is the leader the other ranks join.
      container["env"] = json::array(
        {{{"name", "TROUPE_POD_NAME"},
          {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
         {{"name", "TROUPE_INSTANCE_PROCESSES"}, {"value", std::to_string(layout->processes)}},
         {{"name", "TROUPE_INSTANCE_LEADER"}, {"value", fmt::format("{}-0.{}", name, name)}},
         pod_ip_env()});
      json requests = {{"cpu", std::to_string(devices * o.cpus_per_gpu)},
                       {"memory", fmt::format("{}Gi", devices * o.memory_gib_per_gpu)}};
      json resources;
      if (gpu) {
        // Extended resources are not overcommitted: the limit equals the request.
        requests[o.gpu_resource] = std::to_string(layout->gpus_per_process);
        resources["requests"] = requests;
        resources["limits"] = {{o.gpu_resource, std::to_string(layout->gpus_per_process)}};
      } else {
        resources["requests"] = requests;
      }
      container["resources"] = resources;
      container["volumeMounts"] = volume_mounts(o, gpu, false);
      if (pool.role == pool_role::decode) {
        // Drain: SIGTERM to troupe (PID 1) starts the grace-period drain; the hook returns
        // when the process has handed its requests over and exited, so the kubelet's own
        // SIGTERM never interrupts a drain in progress.
        container["lifecycle"] = {
          {"preStop",
           {{"exec",
             {{"command",
               json::array({"/bin/sh", "-c",
                            "kill -TERM 1; while kill -0 1 2>/dev/null; do sleep 1; done"})}}}}}};
      }
      json pod_spec;
      pod_spec["terminationGracePeriodSeconds"] = termination;
      pod_spec["containers"] = json::array({container});
      pod_spec["volumes"] = volumes(cluster, o, gpu, false);
      // The block fetcher beside a prefill engine: both containers mount one memory-backed
      // /dev/shm, where the fetcher hands the cached blocks over.
      if (store && o.block_fetchers && pool.role == pool_role::prefill
          && layout->processes == 1) {
        // A GPU pod mounts one already (dshm, for NCCL); a CPU pod gets one here.
        const json shm_mount = {{"name", "dshm"}, {"mountPath", "/dev/shm"}};
        if (!gpu) {
          pod_spec["containers"][0]["volumeMounts"].push_back(shm_mount);
          pod_spec["volumes"].push_back({{"name", "dshm"}, {"emptyDir", {{"medium", "Memory"}}}});
        }
        json fetch_cmd = json::array({"troupe", "node", topology_path(), "--role", "fetcher",
                                      "--index", std::to_string(index), "--control",
                                      control_address});
        add_fabric_args(fetch_cmd);
        add_tls_args(fetch_cmd, o);
        json fetcher;
        fetcher["name"] = "fetcher";
        fetcher["image"] = o.image;
        fetcher["command"] = fetch_cmd;
        fetcher["env"] = json::array({pod_ip_env()});
        fetcher["resources"] = {{"requests", {{"cpu", "1"}, {"memory", "1Gi"}}}};
        fetcher["volumeMounts"] = json::array({{{"name", "topology"},
                                                {"mountPath", std::string(k8s_topology_dir)},
                                                {"readOnly", true}},
                                               shm_mount});
        if (!o.tls_secret.empty())
          fetcher["volumeMounts"].push_back(tls_mount());
        pod_spec["containers"].push_back(std::move(fetcher));
      }

      json sts;
      sts["apiVersion"] = "apps/v1";
      sts["kind"] = "StatefulSet";
      sts["metadata"] = metadata(name, l, o);
      // Parallel: the ranks of one EP group start together, not one after another.
      sts["spec"] = {{"serviceName", name},
                     {"replicas", layout->processes},
                     {"podManagementPolicy", "Parallel"},
                     {"selector", {{"matchLabels", sel}}},
                     {"template", {{"metadata", {{"labels", sel}}}, {"spec", pod_spec}}}};
      out.push_back(std::move(sts));
    }
  }
  return out;
}

} // namespace troupe::cluster
