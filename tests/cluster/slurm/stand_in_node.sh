#!/bin/bash
# Stands in for `troupe node` in the Slurm harness (run.sh), which does not run the real
# per-process role runner yet: it serves nothing. It records where Slurm placed it (its arguments, the node
# it runs on and its SLURM_* environment) in $TROUPE_STANDIN_OUT/<role>-<index>.<rank>, and
# with TROUPE_STANDIN_HOLD=1 it stays up (at most 120 s) until a SIGTERM, which it records in
# <file>.term before exiting, the way a decode process starts its drain.
set -u
out="${TROUPE_STANDIN_OUT:?TROUPE_STANDIN_OUT is not set}"
role="" index="0"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --role) role="${args[$((i + 1))]}" ;;
    --index) index="${args[$((i + 1))]}" ;;
  esac
done
file="$out/$role-$index.${SLURM_PROCID:-0}"
{
  echo "args=$*"
  echo "node=${SLURMD_NODENAME:-}"
  env | grep '^SLURM' | sort
} > "$file.tmp"
mv "$file.tmp" "$file"
if [ "${TROUPE_STANDIN_HOLD:-0}" = "1" ]; then
  sleeper=""
  trap 'echo "SIGTERM at $(date +%s.%N)" > "$file.term"; [ -n "$sleeper" ] && kill -KILL "$sleeper" 2>/dev/null; exit 0' TERM
  touch "$file.started"
  # The sleeper ignores SIGTERM: Slurm signals every process of the step, and a sleeper that
  # died of it first would end the wait before this shell ran its trap (then it wrote .timeout).
  (trap '' TERM; exec sleep 120) &
  sleeper=$!
  wait "$sleeper"
  echo "not signalled within 120 s" > "$file.timeout"
  exit 1
fi
exit 0
