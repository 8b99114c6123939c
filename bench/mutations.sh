#!/usr/bin/env bash
# The mutation set (docs/faults.md, "Mutations"): does the swarm alone catch small deliberate
# defects? Each bench/mutations/*.patch plants one (request, kv, lb, autoscaler, supervisor
# code). For each: apply it to the tree (`git apply`), rebuild troupe incrementally in BUILD,
# run the swarm on examples/topologies/small.toml and small-autoscale.toml in chunks of 100
# seeds each until a seed fails (caught) or SEEDS seeds per topology passed (not caught), and
# revert it (`git apply -R`). First the unmutated tree must pass the first chunk, or the table
# would mean nothing. Prints a Markdown table; exits 0 when every mutation was caught, 2 when
# one was not, 1 on an error (a patch that does not apply, a failed build).
#
#   bench/mutations.sh [SEEDS] [JOBS] [NAME...]    (defaults: 500 per topology, nproc, all)
#   BUILD=build-x bench/mutations.sh ...            (the CMake build folder; default build)
#
# The tree is never left mutated: the files a patch touches must have no uncommitted changes
# (so the revert is exact), the patch is reverted on any exit (an error, ^C, a failed build),
# and a run killed outright (kill -9) leaves BUILD/mutation-applied naming the patch, which
# the next run reverts first. Builds run one at a time, with -j JOBS.
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
cd "$repo"
seeds=${1:-500}
jobs=${2:-$(nproc)}
shift $(( $# >= 2 ? 2 : $# ))
only=("$@")
build_dir=${BUILD:-build}
marker=$build_dir/mutation-applied
topologies=(examples/topologies/small.toml examples/topologies/small-autoscale.toml)
chunk=100

[ -f "$build_dir/build.ninja" ] || [ -f "$build_dir/Makefile" ] || {
  echo "no configured build in $build_dir (cmake -S . -B $build_dir first)" >&2
  exit 1
}
revert() {
  if [ -f "$marker" ]; then
    git apply -R "$(cat "$marker")" && rm -f "$marker"
  fi
}
revert # what a killed run left behind
trap revert EXIT
build() { cmake --build "$build_dir" -j "$jobs" --target troupe >"$build_dir/mutation-build.log" 2>&1; }

# Runs the swarm in chunks; prints "caught SEED TOPOLOGY SEEDS_RUN PROBLEM" or
# "passed - - SEEDS_RUN -"; returns 1 on an error of the swarm itself.
swarm() {
  local limit=$1 first=0 ran=0
  while [ "$first" -lt "$limit" ]; do
    local last=$(( first + chunk < limit ? first + chunk - 1 : limit - 1 ))
    for topo in "${topologies[@]}"; do
      local out rc=0
      out=$("$build_dir/troupe" swarm "$topo" --seeds "$first..$last" --jobs "$jobs" --quiet \
              2>/dev/null) || rc=$?
      ran=$(( ran + last - first + 1 ))
      if [ "$rc" -eq 2 ]; then
        local line seed problem
        line=$(grep -m1 '^seed [0-9]*: ' <<<"$out")
        seed=$(sed -E 's/^seed ([0-9]+):.*/\1/' <<<"$line")
        problem=$(sed -E 's/^seed [0-9]+: [0-9]+ problem\(s\), first: //; s/\|/\\|/g' <<<"$line")
        echo "caught $seed $(basename "$topo") $ran $problem"
        return 0
      elif [ "$rc" -ne 0 ]; then
        echo "troupe swarm failed (exit $rc) on $topo $first..$last" >&2
        return 1
      fi
    done
    first=$(( last + 1 ))
  done
  echo "passed - - $ran -"
}

echo "mutations: $(git rev-parse --short HEAD), up to $seeds seeds per topology" \
     "(${topologies[*]}), $jobs jobs" >&2
build || { echo "the unmutated tree does not build: $build_dir/mutation-build.log" >&2; exit 1; }
res=$(swarm "$chunk") || exit 1
read -r verdict _ <<<"$res"
if [ "$verdict" != passed ]; then
  echo "the unmutated tree fails the swarm: fix that first" >&2
  exit 1
fi

echo "| mutation | defect | caught | first failing seed | seeds run | first problem |"
echo "|---|---|---|---|---|---|"
missed=0
for patch in bench/mutations/*.patch; do
  name=$(basename "$patch" .patch)
  if [ "${#only[@]}" -gt 0 ] && [[ ! " ${only[*]} " == *" $name "* ]]; then
    continue
  fi
  what=$(sed -n '1s/^Mutation: //p' "$patch")
  files=$(git apply --numstat "$patch" | cut -f3)
  # shellcheck disable=SC2086
  if ! git diff --quiet HEAD -- $files; then
    echo "$name: $files has uncommitted changes; commit or stash them first" >&2
    exit 1
  fi
  start=$(date +%s)
  echo "$patch" >"$marker"
  if ! git apply "$patch"; then
    rm -f "$marker"
    echo "$name: does not apply to the tree" >&2
    exit 1
  fi
  if ! build; then
    echo "$name: the mutated tree does not build: $build_dir/mutation-build.log" >&2
    exit 1
  fi
  res=$(swarm "$seeds") || exit 1
  read -r verdict seed topo ran problem <<<"$res"
  revert
  if [ "$verdict" = caught ]; then
    echo "| $name | $what | yes | $seed ($topo) | $ran | $problem |"
  else
    missed=$(( missed + 1 ))
    echo "| $name | $what | **no** | - | $ran | - |"
  fi
  echo "$name: $verdict after $ran seeds in $(( $(date +%s) - start )) s" >&2
done
build || true # leave the build unmutated
exit $(( missed > 0 ? 2 : 0 ))
