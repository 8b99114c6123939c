#!/usr/bin/env bash
# The 10,000-seed fault swarm (docs/benchmarks.md, "10,000 seeds"): every seed draws a fault plan
# and a workload on small.toml, runs, and checks the invariants; prints "N passed, M failed"
# with the throughput, and the replay command of every failing seed. Exits 2 on a failure.
#
#   bench/swarm.sh [TROUPE] [SEEDS] [JOBS]     (defaults: build/troupe, 0..9999, nproc)
set -euo pipefail
troupe=${1:-build/troupe}
seeds=${2:-0..9999}
jobs=${3:-$(nproc)}
start=$(date +%s)
"$troupe" swarm examples/topologies/small.toml --seeds "$seeds" --jobs "$jobs" 2>/dev/null
echo "swarm: seeds $seeds on $jobs threads in $(( $(date +%s) - start )) s wall"
