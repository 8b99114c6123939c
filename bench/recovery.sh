#!/usr/bin/env bash
# Recovery after a decode rank failure on v4flash-1k (docs/benchmarks.md, "Recovery after a
# decode rank failure"): the Mooncake trace sped up x4, once fault-free and once with
# examples/faults/decode-rank-failure.toml (GPU 3 of decode/0 fails at 2 min), in three
# configurations: the autoscaler off (the instance restarts by itself after the restart time,
# EP shrunk), on with the topology's ready inventory (2 slots), and on with none. Prints, per
# configuration: requests affected (rerouted), their e2e, the e2e p99 of all requests against
# the fault-free run of the same configuration, and when decode capacity was back.
#
#   bench/recovery.sh [TROUPE] [OUT]     (defaults: build/troupe, build/recovery)
set -euo pipefail
troupe=${1:-build/troupe}
out=${2:-build/recovery}
topo=examples/topologies/v4flash-1k.toml
trace=examples/traces/mooncake_fast25_conversation_trace.jsonl
plan=examples/faults/decode-rank-failure.toml
mkdir -p "$out"

# The topology variants: the [autoscaler] section enabled, with the shipped inventory (2
# slots) or none. The pools' min is raised to their initial size (prefill 32, decode 6), so
# the autoscaler keeps them there: this trace needs far less than that, and without the pin it
# would spend the run shrinking both pools, which is not what is measured here.
cp "$topo" "$out/off.toml"
pin=(-e 's/^\[autoscaler\]$/[autoscaler]\nenabled = true/'
     -e 's/min = 16, initial = 32/min = 32, initial = 32/'
     -e 's/min = 4, initial = 6/min = 6, initial = 6/')
sed "${pin[@]}" "$topo" > "$out/inventory.toml"
sed "${pin[@]}" -e 's/^ready_inventory = [0-9]*/ready_inventory = 0/' "$topo" \
  > "$out/no-inventory.toml"
grep -q 'min = 6, initial = 6' "$out/inventory.toml" # the pin applied

for config in off inventory no-inventory; do
  for run in base fault; do
    faults=()
    [[ $run == fault ]] && faults=(--faults "$plan")
    "$troupe" sim "$out/$config.toml" --trace "$trace" --speedup 4 --seed 1 --quiet \
      "${faults[@]}" --report "$out/$config-$run" > "$out/$config-$run.txt"
  done
done

printf '%-13s %9s %22s %26s %s\n' config affected "affected e2e p50/p99" \
  "e2e p99 all (base->fault)" "decode capacity back"
for config in off inventory no-inventory; do
  base=$out/$config-base/report.json
  fault=$out/$config-fault/report.json
  affected=$(jq '.requests.rerouted' "$fault")
  aff=$(jq -r '.latency_ms.e2e_rerouted // {}
    | "\((.p50 // 0) / 10 | round / 100) / \((.p99 // 0) / 10 | round / 100) s"' "$fault")
  p99=$(jq -r --slurpfile b "$base" '
    "\($b[0].latency_ms.e2e.p99 | round) -> \(.latency_ms.e2e.p99 | round) ms"' "$fault")
  # Back: the instance's own restart (EP after it), or the replacement joining.
  back=$(jq -r '
    ([.timeline[] | select(.target == "decode/0" and .kind == "restart")
      | "decode/0 restarted at \(.at_s) s, EP \(.ep)"] +
     [(.autoscaler.events // [])[] | select(.pool == "decode" and .kind == "retired")
      | "decode/\(.instance) retired at \(.t_s) s"] +
     [(.autoscaler.events // [])[] | select(.pool == "decode" and
        (.kind == "ordered" or .kind == "joined") and .t_s >= 120)
      | "decode/\(.instance) \(.kind) at \(.t_s) s\(if .detail then " (" + .detail + ")" else "" end)"])
    | join("; ")' "$fault")
  printf '%-13s %9s %22s %26s %s\n' "$config" "$affected" "$aff" "$p99" "$back"
done
