#pragma once
// The deployment commands of the troupe CLI: `troupe k8s` (Kubernetes manifests) and
// `troupe slurm` (a heterogeneous Slurm batch script), both from a topology file
// (cluster/launch/k8s_manifests.hpp, cluster/launch/slurm_job.hpp, docs/deploy.md).

#include "cluster/launch/slurm_job.hpp"

#include <CLI/CLI.hpp>

#include <string>

namespace troupe::cli {

// Adds the options that place a Slurm job (partition, account, time limit, job name, output
// file, machine sizes, the topology's path there) to `cmd`: `troupe slurm` and `troupe launch
// --slurm` share them. With `needs`, each option needs that one (launch's --slurm flag).
void add_slurm_placement_options(CLI::App* cmd, cluster::slurm_options& o,
                                 CLI::Option* needs = nullptr);

// Adds `--block-fetchers on|off` to `cmd`, described by `what` (where the fetchers run), into
// `target` (default: on): `troupe k8s`, `troupe slurm` and `troupe launch` share it.
void add_block_fetchers_option(CLI::App* cmd, bool& target, const std::string& what);

// Adds the commands to `app`; a command's exit status goes to `rc`. `version` names the
// default container image (troupe:<version>).
void add_deploy_commands(CLI::App& app, int& rc, const std::string& version);

}  // namespace troupe::cli
