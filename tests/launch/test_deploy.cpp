// Tests of the orchestrator outputs: Kubernetes manifests (k8s_manifests.hpp), the YAML writer
// and the heterogeneous Slurm job (slurm_job.hpp), on the example topologies.
#include "cluster/launch/deploy_layout.hpp"
#include "cluster/launch/k8s_manifests.hpp"
#include "cluster/launch/slurm_job.hpp"
#include "cluster/launch/yaml_writer.hpp"
#include "cluster/topology.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace troupe::cluster;
using json = nlohmann::ordered_json;

namespace {

const std::filesystem::path examples = std::filesystem::path{TROUPE_SOURCE_DIR} / "examples" /
                                       "topologies";

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct example {
  topology topo;
  std::string text;
};

example load_example(const std::string& name) {
  auto r = load_topology(examples / name);
  REQUIRE(r.ok());
  return {*r.value, read_text(examples / name)};
}

std::vector<json> manifests(const example& e, k8s_options o = {}) {
  if (o.image.empty())
    o.image = "troupe:test";
  auto r = k8s_manifests(e.topo, e.text, o);
  REQUIRE_MESSAGE(r.ok(), r.error());
  return *r;
}

std::vector<const json*> of_kind(const std::vector<json>& objects, const std::string& kind) {
  std::vector<const json*> out;
  for (const auto& o : objects)
    if (o["kind"] == kind)
      out.push_back(&o);
  return out;
}

std::uint64_t gpu_request(const json& sts) {
  const auto& res = sts["spec"]["template"]["spec"]["containers"][0]["resources"];
  if (!res["requests"].contains("nvidia.com/gpu"))
    return 0;
  auto req = std::stoull(res["requests"]["nvidia.com/gpu"].get<std::string>());
  CHECK(res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"]);
  return req;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1))
    ++n;
  return n;
}

} // namespace

TEST_CASE("k8s manifests hold one StatefulSet and headless Service per initial instance") {
  auto e = load_example("small.toml");
  auto objects = manifests(e);
  std::uint32_t instances = 0;
  for (const auto& p : e.topo.pools)
    instances += p.instances.initial;
  CHECK(of_kind(objects, "ConfigMap").size() == 1);
  CHECK(of_kind(objects, "Deployment").size() == 1);
  CHECK(of_kind(objects, "StatefulSet").size() == instances);
  CHECK(of_kind(objects, "Service").size() == instances + 2);
  // Per pool: the instances of that pool, each with its headless Service.
  for (const auto& p : e.topo.pools) {
    std::uint32_t n = 0;
    for (const auto* sts : of_kind(objects, "StatefulSet"))
      if ((*sts)["metadata"]["labels"]["troupe/pool"] == p.name) {
        ++n;
        CHECK((*sts)["spec"]["serviceName"] == (*sts)["metadata"]["name"]);
      }
    CHECK_MESSAGE(n == p.instances.initial, p.name);
  }
  for (const auto* svc : of_kind(objects, "Service"))
    if ((*svc)["metadata"]["labels"].contains("troupe/pool"))
      CHECK((*svc)["spec"]["clusterIP"] == "None");
}

TEST_CASE("k8s GPU requests add up to the topology's initial GPUs") {
  for (const auto* name : {"small.toml", "v4flash-1k.toml", "small-autoscale.toml"}) {
    CAPTURE(name);
    auto e = load_example(name);
    std::uint64_t gpus = 0;
    auto objects = manifests(e);
    for (const auto* sts : of_kind(objects, "StatefulSet"))
      gpus += (*sts)["spec"]["replicas"].get<std::uint64_t>() * gpu_request(*sts);
    CHECK(gpus == summarize(e.topo).initial_gpus);
  }
}

TEST_CASE("k8s instances wider than a machine get one pod per machine") {
  auto e = load_example("v4flash-1k.toml"); // H800: 8 GPUs per machine; decode EP 128
  auto objects = manifests(e);
  for (const auto* sts : of_kind(objects, "StatefulSet")) {
    const auto& pool = (*sts)["metadata"]["labels"]["troupe/pool"];
    auto replicas = (*sts)["spec"]["replicas"].get<int>();
    if (pool == "decode") {
      CHECK(replicas == 16);
      CHECK(gpu_request(*sts) == 8);
      CHECK((*sts)["spec"]["podManagementPolicy"] == "Parallel");
    } else if (pool == "vision") {
      CHECK(replicas == 1);
      CHECK(gpu_request(*sts) == 1);
    }
  }
  k8s_options o;
  o.gpus_per_node = 4;
  auto narrow = manifests(e, o);
  for (const auto* sts : of_kind(narrow, "StatefulSet"))
    if ((*sts)["metadata"]["labels"]["troupe/pool"] == "decode")
      CHECK((*sts)["spec"]["replicas"] == 32);
}

TEST_CASE("k8s ConfigMap holds the topology file verbatim and every pod mounts it") {
  auto e = load_example("v4flash-1k.toml");
  auto objects = manifests(e);
  auto cms = of_kind(objects, "ConfigMap");
  REQUIRE(cms.size() == 1);
  CHECK((*cms[0])["data"]["topology.toml"] == e.text);
  for (const auto& o : objects) {
    if (o["kind"] != "StatefulSet" && o["kind"] != "Deployment")
      continue;
    const auto& pod = o["spec"]["template"]["spec"];
    CHECK(pod["volumes"][0]["configMap"]["name"] == (*cms[0])["metadata"]["name"]);
    CHECK(pod["containers"][0]["command"][2] == "/etc/troupe/topology.toml");
  }
}

TEST_CASE("k8s control is probed on /ready and /health; decode drains on preStop") {
  auto e = load_example("small.toml"); // decode grace: the default 60 s
  auto objects = manifests(e);
  const auto& control = *of_kind(objects, "Deployment").at(0);
  const auto& c = control["spec"]["template"]["spec"]["containers"][0];
  CHECK(c["readinessProbe"]["httpGet"]["path"] == "/ready");
  CHECK(c["livenessProbe"]["httpGet"]["path"] == "/health");
  CHECK(c["command"] == json::array({"troupe", "node", "/etc/troupe/topology.toml", "--role",
                                     "control", "--control", "0.0.0.0:4242", "--listen",
                                     "0.0.0.0:8000", "--fabric-host", "$(POD_IP)"}));
  // Every pod's fabric endpoint binds to its pod IP, which Kubernetes puts in POD_IP.
  auto pod_ip = [](const json& container) {
    for (const auto& e : container["env"])
      if (e["name"] == "POD_IP")
        return e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP";
    return false;
  };
  CHECK(pod_ip(c));
  for (const auto* sts : of_kind(objects, "StatefulSet")) {
    const auto& pod = (*sts)["spec"]["template"]["spec"];
    const auto& cmd = pod["containers"][0]["command"];
    CHECK(cmd[4] == (*sts)["metadata"]["labels"]["app.kubernetes.io/component"]);
    CHECK(cmd[8] == "small-control:4242");
    CHECK(cmd[cmd.size() - 2] == "--fabric-host");
    CHECK(cmd.back() == "$(POD_IP)");
    CHECK(pod_ip(pod["containers"][0]));
    bool decode = cmd[4] == "decode";
    CHECK(pod["containers"][0].contains("lifecycle") == decode);
    CHECK(pod["terminationGracePeriodSeconds"] == (decode ? 120 : 30));
  }
  // A 5 s grace (local-cpu.toml) gives 65 s; the control outlives the longest drain.
  auto cpu = manifests(load_example("local-cpu.toml"));
  for (const auto* sts : of_kind(cpu, "StatefulSet"))
    if ((*sts)["metadata"]["labels"]["troupe/pool"] == "decode")
      CHECK((*sts)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 65);
  CHECK((*of_kind(cpu, "Deployment").at(0))["spec"]["template"]["spec"]
                                              ["terminationGracePeriodSeconds"] == 65);
}

TEST_CASE("k8s on the CPU backend requests CPUs, no GPUs") {
  auto objects = manifests(load_example("local-cpu.toml"));
  for (const auto* sts : of_kind(objects, "StatefulSet")) {
    CHECK(gpu_request(*sts) == 0);
    CHECK((*sts)["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] ==
          "8");
  }
}

TEST_CASE("k8s volumes and namespace follow the options") {
  k8s_options o;
  o.namespace_name = "serving";
  o.model_pvc = "weights";
  o.store_pvc = "kv";
  auto objects = manifests(load_example("small.toml"), o);
  for (const auto& obj : objects)
    CHECK(obj["metadata"]["namespace"] == "serving");
  // The store's claim is the store pod's alone: the control waits for that pod's store
  // process, and every other pod reaches the store through the control's store registry.
  REQUIRE(of_kind(objects, "Deployment").size() == 2);
  const auto& control = *of_kind(objects, "Deployment").at(0);
  auto cmd = control["spec"]["template"]["spec"]["containers"][0]["command"].dump();
  CHECK(cmd.find(R"("--model","/model","--external-store")") != std::string::npos);
  CHECK(cmd.find("--kv-dir") == std::string::npos);
  CHECK(control["spec"]["template"]["spec"]["volumes"].dump().find("\"kv\"") == std::string::npos);
  const auto& store = *of_kind(objects, "Deployment").at(1);
  CHECK(store["metadata"]["name"] == "small-store");
  CHECK(store["spec"]["replicas"] == 1);
  CHECK(store["spec"]["strategy"]["type"] == "Recreate");
  const auto& store_pod = store["spec"]["template"]["spec"];
  CHECK(store_pod["containers"][0]["command"]
        == json::array({"troupe", "node", "/etc/troupe/topology.toml", "--role", "store",
                        "--control", "small-control:4242", "--kv-dir", "/kv", "--fabric-host",
                        "$(POD_IP)"}));
  CHECK(store_pod["volumes"].dump().find(R"("claimName":"kv")") != std::string::npos);
  CHECK(store_pod["volumes"].dump().find("\"model\"") == std::string::npos);
  for (const auto* sts : of_kind(objects, "StatefulSet")) {
    const auto& pod = (*sts)["spec"]["template"]["spec"];
    auto instance = pod["containers"][0]["command"].dump();
    CHECK(instance.find(R"("--model","/model")") != std::string::npos);
    CHECK(instance.find("--kv-dir") == std::string::npos);
    CHECK(pod["volumes"].dump().find("kv-store") == std::string::npos);
  }
  o.model_host_path = "/mnt/models";
  auto both = k8s_manifests(load_example("small.toml").topo, "", o);
  CHECK_FALSE(both.ok());
}

TEST_CASE("k8s with a TLS Secret: every container mounts it and every process talks TLS") {
  k8s_options o;
  o.tls_secret = "troupe-tls";
  auto objects = manifests(load_example("small.toml"), o);
  std::size_t containers = 0;
  for (const auto& obj : objects) {
    if (obj["kind"] != "Deployment" && obj["kind"] != "StatefulSet")
      continue;
    const auto& pod = obj["spec"]["template"]["spec"];
    CHECK(pod["volumes"].dump().find(
            R"({"name":"tls","secret":{"secretName":"troupe-tls","defaultMode":256}})")
          != std::string::npos);
    for (const auto& c : pod["containers"]) {
      ++containers;
      CHECK(c["volumeMounts"].dump().find(
              R"({"name":"tls","mountPath":"/etc/troupe-tls","readOnly":true})")
            != std::string::npos);
      CHECK(c["command"].dump().find(
              R"("--tls-ca","/etc/troupe-tls/ca.crt","--tls-cert","/etc/troupe-tls/tls.crt",)"
              R"("--tls-key","/etc/troupe-tls/tls.key")")
            != std::string::npos);
    }
  }
  // control, store, prefill (with its fetcher) and decode.
  CHECK(containers == 5);
  // Without one: no TLS anywhere.
  auto plain = manifests(load_example("small.toml"), k8s_options{});
  for (const auto& obj : plain)
    CHECK(obj.dump().find("tls") == std::string::npos);
  o.image = "troupe:test";
  o.tls_secret = "Troupe_TLS";
  auto bad = k8s_manifests(load_example("small.toml").topo, "", o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().find("--tls-secret 'Troupe_TLS': not a Kubernetes object name")
        != std::string::npos);
}

TEST_CASE("k8s NetworkPolicy: the cluster's pods among themselves, the HTTP port to all") {
  k8s_options o;
  o.network_policy = true;
  o.http_port = 8080;
  auto objects = manifests(load_example("small.toml"), o);
  auto policies = of_kind(objects, "NetworkPolicy");
  REQUIRE(policies.size() == 1);
  CHECK(objects.at(1)["kind"] == "NetworkPolicy");  // right after the ConfigMap
  const auto& spec = (*policies[0])["spec"];
  const json pods = {{"matchLabels",
                      {{"app.kubernetes.io/name", "troupe"},
                       {"app.kubernetes.io/instance", "small"}}}};
  CHECK(spec["podSelector"] == pods);
  CHECK(spec["policyTypes"] == json::array({"Ingress"}));
  REQUIRE(spec["ingress"].size() == 2);
  CHECK(spec["ingress"][0]["from"] == json::array({{{"podSelector", pods}}}));
  CHECK(spec["ingress"][1]["ports"][0]["port"] == 8080);
  CHECK_FALSE(spec["ingress"][1].contains("from"));
  // Every pod of the cluster is selected.
  for (const auto& obj : objects)
    if (obj["kind"] == "Deployment" || obj["kind"] == "StatefulSet") {
      const auto& l = obj["spec"]["template"]["metadata"]["labels"];
      CHECK(l["app.kubernetes.io/name"] == "troupe");
      CHECK(l["app.kubernetes.io/instance"] == "small");
    }
  CHECK(of_kind(manifests(load_example("small.toml")), "NetworkPolicy").empty());
}

TEST_CASE("k8s: a store of several shards is one Deployment per shard, told its shard") {
  auto e = load_example("small.toml");
  e.topo.storage.shards = 3;
  k8s_options o;
  o.store_pvc = "kv";
  auto objects = manifests(e, o);
  const auto deployments = of_kind(objects, "Deployment");
  REQUIRE(deployments.size() == 4);  // the control, then shards 0, 1, 2
  std::set<std::string> selectors;
  for (std::uint32_t i = 0; i < 3; ++i) {
    const auto& store = *deployments.at(1 + i);
    CHECK(store["metadata"]["name"] == "small-store-" + std::to_string(i));
    const auto& cmd = store["spec"]["template"]["spec"]["containers"][0]["command"];
    CHECK(cmd == json::array({"troupe", "node", "/etc/troupe/topology.toml", "--role", "store",
                              "--index", std::to_string(i), "--control", "small-control:4242",
                              "--kv-dir", "/kv", "--fabric-host", "$(POD_IP)"}));
    // Each Deployment selects its own shard's pod only.
    const auto sel = store["spec"]["selector"]["matchLabels"];
    CHECK(sel["troupe/shard"] == std::to_string(i));
    CHECK(store["spec"]["template"]["metadata"]["labels"] == sel);
    selectors.insert(sel.dump());
  }
  CHECK(selectors.size() == 3);
}

TEST_CASE("k8s: a prefill pod has its block fetcher beside it, sharing /dev/shm") {
  for (const char* file : {"small.toml", "local-cpu.toml"}) {
    INFO(file);
    k8s_options o;
    o.store_pvc = "kv";
    auto objects = manifests(load_example(file), o);
    std::size_t prefill_pods = 0;
    for (const auto* sts : of_kind(objects, "StatefulSet")) {
      const auto& pod = (*sts)["spec"]["template"]["spec"];
      const auto& main = pod["containers"][0];
      const bool prefill = main["name"] == "prefill";
      REQUIRE(pod["containers"].size() == (prefill ? 2u : 1u));
      if (!prefill)
        continue;
      ++prefill_pods;
      const auto& fetcher = pod["containers"][1];
      CHECK(fetcher["name"] == "fetcher");
      const auto& cmd = fetcher["command"];
      REQUIRE(main["command"][5] == "--index");
      const auto index = main["command"][6].get<std::string>();
      CHECK(cmd[4] == "fetcher");
      CHECK(cmd[5] == "--index");
      CHECK(cmd[6] == index);
      CHECK(cmd.dump().find("--model") == std::string::npos);
      // Both containers mount the same memory-backed volume at /dev/shm.
      auto shm_of = [](const json& c) {
        for (const auto& m : c["volumeMounts"])
          if (m["mountPath"] == "/dev/shm")
            return m["name"].get<std::string>();
        return std::string{};
      };
      REQUIRE_FALSE(shm_of(main).empty());
      CHECK(shm_of(fetcher) == shm_of(main));
      bool memory = false;
      for (const auto& v : pod["volumes"])
        memory = memory || (v["name"] == shm_of(main) && v["emptyDir"]["medium"] == "Memory");
      CHECK(memory);
    }
    CHECK(prefill_pods > 0);
    o.block_fetchers = false;
    const auto without = manifests(load_example(file), o);
    for (const auto* sts : of_kind(without, "StatefulSet"))
      CHECK((*sts)["spec"]["template"]["spec"]["containers"].size() == 1);
  }
}

TEST_CASE("k8s output is deterministic and rejects what cannot be placed or named") {
  auto e = load_example("small.toml");
  auto yaml_of = [&] {
    std::string s;
    for (const auto& o : manifests(e))
      s += to_yaml(o);
    return s;
  };
  CHECK(yaml_of() == yaml_of());

  auto twelve = e;
  twelve.topo.pools[0].gpus_per_instance = 12; // on 8-GPU H200 machines
  twelve.topo.pools[0].ep_size = 12;
  k8s_options with_image;
  with_image.image = "troupe:test";
  auto r = k8s_manifests(twelve.topo, twelve.text, with_image);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().find("not a whole number") != std::string::npos);

  CHECK_FALSE(k8s_manifests(e.topo, e.text, k8s_options{}).ok()); // no image
  auto long_name = e;
  long_name.topo.cluster.name = std::string(60, 'a');
  CHECK_FALSE(k8s_manifests(long_name.topo, long_name.text, with_image).ok());
  CHECK(k8s_name("My_Pool.v2") == "my-pool-v2");
  CHECK(k8s_name("__") == "");
}

TEST_CASE("the YAML writer quotes what YAML would read as something else") {
  json v;
  v["plain"] = "nvidia.com/gpu";
  v["bool"] = "true";
  v["yes"] = "on";
  v["number"] = "8";
  v["colon"] = "a: b";
  v["option"] = "--role";
  v["dashes"] = "--";
  v["negative"] = "-1";
  v["int"] = 8;
  v["flag"] = false;
  v["list"] = json::array({"x", json{{"k", "v"}, {"n", 1}}});
  v["empty"] = json::object();
  CHECK(to_yaml(v) == "plain: nvidia.com/gpu\n"
                      "bool: \"true\"\n"
                      "\"yes\": \"on\"\n"
                      "number: \"8\"\n"
                      "colon: \"a: b\"\n"
                      "option: --role\n"
                      "dashes: \"--\"\n"
                      "negative: \"-1\"\n"
                      "int: 8\n"
                      "flag: false\n"
                      "list:\n"
                      "- x\n"
                      "- k: v\n"
                      "  \"n\": 1\n" // YAML 1.1 reads a plain n as false
                      "empty: {}\n");
}

TEST_CASE("the YAML writer keeps a file's bytes in a literal block") {
  json v;
  v["data"] = {{"f", "a = 1\n\n  b = \"x\"  \n"}, {"g", "two\n\n"}, {"h", "no newline"},
               {"cr", "a\r\nb\n"}};
  CHECK(to_yaml(v) == "data:\n"
                      "  f: |\n"
                      "    a = 1\n"
                      "\n"
                      "      b = \"x\"  \n"
                      "  g: |+\n"
                      "    two\n"
                      "\n"
                      "  h: \"no newline\"\n"
                      "  cr: \"a\\r\\nb\\n\"\n");
}

TEST_CASE("slurm job: control component, then one per pool, one srun per instance") {
  auto e = load_example("small.toml");
  slurm_options o;
  o.topology_path = "/shared/small.toml";
  auto job = make_slurm_job(e.topo, o);
  REQUIRE_MESSAGE(job.ok(), job.error());
  REQUIRE(job->components.size() == 1 + e.topo.pools.size());
  CHECK(job->components[0].role == "control");
  const auto& s = job->script;
  CHECK(s.rfind("#!/bin/bash\n", 0) == 0);
  CHECK(count(s, "#SBATCH hetjob\n") == e.topo.pools.size());
  std::uint32_t instances = 0;
  for (std::size_t i = 1; i < job->components.size(); ++i) {
    const auto& c = job->components[i];
    const auto& pool = e.topo.pools[i - 1];
    CHECK(c.name == pool.name);
    CHECK(c.instances == pool.instances.initial);
    instances += c.instances;
    // One srun per instance in this component, each with the pool's role and its index.
    CHECK(count(s, "srun --het-group=" + std::to_string(i) + " ") == c.instances);
    for (std::uint32_t k = 0; k < c.instances; ++k)
      CHECK(count(s, "--role " + c.role + " --index " + std::to_string(k) +
                       " --control \"$control\" --fabric-host auto") >= 1);
  }
  CHECK(count(s, "srun ") == 1 + instances);
  CHECK(count(s, "--role control --control 0.0.0.0:4242 --listen 0.0.0.0:8000") == 1);
  CHECK(s.find("topology=/shared/small.toml\n") != std::string::npos);
  // small.toml's decode instance: 16 GPUs on 8-GPU H200 machines, 2 machines of 8.
  const auto& decode = job->components[2];
  CHECK(decode.nodes == 2);
  CHECK(decode.tasks_per_instance == 2);
  CHECK(decode.gpus_per_node == 8);
  CHECK(count(s, "srun --het-group=2 --nodes=2 --ntasks=2 --ntasks-per-node=1") == 1);
  // The drain: SIGTERM 120 s (60 s grace + hand-off) before the time limit.
  CHECK(count(s, "#SBATCH --signal=TERM@120\n") == job->components.size());
}

TEST_CASE("slurm job GPUs add up to the topology's initial GPUs") {
  for (const auto* name : {"small.toml", "v4flash-1k.toml", "small-autoscale.toml"}) {
    CAPTURE(name);
    auto e = load_example(name);
    slurm_options o;
    o.topology_path = "t.toml";
    auto job = make_slurm_job(e.topo, o);
    REQUIRE(job.ok());
    std::uint64_t gpus = 0, requested = 0;
    for (const auto& c : job->components) {
      gpus += std::uint64_t{c.tasks} * c.gpus_per_task;
      requested += std::uint64_t{c.nodes} * c.gpus_per_node;
      CHECK(c.gpus_per_node <= 8);
    }
    CHECK(gpus == summarize(e.topo).initial_gpus);
    CHECK(requested >= gpus); // whole machines may hold spare GPUs, never fewer
  }
}

TEST_CASE("slurm job quotes paths and passes model and store") {
  auto e = load_example("local-cpu.toml");
  slurm_options o;
  o.topology_path = "/shared/my topology.toml";
  o.model_dir = "/models/v4.1";
  o.store_dir = "/kv";
  o.troupe = "/opt/troupe/bin/troupe";
  o.bind = "10.0.0.5";
  o.node_args = {"--threads", "4", "--engram-map", "identity map"};
  auto job = make_slurm_job(e.topo, o);
  REQUIRE(job.ok());
  CHECK(job->script.find("topology='/shared/my topology.toml'\n") != std::string::npos);
  // The instances and the control take the model; the store process takes the directory, in
  // component 0 beside the control process, which waits for it.
  CHECK(count(job->script, "--model /models/v4.1 --threads 4 --engram-map 'identity map' &") == 1);
  CHECK(count(job->script, "--model /models/v4.1 --threads 4 --engram-map 'identity map' "
                           "--external-store &") == 1);
  CHECK(count(job->script, "--role control --control 10.0.0.5:4242 --listen 10.0.0.5:8000 ") == 1);
  CHECK(count(job->script, "--role store --control \"$control\" --fabric-host auto --kv-dir /kv "
                           "--threads 4 --engram-map 'identity map' &") == 1);
  CHECK(count(job->script, "srun --het-group=0 ") == 2);
  REQUIRE(job->components.at(0).tasks == 2);
  // The prefill instance's step starts its block fetcher (no model; the store's arguments but
  // the directory) under troupe_respawn, then becomes the prefill process; its shell reads the
  // exported variables and function.
  CHECK(count(job->script,
              R"(  bash -c 'troupe_respawn fetcher/0 "$troupe" node "$topology" --role fetcher )"
              R"(--index 0 --control )"
              R"("$control" --fabric-host auto --threads 4 --engram-map '\''identity map'\'' & )"
              R"(exec "$troupe" node "$topology" --role prefill --index 0 --control "$control" )"
              R"(--fabric-host auto --model /models/v4.1 --threads 4 --engram-map '\''identity )"
              "map'\\''' &\n") == 1);
  CHECK(count(job->script, "export troupe topology control ") == 1);
  CHECK(count(job->script, "\ntroupe_respawn() {\n") == 1);
  CHECK(count(job->script, "\nexport -f troupe_respawn\n") == 1);
  CHECK(job->components.at(1).fetchers);
  CHECK_FALSE(job->components.at(2).fetchers); // decode
  o.block_fetchers = false;
  auto without = make_slurm_job(e.topo, o);
  REQUIRE(without.ok());
  CHECK(count(without->script, "--role fetcher") == 0);
  CHECK(count(without->script, "export troupe") == 0);
  CHECK(count(without->script, "troupe_respawn") == 0);
  CHECK(count(without->script, "--model /models/v4.1 --threads 4 --engram-map 'identity map' &")
        == 2);
  o.block_fetchers = true;
  // Without a directory the topology's (a posix store) is the store's; a simulated store
  // has no store process.
  o.store_dir.clear();
  CHECK(count(make_slurm_job(e.topo, o)->script, "--role store") == 1);
  auto sim_store = load_example("small.toml");
  auto no_store = make_slurm_job(sim_store.topo, o);
  REQUIRE(no_store.ok());
  CHECK(count(no_store->script, "--role store") == 0);
  CHECK(count(no_store->script, "--external-store") == 0);
  CHECK(count(no_store->script, "--role fetcher") == 0); // nothing to fetch from
  CHECK(no_store->components.at(0).tasks == 1);
  // A store of two shards: two store processes in component 0, each told its shard.
  auto sharded = e;
  sharded.topo.storage.shards = 2;
  auto two = make_slurm_job(sharded.topo, o);
  REQUIRE(two.ok());
  CHECK(two->components.at(0).tasks == 3);
  CHECK(count(two->script, "--job-name=store-0 ") == 1);
  CHECK(count(two->script, "--job-name=store-1 ") == 1);
  CHECK(count(two->script, "--role store --index 0 --control") == 1);
  CHECK(count(two->script, "--role store --index 1 --control") == 1);
  CHECK(count(two->script, "--external-store") == 1);
  CHECK(job->script.find("--gres") == std::string::npos); // the CPU backend asks for no GPUs
  o.topology_path.clear();
  CHECK_FALSE(make_slurm_job(e.topo, o).ok());
}
