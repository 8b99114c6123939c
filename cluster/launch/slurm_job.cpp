// A Slurm batch script for a topology (see slurm_job.hpp).
#include "cluster/launch/slurm_job.hpp"

#include "cluster/launch/deploy_layout.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace troupe::cluster {
namespace {

// Seconds a decode process gets beyond its drain grace to hand its requests over and exit.
constexpr std::int64_t handoff_margin_s = 60;

// `s` as one shell word: unchanged when it holds only characters no shell treats specially,
// otherwise in single quotes.
std::string shell_word(std::string_view s) {
  bool plain = !s.empty();
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == '/' || c == ':' || c == '=' ||
              c == '@' || c == '%' || c == '+' || c == ',';
    if (!ok) {
      plain = false;
      break;
    }
  }
  if (plain)
    return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  out += "'";
  return out;
}

std::string plural(std::uint32_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

} // namespace

sim::result<slurm_job> make_slurm_job(const topology& topo, const slurm_options& o) {
  using failure = sim::result<slurm_job>;
  if (o.topology_path.empty())
    return failure::failure("the topology's path on the job's machines is needed");
  if (o.http_port == 0 || o.control_port == 0 || o.http_port == o.control_port)
    return failure::failure("the HTTP and control ports must be distinct and non-zero");
  if (o.troupe.empty())
    return failure::failure("the troupe command is needed");
  auto gpn = gpus_per_machine(topo, o.gpus_per_node);
  if (!gpn)
    return failure::failure(gpn.error());

  // The cluster has a block store (a directory given, or one the topology names): it runs in
  // component 0 beside the control process, one process per shard.
  const bool store = !o.store_dir.empty() || topo.storage.backend == storage_backend::posix;
  const std::uint32_t store_shards = store ? topo.storage.real_shards() : 0;
  slurm_job job;
  slurm_component control;
  control.name = "control";
  control.role = "control";
  control.instances = 1;
  control.nodes = 1;
  control.tasks = 1 + store_shards;
  control.tasks_per_instance = 1;
  control.cpus_per_task = std::max<std::uint32_t>(1, o.control_cpus);
  job.components.push_back(control);

  std::int64_t longest_grace = 0;
  for (const auto& pool : topo.pools) {
    longest_grace = std::max<std::int64_t>(
      longest_grace, (pool.grace.count() + 999'999'999) / 1'000'000'000);
    auto layout = layout_of(pool, *gpn);
    if (!layout)
      return failure::failure(layout.error());
    const std::uint32_t n = pool.instances.initial;
    if (n == 0)
      continue;
    slurm_component c;
    c.name = pool.name;
    c.role = std::string(to_string(pool.role));
    c.instances = n;
    c.tasks_per_instance = layout->processes;
    c.tasks = n * layout->processes;
    c.gpus_per_task = layout->gpus_per_process;
    const std::uint32_t devices = *gpn > 0 ? layout->gpus_per_process : pool.gpus_per_instance;
    c.cpus_per_task = std::max<std::uint32_t>(1, devices * o.cpus_per_gpu);
    c.fetchers = store && o.block_fetchers && pool.role == pool_role::prefill
                 && layout->processes == 1;
    if (*gpn == 0) {
      // CPU backend: Slurm packs the processes by their CPUs.
      c.nodes = 0;
    } else if (layout->processes > 1) {
      c.nodes = c.tasks; // whole machines, one process each
      c.gpus_per_node = *gpn;
    } else {
      const std::uint32_t per_node = std::max<std::uint32_t>(1, *gpn / layout->gpus_per_process);
      c.nodes = (n + per_node - 1) / per_node;
      c.gpus_per_node = std::min(n, per_node) * layout->gpus_per_process;
    }
    job.components.push_back(std::move(c));
  }
  const std::int64_t signal_lead = longest_grace + handoff_margin_s;

  std::string s;
  auto line = [&s](std::string_view text) {
    s += text;
    s += '\n';
  };
  line("#!/bin/bash");
  line(fmt::format("# The troupe cluster '{}' as a heterogeneous Slurm job, written by troupe.",
                   topo.cluster.name));
  line("# Submit with `sbatch FILE`. `scancel --signal=TERM JOBID` drains it (decode instances");
  line("# keep serving for their grace period, then hand their requests over and exit);");
  line("# a plain `scancel JOBID` also kills what still runs after the site's KillWait.");
  line("#");
  for (std::size_t i = 0; i < job.components.size(); ++i) {
    const auto& c = job.components[i];
    if (c.role == "control") {
      line(fmt::format("# component {}: control (HTTP entrypoint, KV CHECK role, load "
                       "balancers){}",
                       i,
                       store_shards == 0   ? std::string(", 1 process")
                       : store_shards == 1 ? std::string(" and the KV block store, 2 processes")
                                           : fmt::format(" and the KV block store in {} shards, "
                                                         "{} processes",
                                                         store_shards, 1 + store_shards)));
      continue;
    }
    std::string where =
      c.gpus_per_task > 0
        ? fmt::format(" x {} GPUs on {}", c.gpus_per_task, plural(c.nodes, "node", "nodes"))
        : "";
    line(fmt::format("# component {}: pool {} ({}), {} x {}{}{}", i, c.name, c.role,
                     plural(c.instances, "instance", "instances"),
                     plural(c.tasks_per_instance, "process", "processes"), where,
                     c.fetchers ? ", each with its block fetcher" : ""));
  }
  const std::string job_name =
    o.job_name.empty() ? fmt::format("troupe-{}", topo.cluster.name) : o.job_name;
  line(fmt::format("#SBATCH --job-name={}", job_name));
  line(fmt::format("#SBATCH --output={}", o.output.empty() ? "troupe-%j.out" : o.output));
  for (std::size_t i = 0; i < job.components.size(); ++i) {
    const auto& c = job.components[i];
    if (i > 0)
      line("#SBATCH hetjob");
    if (!o.partition.empty())
      line(fmt::format("#SBATCH --partition={}", o.partition));
    if (!o.account.empty())
      line(fmt::format("#SBATCH --account={}", o.account));
    if (!o.time_limit.empty())
      line(fmt::format("#SBATCH --time={}", o.time_limit));
    if (c.nodes > 0)
      line(fmt::format("#SBATCH --nodes={}", c.nodes));
    line(fmt::format("#SBATCH --ntasks={}", c.tasks));
    if (c.tasks_per_instance > 1)
      line("#SBATCH --ntasks-per-node=1");
    line(fmt::format("#SBATCH --cpus-per-task={}", c.cpus_per_task));
    if (c.gpus_per_node > 0)
      line(fmt::format("#SBATCH --gres=gpu:{}", c.gpus_per_node));
    // Before the time limit, SIGTERM comes early enough for the longest drain to finish.
    line(fmt::format("#SBATCH --signal=TERM@{}", signal_lead));
  }
  line("");
  line("set -u");
  line(fmt::format("troupe={}", shell_word(o.troupe)));
  line(fmt::format("topology={}", shell_word(o.topology_path)));
  line("# The control runs on the first machine of component 0; the instances reach it at that");
  line("# machine's NodeAddr (the address slurmctld itself uses).");
  line("control_node=$(scontrol show hostnames \"${SLURM_JOB_NODELIST_HET_GROUP_0:-"
       "$SLURM_JOB_NODELIST}\" | head -n 1)");
  line("control_addr=$(scontrol show node \"$control_node\" | sed -n 's/.*NodeAddr=\\([^ "
       "]*\\).*/\\1/p' | head -n 1)");
  line(fmt::format("control=\"${{control_addr:-$control_node}}:{}\"", o.control_port));
  line("echo \"troupe: job $SLURM_JOB_ID, control on $control_node ($control)\"");
  if (std::any_of(job.components.begin(), job.components.end(),
                  [](const slurm_component& c) { return c.fetchers; })) {
    line("export troupe topology control  # read by the prefill steps' shells");
    line("# Runs a command (a block fetcher) and again 1 s after it exits abnormally, as troupe");
    line("# launch restarts a process, until it exits with status 0 or has exited abnormally");
    line("# more than 10 times within 60 s. Exported: the prefill steps' shells call it.");
    line("troupe_respawn() {");
    line("  local name=$1 rc now t kept starts=()");
    line("  shift");
    line("  while :; do");
    line("    \"$@\" && return 0");
    line("    rc=$? now=$SECONDS kept=()");
    line("    for t in \"${starts[@]}\"; do (( now - t < 60 )) && kept+=(\"$t\"); done");
    line("    starts=(\"${kept[@]}\" \"$now\")");
    line("    if (( ${#starts[@]} > 10 )); then");
    line("      echo \"troupe: $name exited with status $rc, more than 10 times within 60 s: not "
         "restarted\" >&2");
    line("      return \"$rc\"");
    line("    fi");
    line("    echo \"troupe: $name exited with status $rc; restart ${#starts[@]} in 1 s\" >&2");
    line("    sleep 1");
    line("  done");
    line("}");
    line("export -f troupe_respawn");
  }
  line("");
  std::string data_args, store_args, fetch_args;
  if (!o.model_dir.empty())
    data_args += " --model " + shell_word(o.model_dir);
  if (!o.store_dir.empty())
    store_args += " --kv-dir " + shell_word(o.store_dir);
  for (const auto& a : o.node_args) {
    data_args += " " + shell_word(a);
    store_args += " " + shell_word(a);
    fetch_args += " " + shell_word(a);
  }
  line("pids=()");
  for (std::size_t i = 0; i < job.components.size(); ++i) {
    const auto& c = job.components[i];
    // --exact: a step gets only what it asks for, so instances share a component's machines;
    // --kill-on-bad-exit: one failed rank ends its instance's step (an EP group is one unit).
    std::string step = fmt::format("srun --het-group={} --nodes={} --ntasks={}", i,
                                   c.tasks_per_instance, c.tasks_per_instance);
    if (c.tasks_per_instance > 1)
      step += " --ntasks-per-node=1";
    step += fmt::format(" --cpus-per-task={}", c.cpus_per_task);
    if (c.gpus_per_task > 0)
      step += fmt::format(" --gres=gpu:{}", c.gpus_per_task);
    step += " --exact --kill-on-bad-exit=1";
    if (c.role == "control") {
      line(fmt::format("{} --job-name=control \\", step));
      line(fmt::format("  \"$troupe\" node \"$topology\" --role control --control {} "
                       "--listen {}{}{} &",
                       shell_word(fmt::format("{}:{}", o.bind, o.control_port)),
                       shell_word(fmt::format("{}:{}", o.bind, o.http_port)), data_args,
                       store ? " --external-store" : ""));
      line("pids+=($!)");
      // The store needs no model; it binds its fabric endpoint as the instances do.
      for (std::uint32_t shard = 0; shard < store_shards; ++shard) {
        const bool one = store_shards == 1;
        line(fmt::format("{} --job-name={} \\", step,
                         one ? std::string("store") : fmt::format("store-{}", shard)));
        line(fmt::format("  \"$troupe\" node \"$topology\" --role store{} --control "
                         "\"$control\" --fabric-host auto{} &",
                         one ? std::string{} : fmt::format(" --index {}", shard), store_args));
        line("pids+=($!)");
      }
      continue;
    }
    // A prefill instance on one machine reads its cached blocks through a block fetcher
    // process beside it, which hands them over in the machine's shared memory: the step's shell
    // starts the fetcher (under troupe_respawn, which restarts it when it dies), then becomes
    // the prefill process. Slurm signals both and ends both with the step; while its fetcher
    // is down, the instance reads from the store itself.
    for (std::uint32_t index = 0; index < c.instances; ++index) {
      line(fmt::format("{} --job-name={} \\", step,
                       shell_word(fmt::format("{}-{}", c.name, index))));
      // The fabric endpoint binds to the address this machine reaches the control by.
      const std::string instance =
        fmt::format("\"$troupe\" node \"$topology\" --role {} --index {} --control "
                    "\"$control\" --fabric-host auto{}",
                    c.role, index, data_args);
      if (c.fetchers)
        line(fmt::format("  bash -c {} &",
                         shell_word(fmt::format("troupe_respawn fetcher/{} \"$troupe\" node "
                                                "\"$topology\" --role fetcher --index {} "
                                                "--control \"$control\" --fabric-host auto{} "
                                                "& exec {}",
                                                index, index, fetch_args, instance))));
      else
        line(fmt::format("  {} &", instance));
      line("pids+=($!)");
    }
  }
  line("");
  line("rc=0");
  line("for pid in \"${pids[@]}\"; do wait \"$pid\" || rc=1; done");
  line("exit $rc");
  job.script = std::move(s);
  return job;
}

} // namespace troupe::cluster
