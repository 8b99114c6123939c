// The deployment commands of the troupe CLI (see deploy_cli.hpp).
#include "cluster/deploy_cli.hpp"

#include "cluster/autoscaling.hpp"
#include "cluster/launch/k8s_manifests.hpp"
#include "cluster/launch/slurm_job.hpp"
#include "cluster/launch/yaml_writer.hpp"
#include "cluster/topology.hpp"
#include "runtime/transport.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;

// The topology and its text, or nullopt after printing every problem on stderr.
struct loaded_topology {
  cluster::topology topo;
  std::string text;
};

std::optional<loaded_topology> load(const std::string& file, std::string_view command) {
  auto result = cluster::load_topology(file);
  if (!result.ok()) {
    for (const auto& d : result.errors)
      std::cerr << d.to_string() << "\n";
    return std::nullopt;
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) {
    std::cerr << "troupe " << command << ": cannot read " << file << "\n";
    return std::nullopt;
  }
  // What these deployments do not do, said up front.
  if (cluster::prefill_or_decode_scales(*result.value))
    std::cerr << "troupe " << command << ": warning: [autoscaler] is on, but "
              << (command == "k8s" ? "these manifests keep" : "this job keeps")
              << " the pools at their initial sizes (troupe launch and troupe serve run the "
                 "autoscaler)\n";
  return loaded_topology{std::move(*result.value), text.str()};
}

bool write_file(const fs::path& path, const std::string& text, std::string_view command) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::cerr << "troupe " << command << ": cannot write " << path.string() << "\n";
    return false;
  }
  return true;
}

struct k8s_args {
  std::string topology;
  std::string out_dir;
  cluster::k8s_options opts;
};

int run_k8s(const k8s_args& a) {
  auto loaded = load(a.topology, "k8s");
  if (!loaded)
    return 1;
  auto objects = cluster::k8s_manifests(loaded->topo, loaded->text, a.opts);
  if (!objects) {
    std::cerr << "troupe k8s: " << objects.error() << "\n";
    return 1;
  }
  if (a.out_dir.empty()) {
    bool first = true;
    for (const auto& o : *objects) {
      if (!first)
        std::cout << "---\n";
      first = false;
      std::cout << cluster::to_yaml(o);
    }
    return 0;
  }
  std::error_code ec;
  fs::create_directories(a.out_dir, ec);
  if (ec) {
    std::cerr << "troupe k8s: cannot create " << a.out_dir << ": " << ec.message() << "\n";
    return 1;
  }
  for (std::size_t i = 0; i < objects->size(); ++i) {
    const auto& o = (*objects)[i];
    if (!write_file(fs::path(a.out_dir) / cluster::k8s_file_name(i, o), cluster::to_yaml(o),
                    "k8s"))
      return 1;
  }
  std::cout << "troupe k8s: wrote " << objects->size() << " objects to " << a.out_dir << "\n";
  return 0;
}

struct slurm_args {
  std::string topology;
  std::string out_file;
  std::string node_args;
  runtime::tls_options tls;
  cluster::slurm_options opts;
};

int run_slurm(slurm_args a) {
  auto loaded = load(a.topology, "slurm");
  if (!loaded)
    return 1;
  if (a.opts.topology_path.empty())
    a.opts.topology_path = fs::absolute(a.topology).lexically_normal().string();
  std::istringstream words{a.node_args};
  for (std::string w; words >> w;)
    a.opts.node_args.push_back(w);
  if (a.tls.enabled()) {
    // Every process presents the same identity; the files are on the job's shared file system.
    std::string* files[] = {&a.tls.ca_file, &a.tls.cert_file, &a.tls.key_file};
    for (auto* f : files) {
      if (f->empty()) {
        std::cerr << "troupe slurm: TLS needs --tls-ca, --tls-cert and --tls-key together\n";
        return 1;
      }
      *f = fs::absolute(*f).lexically_normal().string();
    }
    if (std::all_of(std::begin(files), std::end(files), [](auto* f) { return fs::exists(*f); })) {
      if (auto e = runtime::check_tls(a.tls)) {
        std::cerr << "troupe slurm: TLS: " << runtime::error_text(e) << "\n";
        return 1;
      }
    } else {
      std::cerr << "troupe slurm: note: the TLS files are not all on this machine; not "
                   "checked here\n";
    }
    a.opts.node_args.insert(a.opts.node_args.end(),
                            {"--tls-ca", a.tls.ca_file, "--tls-cert", a.tls.cert_file,
                             "--tls-key", a.tls.key_file});
  }
  auto job = cluster::make_slurm_job(loaded->topo, a.opts);
  if (!job) {
    std::cerr << "troupe slurm: " << job.error() << "\n";
    return 1;
  }
  if (a.out_file.empty()) {
    std::cout << job->script;
    return 0;
  }
  if (!write_file(a.out_file, job->script, "slurm"))
    return 1;
  std::error_code ec;
  fs::permissions(a.out_file, fs::perms::owner_exec | fs::perms::group_exec,
                  fs::perm_options::add, ec);
  return 0;
}

} // namespace

void add_slurm_placement_options(CLI::App* cmd, cluster::slurm_options& o, CLI::Option* needs) {
  std::vector<CLI::Option*> added{
    cmd->add_option("--topology-path", o.topology_path,
                    "the topology's path on the job's machines (default: its absolute path "
                    "here, for a shared file system)"),
    cmd->add_option("--job-name", o.job_name, "the Slurm job's name (default: troupe-<cluster "
                                              "name>)"),
    cmd->add_option("--output", o.output, "the batch step's output file (sbatch --output)")
      ->default_str("troupe-%j.out"),
    cmd->add_option("--partition", o.partition, "the partition of every component"),
    cmd->add_option("--account", o.account, "the account to charge"),
    cmd->add_option("--time", o.time_limit, "the job's time limit (Slurm syntax)"),
    cmd->add_option("--gpus-per-node", o.gpus_per_node,
                    "GPUs per machine (default: the topology hardware's)"),
    cmd->add_option("--cpus-per-gpu", o.cpus_per_gpu, "CPUs per GPU of a step")
      ->capture_default_str()};
  if (needs)
    for (auto* opt : added)
      opt->needs(needs);
}

void add_block_fetchers_option(CLI::App* cmd, bool& target, const std::string& what) {
  cmd
    ->add_option_function<std::string>(
      "--block-fetchers", [&target](const std::string& v) { target = v == "on"; },
      what + ": on (default) or off")
    ->check(CLI::IsMember({"on", "off"}));
}

void add_deploy_commands(CLI::App& app, int& rc, const std::string& version) {
  auto k = std::make_shared<k8s_args>();
  k->opts.image = "troupe:" + version;
  auto* k8s = app.add_subcommand(
    "k8s", "write Kubernetes manifests for a topology (ConfigMap, control Deployment and "
           "Services, one StatefulSet + headless Service per instance)");
  k8s->add_option("topology", k->topology, "the topology file (TOML)")->required();
  k8s->add_option("--out", k->out_dir,
                  "write one NNN-kind-name.yaml per object into this directory (default: one "
                  "multi-document YAML stream on stdout)");
  k8s->add_option("--image", k->opts.image, "the container image with troupe on its PATH")
    ->capture_default_str();
  k8s->add_option("--namespace", k->opts.namespace_name, "metadata.namespace of every object");
  k8s->add_option("--gpus-per-node", k->opts.gpus_per_node,
                  "GPUs per machine (default: the topology hardware's)");
  k8s->add_option("--gpu-resource", k->opts.gpu_resource, "the GPU extended resource")
    ->capture_default_str();
  k8s->add_option("--http-port", k->opts.http_port, "the HTTP API port")->capture_default_str();
  k8s->add_option("--control-port", k->opts.control_port, "the port instances join")
    ->capture_default_str();
  k8s->add_option("--cpus-per-gpu", k->opts.cpus_per_gpu, "CPU request per GPU")
    ->capture_default_str();
  k8s->add_option("--memory-per-gpu", k->opts.memory_gib_per_gpu, "memory request per GPU, GiB")
    ->capture_default_str();
  k8s->add_option("--model-pvc", k->opts.model_pvc,
                  "a PersistentVolumeClaim with the model directory (mounted at /model)");
  k8s->add_option("--model-host-path", k->opts.model_host_path,
                  "a directory on every machine with the model (mounted at /model)");
  k8s->add_option("--tls-secret", k->opts.tls_secret,
                  "a Secret with ca.crt, tls.crt and tls.key (troupe certs' files): mutual TLS "
                  "between the pods");
  k8s->add_flag("--network-policy", k->opts.network_policy,
                "a NetworkPolicy: the pods take connections from one another only, but for the "
                "HTTP API's port");
  k8s->add_option("--store-pvc", k->opts.store_pvc,
                  "a claim for the KV block store, mounted at /kv by the store pod alone "
                  "(ReadWriteOnce will do)");
  add_block_fetchers_option(k8s, k->opts.block_fetchers,
                            "a block fetcher container beside each one-pod prefill instance when "
                            "the cluster has a block store");
  k8s->callback([k, &rc] { rc = run_k8s(*k); });

  auto s = std::make_shared<slurm_args>();
  auto* slurm = app.add_subcommand(
    "slurm", "write a heterogeneous Slurm batch script for a topology (component 0: control, "
             "then one per pool; one srun step per instance)");
  slurm->add_option("topology", s->topology, "the topology file (TOML)")->required();
  slurm->add_option("--out", s->out_file, "write the script to this file (default: stdout)");
  add_slurm_placement_options(slurm, s->opts);
  slurm->add_option("--troupe", s->opts.troupe, "the troupe command on the machines")
    ->capture_default_str();
  slurm->add_option("--http-port", s->opts.http_port, "the HTTP API port")
    ->capture_default_str();
  slurm->add_option("--control-port", s->opts.control_port, "the port instances join")
    ->capture_default_str();
  slurm->add_option("--model", s->opts.model_dir, "the model directory on the machines");
  slurm->add_option("--bind", s->opts.bind,
                    "the address the control process listens on, for instances and HTTP "
                    "(default 0.0.0.0: every interface)");
  slurm->add_option("--node-args", s->node_args,
                    "more arguments of every troupe node, as one string split at spaces "
                    "(e.g. --node-args='--threads 4 --grace 30')");
  slurm->add_option("--kv-dir", s->opts.store_dir,
                    "the KV block store directory of the store process (default: the "
                    "topology's [storage] path)");
  slurm->add_option("--tls-ca", s->tls.ca_file,
                    "the cluster CA's certificate (troupe certs): mutual TLS between the job's "
                    "processes");
  slurm->add_option("--tls-cert", s->tls.cert_file,
                    "the certificate every process presents, signed by the CA");
  slurm->add_option("--tls-key", s->tls.key_file, "its private key");
  add_block_fetchers_option(slurm, s->opts.block_fetchers,
                            "a block fetcher beside each one-machine prefill instance, in its "
                            "step, when the cluster has a block store");
  slurm->callback([s, &rc] { rc = run_slurm(*s); });
}

}  // namespace troupe::cli
