// `troupe launch --slurm`: the cluster as one heterogeneous Slurm job, submitted and followed.
//
// `troupe slurm` writes the batch script (slurm_job.hpp) and leaves submitting it to the user;
// `troupe launch --slurm` is the launcher's own command line for a Slurm site: it submits the
// same script with `sbatch`, says where the HTTP API is once the job runs, copies the job's
// output to stderr as it grows, turns its own SIGTERM or SIGINT into a drain of the job
// (`scancel --signal=TERM`; a second one cancels it outright), and exits when the job has
// left the queue: 0 when every component COMPLETED. Slurm, not troupe, places, signals and
// ends the processes (one srun step per instance, --kill-on-bad-exit), so the local
// launcher's restarts, fault plans and hosts file do not apply.
#pragma once

#include "cluster/launch/slurm_job.hpp"
#include "cluster/topology.hpp"

#include <ostream>

namespace troupe::cluster {

/// Submits `make_slurm_job(topo, job)`'s script with `sbatch` (found on PATH) and follows the
/// job as above; with `dry_run` prints the script on `out` and submits nothing. Progress and
/// the job's output go to `err`. Returns the exit status: 0 when every component completed,
/// 1 otherwise (a refused submission, a failed or cancelled component).
int run_slurm_launch(const topology& topo, const slurm_options& job, bool dry_run,
                     std::ostream& out, std::ostream& err);

} // namespace troupe::cluster
