#!/bin/bash
# The Slurm harness: `troupe slurm`'s heterogeneous job on a real slurmctld and slurmd.
#
#   tests/cluster/slurm/run.sh TROUPE
#
# On this machine (root, Debian's slurmctld, slurmd, slurm-client and munge installed by
# scripts/install-deps.sh) it starts munged with a fresh key, one slurmctld and four slurmd
# daemons (nodes n1..n4, 64 CPUs and 8 GRES gpus each, all on 127.0.0.1 with a port and spool
# directory of their own) as plain background processes in a temporary directory, waits until
# sinfo shows the four nodes idle, and then:
#   1. submits the script `TROUPE slurm topology.toml` writes (component 0 the control, 1 the
#      prefill pool, 2 the decode pool), with stand_in_node.sh in place of `troupe node`, and
#      checks that every process ran once in its own component with the right arguments
#      (role, index, the control's address), that the decode instance's two ranks ran on two
#      machines, that the steps got their GPUs, and that every component completed;
#   2. submits it again with the stand-ins holding, scancel's the job once they all run, and
#      checks that the job is gone and that every process received SIGTERM;
#   3. serves for real: `troupe launch --slurm examples/topologies/local-cpu-3.toml` submits
#      the job with the real `troupe node` on a random small model (control, store, one
#      prefill with its block fetcher, two decode processes, CPU engines, mutual TLS between
#      them with `troupe certs`' files) and follows it; a chat completion to the control's HTTP port must give `troupe generate`'s
#      tokens; a long prompt sent twice is read the second time through prefill/0's block
#      fetcher, which runs in the prefill's step; the fetcher, killed with kill -9, is
#      restarted in that step and serves the next prompt's hit; then SIGTERM to the launcher must drain the
#      job (scancel --signal=TERM): every process stops cleanly, the job COMPLETED, and the
#      launcher says so and exits 0.
# The stand-in of 1 and 2 proves placement and signalling on GPU topologies; 3 proves serving.
# Everything started is stopped and the directory removed on exit, failure included. Exit
# status 0: passed, 77: skipped (not root or Slurm missing), anything else: failed. Bounded:
# every wait has a deadline; it takes about a minute.
set -uo pipefail

troupe="${1:?usage: run.sh TROUPE}"
here="$(cd "$(dirname "$0")" && pwd)"

skip() { echo "slurm harness: skipped: $*"; exit 77; }
fail() { echo "slurm harness: FAILED: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "needs root (slurmd runs jobs as their user)"
for c in munged mungekey slurmctld slurmd sbatch squeue sinfo scontrol scancel python3; do
  command -v "$c" >/dev/null || skip "$c is not installed (scripts/install-deps.sh)"
done

dir="$(mktemp -d /tmp/troupe-slurm.XXXXXX)"
chmod 755 "$dir"
pids=()
munged_pid=""
# On failure: the job's processes still alive (steps and troupe processes, found by the
# directory in their command line or environment), each troupe process's threads' stacks.
dump_leftovers() {
  local p comm
  for p in $(pgrep -x slurmstepd) $(pgrep -x troupe); do
    grep -qs "$dir" "/proc/$p/cmdline" "/proc/$p/environ" || continue
    comm="$(cat "/proc/$p/comm" 2>/dev/null)" || continue
    echo "--- still running: $p $comm (state $(awk '/^State/ {print $2}' "/proc/$p/status" 2>/dev/null)):" \
      "$(tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-160)"
    if [ "$comm" = troupe ] && command -v gdb >/dev/null; then
      timeout 30 gdb -p "$p" -batch -ex "thread apply all bt 10" 2>/dev/null \
        | grep -E '^(Thread|#)' | head -n 120
    fi
  done
}
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
    for log in "$dir"/slurmctld.log "$dir"/slurmd-n1.log "$dir"/job-*.out; do
      [ -f "$log" ] && { echo "--- $log (tail)"; tail -n 20 "$log"; }
    done
    dump_leftovers
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  [ -n "$munged_pid" ] && kill "$munged_pid" 2>/dev/null
  for p in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  # Job processes are children of slurmstepd, which the slurmds' exit leaves behind, and
  # killing a slurmstepd leaves its children (the batch script, sruns, troupe nodes) running:
  # every process whose command line or environment names this harness's directory goes.
  # (Left running, they held the next run's fetcher lookup by topology path: that run failed.)
  kill_leftovers() {
    local p
    for p in $(pgrep -x slurmstepd) $(pgrep -f -- "$dir/"); do
      [ "$p" = $$ ] && continue
      if grep -q "$dir" "/proc/$p/environ" 2>/dev/null || grep -q "$dir" "/proc/$p/cmdline" 2>/dev/null; then
        kill -9 "$p" 2>/dev/null
      fi
    done
  }
  kill_leftovers
  rm -rf "$dir"
  exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Five free loopback ports: slurmctld and the four slurmds.
read -r -a ports <<< "$(python3 -c '
import socket
socks = [socket.socket() for _ in range(5)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"

# munge: a key of our own, a socket in the directory.
mkdir -p "$dir/munge" "$dir/state" "$dir/out"
mungekey --create --keyfile="$dir/munge/munge.key" --force >/dev/null 2>&1 \
  || fail "mungekey could not create a key"
chmod 600 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/seed" || fail "munged did not start"
munged_pid="$(cat "$dir/munge/munged.pid")"

host="$(hostname -s)"
cat > "$dir/slurm.conf" <<CONF
ClusterName=troupetest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${ports[0]}
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Heterogeneous jobs are started by the backfill scheduler only: run it every second.
SchedulerParameters=bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
KillWait=10
MinJobAge=300
SlurmdTimeout=60
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=${ports[1]} CPUs=64 RealMemory=4096 Gres=gpu:8 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=${ports[2]} CPUs=64 RealMemory=4096 Gres=gpu:8 State=UNKNOWN
NodeName=n3 NodeHostname=localhost NodeAddr=127.0.0.1 Port=${ports[3]} CPUs=64 RealMemory=4096 Gres=gpu:8 State=UNKNOWN
NodeName=n4 NodeHostname=localhost NodeAddr=127.0.0.1 Port=${ports[4]} CPUs=64 RealMemory=4096 Gres=gpu:8 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
# Slurm keeps only GPUs with device files: eight character devices that are /dev/null (1:3),
# so Slurm schedules and hands out GPUs by index while no device is touched.
mkdir -p "$dir/dev"
for i in 0 1 2 3 4 5 6 7; do
  mknod "$dir/dev/nvidia$i" c 1 3 || skip "mknod is not permitted here (fake GPU device files)"
done
echo "NodeName=n[1-4] Name=gpu File=$dir/dev/nvidia[0-7]" > "$dir/gres.conf"
export SLURM_CONF="$dir/slurm.conf"

slurmctld -D -c -f "$SLURM_CONF" >"$dir/slurmctld.stdout" 2>&1 &
pids+=($!)
for n in n1 n2 n3 n4; do
  mkdir -p "$dir/spool-$n"
  slurmd -D -N "$n" -f "$SLURM_CONF" >"$dir/slurmd-$n.stdout" 2>&1 &
  pids+=($!)
done

# Wait (at most 60 s) until the four nodes are idle.
idle=0
for _ in $(seq 1 300); do
  idle="$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)"
  [ "$idle" -eq 4 ] && break
  sleep 0.2
done
[ "$idle" -eq 4 ] || fail "the nodes did not become idle in 60 s: $(sinfo -N 2>&1)"
echo "slurm harness: slurmctld and 4 slurmds up (${SECONDS} s)"

"$troupe" slurm "$here/topology.toml" --troupe "$here/stand_in_node.sh" \
  --gpus-per-node 8 --cpus-per-gpu 2 --output "$dir/job-%j.out" --out "$dir/job.sh" \
  || fail "troupe slurm failed"

# Waits (at most $2 tenths of a second) until job $1 has left the queue.
wait_gone() {
  for _ in $(seq 1 "$2"); do
    [ -z "$(squeue -h -j "$1" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  return 1
}

# --- 1. the job runs: placement, arguments, GPUs, completion -------------------------------
export TROUPE_STANDIN_OUT="$dir/out/run"
mkdir -p "$TROUPE_STANDIN_OUT"
job="$(sbatch --parsable "$dir/job.sh")" || fail "sbatch refused the script"
job="${job%%;*}"
wait_gone "$job" 600 || fail "job $job did not finish in 60 s: $(squeue 2>&1)"
components="$(scontrol show job -o "$job")"
[ "$(grep -c . <<< "$components")" -eq 3 ] || fail "job $job has not 3 components: $components"
states="$(grep -o 'JobState=[A-Z]*' <<< "$components" | sort -u)"
[ "$states" = "JobState=COMPLETED" ] || fail "job $job did not complete: $states"

# The nodes of het component $1.
component_nodes() {
  local line
  line="$(grep "HetJobOffset=$1 " <<< "$components")"
  scontrol show hostnames "$(sed -n 's/.* NodeList=\([^ ]*\).*/\1/p' <<< "$line")"
}
# Checks the stand-in file $1 of het component $2: ran there, with arguments $3.
check_process() {
  local f="$TROUPE_STANDIN_OUT/$1"
  [ -f "$f" ] || fail "$1 did not run (files: $(ls "$TROUPE_STANDIN_OUT"))"
  local node; node="$(sed -n 's/^node=//p' "$f")"
  component_nodes "$2" | grep -qx "$node" || fail "$1 ran on $node, outside component $2"
  grep -qx "args=$3" "$f" || fail "$1 arguments: $(grep '^args=' "$f"), expected $3"
  echo "$node"
}
topo="$here/topology.toml"
check_process control-0.0 0 \
  "node $topo --role control --control 0.0.0.0:4242 --listen 0.0.0.0:8000" >/dev/null
for i in 0 1; do
  check_process "prefill-$i.0" 1 "node $topo --role prefill --index $i --control 127.0.0.1:4242 --fabric-host auto" \
    >/dev/null
  grep -qx 'SLURM_GPUS_ON_NODE=4' "$TROUPE_STANDIN_OUT/prefill-$i.0" \
    || fail "prefill-$i did not get 4 GPUs: $(grep GPU "$TROUPE_STANDIN_OUT/prefill-$i.0")"
done
# The two prefill instances share one 8-GPU machine: Slurm must give them disjoint GPUs.
p0="$(sed -n 's/^node=//p' "$TROUPE_STANDIN_OUT/prefill-0.0"):$(sed -n 's/^SLURM_STEP_GPUS=//p' "$TROUPE_STANDIN_OUT/prefill-0.0")"
p1="$(sed -n 's/^node=//p' "$TROUPE_STANDIN_OUT/prefill-1.0"):$(sed -n 's/^SLURM_STEP_GPUS=//p' "$TROUPE_STANDIN_OUT/prefill-1.0")"
if [ "${p0%%:*}" = "${p1%%:*}" ]; then
  overlap="$(comm -12 <(tr , '\n' <<< "${p0#*:}" | sort) <(tr , '\n' <<< "${p1#*:}" | sort))"
  [ -z "$overlap" ] || fail "prefill-0 ($p0) and prefill-1 ($p1) share GPUs $overlap"
fi
grep -L '^SLURM_HET_SIZE=3$' "$TROUPE_STANDIN_OUT"/* | grep -q . \
  && fail "a process does not see the 3-component job: $(grep -L '^SLURM_HET_SIZE=3$' "$TROUPE_STANDIN_OUT"/*)"
d0="$(check_process decode-0.0 2 "node $topo --role decode --index 0 --control 127.0.0.1:4242 --fabric-host auto")"
d1="$(check_process decode-0.1 2 "node $topo --role decode --index 0 --control 127.0.0.1:4242 --fabric-host auto")"
[ "$d0" != "$d1" ] || fail "the decode instance's two ranks share $d0"
grep -qx 'SLURM_GPUS_ON_NODE=8' "$TROUPE_STANDIN_OUT/decode-0.0" \
  || fail "decode-0 rank 0 did not get 8 GPUs"
[ "$(ls "$TROUPE_STANDIN_OUT" | wc -l)" -eq 5 ] \
  || fail "expected 5 processes, got: $(ls "$TROUPE_STANDIN_OUT")"
echo "slurm harness: job $job ran 5 processes in 3 components (prefill GPUs $p0 and $p1," \
  "decode ranks on $d0 and $d1) (${SECONDS} s)"

# --- 2. scancel signals every process -------------------------------------------------------
export TROUPE_STANDIN_OUT="$dir/out/hold" TROUPE_STANDIN_HOLD=1
mkdir -p "$TROUPE_STANDIN_OUT"
job="$(sbatch --parsable "$dir/job.sh")" || fail "sbatch refused the script"
job="${job%%;*}"
started=0
for _ in $(seq 1 600); do
  started="$(ls "$TROUPE_STANDIN_OUT" | grep -c '\.started$')"
  [ "$started" -eq 5 ] && break
  sleep 0.1
done
[ "$started" -eq 5 ] || fail "only $started of 5 processes started in 60 s"
scancel "$job" || fail "scancel $job failed"
wait_gone "$job" 600 || fail "job $job still queued 60 s after scancel: $(squeue 2>&1)"
# (The job leaves the queue as its steps end; a stand-in's trap may still be writing.)
for _ in $(seq 1 100); do
  terms="$(ls "$TROUPE_STANDIN_OUT" | grep -c '\.term$')"
  [ "$terms" -eq 5 ] && break
  sleep 0.1
done
[ "$terms" -eq 5 ] || fail "only $terms of 5 processes got SIGTERM: $(ls "$TROUPE_STANDIN_OUT")"
echo "slurm harness: scancel $job: job gone, 5 of 5 processes got SIGTERM (${SECONDS} s)"

# --- 3. the real troupe node serves a request, and scancel --signal=TERM drains it ----------
"$troupe" model init --preset small --seed 1 --out "$dir/model" >/dev/null \
  || fail "troupe model init failed"
# Two free ports below the kernel's ephemeral range: the job binds them seconds later, and a port
# from that range can meanwhile become the local end of another test's outgoing connection.
read -r http_port control_port <<< "$(python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
top = low if low > 12000 else 65536
ports = []
while len(ports) < 2:
    p = random.randrange(10000, top)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        if p not in ports: ports.append(p)
    except OSError:
        pass
    finally:
        s.close()
print(*ports)')"
topo="$(cd "$here/../../.." && pwd)/examples/topologies/local-cpu-3.toml"
# One identity for every process of the job (on the job's shared file system): mutual TLS.
"$troupe" certs --out "$dir/certs" --nodes cluster >/dev/null || fail "troupe certs failed"
"$troupe" launch "$topo" --slurm --listen "127.0.0.1:$http_port" \
  --control "127.0.0.1:$control_port" --cpus-per-gpu 1 --model "$dir/model" --kv-dir "$dir/kv" \
  --engram-map identity --threads 1 --grace 2 --output "$dir/job-%j.out" \
  --tls-ca "$dir/certs/ca.pem" --tls-cert "$dir/certs/cluster.pem" \
  --tls-key "$dir/certs/cluster.key" >"$dir/launch.log" 2>&1 &
launcher=$!
pids+=("$launcher")
job=""
for _ in $(seq 1 300); do
  job="$(sed -n 's/^troupe launch: submitted Slurm job \([0-9]*\) .*/\1/p' "$dir/launch.log")"
  [ -n "$job" ] && break
  kill -0 "$launcher" 2>/dev/null || fail "troupe launch --slurm exited: $(cat "$dir/launch.log")"
  sleep 0.1
done
[ -n "$job" ] || fail "troupe launch --slurm submitted nothing in 30 s: $(cat "$dir/launch.log")"
ready=""
for _ in $(seq 1 1200); do  # 120 s: four processes load the model
  ready="$(python3 - "$http_port" <<'PY' 2>/dev/null
import sys, urllib.request
try:
    print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/ready", timeout=2).status)
except Exception:
    pass
PY
)"
  [ "$ready" = "200" ] && break
  [ -n "$(squeue -h -j "$job" 2>/dev/null)" ] || fail "job $job ended before serving: $(cat "$dir"/job-"$job".out)"
  sleep 0.1
done
[ "$ready" = "200" ] || fail "job $job did not serve within 120 s: $(cat "$dir"/job-"$job".out)"
# The served tokens must be the engine's: `troupe generate` greedy on the same prompt ids.
python3 - "$troupe" "$dir/model" "$http_port" <<'PY' || fail "job $job: see above; $(cat "$dir"/job-"$job".out)"
import json, subprocess, sys, urllib.request
troupe, model, port = sys.argv[1:]
body = {"model": "deepseek-v4.1-flash", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Hello from Slurm"}]}
run = lambda *a, **k: subprocess.run([troupe, *a], check=True, capture_output=True, text=True,
                                     timeout=600, **k).stdout
ids = json.loads(run("encode", "--protocol", "chat", "-", input=json.dumps(body)))["ids"]
tokens = run("generate", "--model", model, "--tokens", ",".join(map(str, ids)), "--greedy",
             "--batch-invariant", "--ignore-eos", "--max-new", "8", "--engram-map", "identity")
want = run("detokenize", "--ids", json.dumps([int(t) for t in tokens.strip().split(",")]))
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                             data=json.dumps(body).encode(),
                             headers={"content-type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=300))
m = r["choices"][0]["message"]
got = (m.get("reasoning_content") or "") + (m.get("content") or "")
if r["usage"]["completion_tokens"] != 8 or got != want.rstrip("\n"):
    sys.exit(f"served {r['usage']['completion_tokens']} tokens {got!r}, troupe generate {want!r}")
PY
echo "slurm harness: job $job served 8 tokens equal to troupe generate's (${SECONDS} s)"
# Sends a 400-word prompt of words "$1"0 .. "$1"399 (several 128-token blocks) to the control's
# HTTP port again and again until it finds its prefix cached (the blocks are committed shortly
# after the first answer); fails after 20 tries.
until_cached() {
  python3 - "$http_port" "$1" <<'PY'
import json, sys, time, urllib.request
body = {"model": "deepseek-v4.1-flash", "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user",
                      "content": " ".join(f"{sys.argv[2]}{i}" for i in range(400))}]}
for _ in range(20):
    req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    r = json.load(urllib.request.urlopen(req, timeout=300))
    if r["usage"]["completion_tokens"] != 2:
        sys.exit(f"served {r['usage']}")
    if r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0:
        sys.exit(0)
    time.sleep(0.5)
sys.exit("the prompt was never a prefix hit")
PY
}
# A long prompt, again until it is a prefix hit: the prefill process reads its blocks through
# its block fetcher (same step, same machine).
until_cached word || fail "job $job: the repeated prompt; $(cat "$dir"/job-"$job".out)"
# A block fetcher that dies is restarted in its step (troupe_respawn): kill -9 fetcher/0, wait
# until it is back and registered again, and read another prompt's cached blocks through it.
fetcher_pid="$(pgrep -f -- "node $topo --role fetcher --index 0 " | head -n 1)"
[ -n "$fetcher_pid" ] || fail "no fetcher/0 process: $(cat "$dir"/job-"$job".out)"
kill -KILL "$fetcher_pid"
back=0
for _ in $(seq 1 600); do  # 60 s
  out="$(cat "$dir"/job-"$job".out)"
  if grep -q "^troupe: fetcher/0 exited with status 137; restart 1 in 1 s$" <<< "$out" \
     && [ "$(grep -c "troupe node\[fetcher/0\]: fetching blocks for prefill/0 " <<< "$out")" -eq 2 ]; then
    back=1
    break
  fi
  sleep 0.1
done
[ "$back" -eq 1 ] || fail "fetcher/0 was not restarted within 60 s of kill -9: $out"
until_cached term || fail "job $job: the prompt after the fetcher's restart; $(cat "$dir"/job-"$job".out)"
echo "slurm harness: fetcher/0 restarted in its step after kill -9 (${SECONDS} s)"
# The launcher drains the job on SIGTERM (scancel --signal=TERM) and ends with it.
kill -TERM "$launcher"
launched=1
for _ in $(seq 1 900); do
  kill -0 "$launcher" 2>/dev/null || { wait "$launcher"; launched=$?; break; }
  sleep 0.1
done
out="$(cat "$dir/launch.log")"
[ "$launched" -eq 0 ] || fail "troupe launch --slurm ended with status $launched after SIGTERM: $out"
wait_gone "$job" 100 || fail "job $job still queued after the launcher ended: $(squeue 2>&1)"
state="$(scontrol show job -o "$job" | grep -o 'JobState=[A-Z]*' | sort -u)"
[ "$state" = "JobState=COMPLETED" ] || fail "job $job ended $state after the drain: $out"
grep -q "^troupe launch: job $job ended: COMPLETED$" <<< "$out" \
  || fail "the launcher did not report the job's end: $out"
grep -q "^troupe launch: job $job runs; the HTTP API will be at http://127.0.0.1:$http_port " \
  <<< "$out" || fail "the launcher did not say where the API is: $out"
# The job's output reached the launcher's stderr; every process ran over mutual TLS.
for name in control store prefill/0 fetcher/0 decode/0 decode/1; do
  grep -q "troupe node\[$name\]: stopped" <<< "$out" || fail "$name did not stop cleanly: $out"
done
# The block store ran as a process of its own beside the control (local-cpu-3 names a store
# directory), which waited for it; the prefix cache was the store process's.
grep -q "troupe node\[store\]: serving the block store in $dir/kv " <<< "$out" \
  || fail "the store process did not serve $dir/kv: $out"
grep -q "troupe node\[control\]: control on 127.0.0.1:$control_port (mutual TLS)" <<< "$out" \
  || fail "the control process did not publish over TLS: $out"
[ "$(grep -c "joined the control process at 127.0.0.1:$control_port over mutual TLS" <<< "$out")" -eq 3 ] \
  || fail "not every instance joined over TLS: $out"
# prefill/0's block fetcher ran in its step and handed it the repeated prompt's cached blocks.
grep -q "troupe node\[fetcher/0\]: fetching blocks for prefill/0 from the cluster at 127.0.0.1:$control_port" \
  <<< "$out" || fail "no block fetcher beside prefill/0: $out"
fetched="$(sed -n 's/.*troupe node\[prefill\/0\]: cached blocks read: \([0-9]*\) through fetcher\/0.*/\1/p' <<< "$out")"
[ "${fetched:-0}" -gt 0 ] || fail "prefill/0 read no cached block through its fetcher: $out"
# Only the restarted fetcher stopped (the first was killed), having served the second prompt.
restarted="$(sed -n 's/.*troupe node\[fetcher\/0\]: \([0-9]*\) block(s) fetched into shared memory.*/\1/p' <<< "$out")"
[ "$(wc -l <<< "$restarted")" -eq 1 ] && [ "${restarted:-0}" -gt 0 ] \
  || fail "the restarted fetcher/0 fetched no block (${restarted:-none}): $out"
# The prompts' KV went from the prefill process to a decode process over the fabric link.
offered="$(sed -n 's/.*troupe node\[prefill\/0\]: KV over the fabric: \([0-9]*\) offered.*/\1/p' <<< "$out")"
pulled="$(sed -n 's/.*troupe node\[decode\/[01]\]: KV over the fabric: .* \([0-9]*\) pulled.*/\1/p' <<< "$out" | awk '{s += $1} END {print s + 0}')"
[ "${offered:-0}" -gt 0 ] && [ "$pulled" -gt 0 ] \
  || fail "no KV over the fabric in job $job (offered ${offered:-0}, pulled $pulled): $out"
echo "slurm harness: troupe launch --slurm drained job $job on SIGTERM: its 6 processes stopped cleanly over TLS, $fetched cached block(s) through prefill/0's fetcher ($restarted after its restart), job COMPLETED (${SECONDS} s)"
echo "slurm harness: passed"
