#pragma once
// The deployment commands of the troupe CLI: `troupe k8s` (Kubernetes manifests) and
// `troupe slurm` (a heterogeneous Slurm batch script), both from a topology file
// (cluster/launch/k8s_manifests.hpp, cluster/launch/slurm_job.hpp, docs/deploy.md).

#include <CLI/CLI.hpp>

#include <string>

namespace troupe::cli {

// Adds the commands to `app`; a command's exit status goes to `rc`. `version` names the
// default container image (troupe:<version>).
void add_deploy_commands(CLI::App& app, int& rc, const std::string& version);

}  // namespace troupe::cli
