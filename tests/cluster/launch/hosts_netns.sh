#!/usr/bin/env bash
# `troupe launch --hosts` across three hosts built on this machine: network namespaces h1, h2,
# h3 joined by veth pairs to a bridge in a fourth namespace (the switch), 10.231.7.0/24. Each
# host runs `troupe agent`; the launcher (on h1) places the control process, the store process
# (the hosts file lists no store role: it goes with the control process) and prefill/0 on
# h1, decode/0 on h2 and decode/1 on h3, and starts them through the agents. The prompts' KV
# crosses from h1 to h2 / h3 over the fabric link (libfabric tcp). Between the processes and
# the agents the links are mutual TLS (`troupe certs`: the agents and the launcher under a CA
# that the agents alone trust, the cluster's processes under another). The test checks
# that each process runs in its host's namespace, that an agent refuses the processes'
# certificate and takes the launcher's, that a client on h2 is served across the
# hosts, that the fault plan's 2 s partition of the link prefill/0 <-> decode/0 cuts h1 and h2
# off from each other (h2's agent drops their packets; h3 still reaches both), that a request
# sent meanwhile gets its fault-free tokens and nothing is lost over the cut, that a decode process killed on h2 is restarted there by its agent while requests
# go on and that no other process loses its links (over TLS too: docs/tls.md), that when
# host h3 is lost (its namespace's processes killed) its decode process moves to h2 and
# serves, that h3's agent, started again, is reconnected and takes both decode processes when
# h2 is lost in turn, that when h1 is lost (its agent and node processes killed; the launcher
# itself lives on) the control process moves to h3 with the store and prefill/0, the decode
# processes restart to join it, and the cluster serves again on h3's address, and that
# SIGTERM stops the whole cluster. Traffic goes only to the namespaces'
# addresses. Needs root (ip netns); exits 77 (skipped) without it.
#   bash tests/cluster/launch/hosts_netns.sh build/troupe
HOSTS=3 NET=10.231.7
source "$(dirname "$0")/netns_hosts.sh" "$1"
for i in 1 2 3; do start_agent "$i"; done
{ host 1 '["control", "prefill"]'; host 2 '["decode"]'; host 3 '["decode", "control", "prefill"]'; } \
  > "$WORK/hosts.toml"

# A fault plan: 20 s after the cluster serves, the link between prefill/0 (h1) and decode/0
# (h2) is cut for 5 s (briefer than the 8 s in which a silent link is closed; long enough for
# the three probes below to run inside it on a loaded machine: at 2 s one once ran after it).
# The first request, from h2, must be answered before the cut begins: with the cut at 12 s a
# CI run's probes ran after it, most likely behind a late first answer (the model's first
# request on each process).
cat > "$WORK/faults.toml" <<TOML
[[fault]]
at = "20s"
kind = "partition"
link = ["prefill/0", "decode/0"]
duration = "5s"
TOML

ip netns exec "$TAG-h1" "$TROUPE" launch "$ROOT/examples/topologies/local-cpu-3.toml" \
  --model "$WORK/model" --engram-map identity --hosts "$WORK/hosts.toml" \
  --faults "$WORK/faults.toml" \
  --listen "$NET.1:0" --threads 1 --grace 1 --kv-dir "$WORK/kv" --state "$WORK/state.json" \
  $(launcher_tls) > "$WORK/launch.log" 2>&1 &
LAUNCHER=$!
PIDS=("$LAUNCHER" "${PIDS[@]}")

wait_running() {  # wait_running NAME KEY VALUE: until NAME runs with KEY == VALUE (2 min at most)
  for _ in $(seq 240); do
    [ "$(field "$1" "$2")" = "$3" ] && [ "$(field "$1" state)" = "running" ] && return 0
    sleep 0.5
  done
}
wait_serving

# Placement: each process on its host, and in that host's namespace.
for spec in control:h1 store:h1 prefill/0:h1 fetcher/0:h1 decode/0:h2 decode/1:h3; do
  name=${spec%%:*}; host=${spec##*:}
  got=$(state "next(p['host'] for p in s['processes'] if p['name']=='$name')")
  [ "$got" = "$host" ] || fail "$name placed on $got, expected $host"
  pid=$(state "next(p['pid'] for p in s['processes'] if p['name']=='$name')")
  [ "$(ip netns identify "$pid")" = "$TAG-$host" ] || fail "$name (pid $pid) is not in $TAG-$host"
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "--tls-cert $WORK/certs/cluster/cluster.pem" \
    || fail "$name (pid $pid) was not started with the cluster's certificate"
done

# The agents trust only their own CA: the cluster's processes' certificate (which every node
# process holds) is refused by an agent during the TLS handshake, the launcher's is not.
tls_probe() {  # tls_probe DIR/NAME: "accepted" or "refused" by h2's agent, from h1
  ip netns exec "$TAG-h1" python3 - "$WORK/certs/both.pem" "$WORK/certs/$1.pem" "$WORK/certs/$1.key" "$NET.2" <<'PY'
import socket, ssl, sys
ca, cert, key, host = sys.argv[1:]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.load_verify_locations(ca)
ctx.load_cert_chain(cert, key)
try:
    s = ctx.wrap_socket(socket.create_connection((host, 7700), 5))
    s.settimeout(2)
    print("accepted" if s.recv(1) else "refused")
except socket.timeout:
    print("accepted")
except (ssl.SSLError, OSError):
    print("refused")
PY
}
[ "$(tls_probe cluster/cluster)" = "refused" ] || fail "an agent accepted the cluster processes' certificate"
[ "$(tls_probe agents/launcher)" = "accepted" ] || fail "an agent refused the launcher's certificate"

first=$(ask "Hello from h2" 8)
[ "${first%% *}" = "8" ] || fail "request: $first"

# The fault plan's link partition: h2's agent cuts h2 off from h1 (both directions) while h3
# still reaches both; a request sent from h3 meanwhile is served once the link is back, with
# the same tokens; then h1 reaches h2 again, and no process or host was lost over it.
reaches() {  # reaches FROM TO: a TCP connection from host FROM's namespace to TO's agent port
  ip netns exec "$TAG-$1" python3 -c "import socket,sys; socket.create_connection(('$NET.${2#h}', 7700), 0.5).close()" 2>/dev/null
}
for _ in $(seq 600); do
  grep -q "troupe agent\[h2\]: cut off from $NET.1 for 5000 ms" "$WORK/agent2.log" && break
  sleep 0.1
done
grep -q "troupe agent\[h2\]: cut off from $NET.1 for 5000 ms" "$WORK/agent2.log" \
  || fail "h2's agent did not cut h2 off from h1"
grep -q "troupe launch: fault 0: cut h1 <-> h2 for 5 s (prefill/0 <-> decode/0)" "$WORK/launch.log" \
  || fail "the launcher did not cut the link of fault 0"
reaches h1 h2 && fail "h1 reached h2 during the cut"
reaches h2 h1 && fail "h2 reached h1 during the cut"
reaches h3 h2 || fail "h3 did not reach h2 during the cut of h1 <-> h2"
cut_ask=$(FROM=h3 ask "Hello from h2" 8)
[ "$cut_ask" = "$first" ] || fail "the greedy request during the cut gave '$cut_ask', before '$first'"
for _ in $(seq 100); do
  grep -q "troupe agent\[h2\]: reconnected to $NET.1$" "$WORK/agent2.log" && break
  sleep 0.1
done
grep -q "troupe agent\[h2\]: reconnected to $NET.1$" "$WORK/agent2.log" || fail "h2 was not reconnected"
reaches h1 h2 || fail "h1 does not reach h2 after the cut"
for name in control prefill/0 decode/0 decode/1; do
  [ "$(field "$name" restarts)" = "0" ] || fail "$name restarted over a 2 s cut"
done
[ "$(state "[h['state'] for h in s['hosts']]")" = "['up', 'up', 'up']" ] || fail "a host was lost over the cut"
echo "link partition: h1 <-> h2 cut for 2 s by h2's agent, a request from h3 served through it"

# decode/0 killed on h2 while a request streams: it completes, and h2's agent restarts it.
victim=$(state "next(p['pid'] for p in s['processes'] if p['name']=='decode/0')")
ask "Hello from h2" 40 > "$WORK/during" &
ASK=$!
sleep 1
ip netns exec "$TAG-h2" kill -KILL "$victim"
wait "$ASK" || fail "the request during the kill failed"
during=$(cat "$WORK/during")
[ "${during%% *}" = "40" ] || fail "request during the kill: $during"
again=$(ask "Hello from h2" 8)
[ "$again" = "$first" ] || fail "the same greedy request after the kill gave '$again', before '$first'"
wait_running decode/0 restarts 1
pid=$(state "next(p['pid'] for p in s['processes'] if p['name']=='decode/0')")
[ "$pid" != "$victim" ] || fail "decode/0 was not restarted"
[ "$(ip netns identify "$pid")" = "$TAG-h2" ] || fail "the restarted decode/0 is not on h2"
grep -q "decode/0 (pid $victim) killed by SIGKILL; restart 1" "$WORK/launch.log" || fail "no restart in the log"
# Nothing else went down with it.
for name in control prefill/0 decode/1; do
  [ "$(state "next(p['restarts'] for p in s['processes'] if p['name']=='$name')")" = "0" ] \
    || fail "$name restarted after decode/0 was killed"
done

# Host h3 lost: every process in its namespace killed, its agent too. decode/1 moves to h2 (the
# live host that takes the decode role, with its fabric endpoint on h2's address), starts there
# as a restart, and serves.
ip netns pids "$TAG-h3" | xargs -r kill -KILL
wait_running decode/1 host h2
pid=$(state "next(p['pid'] for p in s['processes'] if p['name']=='decode/1' and p['host']=='h2' and p['state']=='running')")
[ "$(ip netns identify "$pid")" = "$TAG-h2" ] || fail "the moved decode/1 (pid $pid) is not in $TAG-h2"
tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "--fabric-host $NET.2 " \
  || fail "the moved decode/1 does not bind its fabric endpoint on h2"
grep -q "troupe launch: lost the agent of host h3$" "$WORK/launch.log" || fail "no lost host in the log"
[ "$(state "[h['state'] for h in s['hosts']]")" = "['up', 'up', 'lost']" ] || fail "h3 is not lost in the state file"
grep -q "troupe launch: decode/1 moves from h3 to h2; restart 1 in" "$WORK/launch.log" \
  || fail "no move in the log"
for _ in $(seq 240); do
  grep -q "troupe node\[decode/1\]: model loaded; serving in the decode pool" "$WORK/agent2.log" && break
  sleep 0.5
done
# With two decode instances the balancer keeps decode/1 for long contexts, so decode/0 goes
# down once more and the next request is decoded by the moved decode/1.
ip netns exec "$TAG-h2" kill -KILL "$(state "next(p['pid'] for p in s['processes'] if p['name']=='decode/0')")"
sleep 0.5
after=$(ask "Hello from h2" 40)
[ "$after" = "$during" ] || fail "the greedy request after the host was lost gave '$after', before '$during'"
[ "$(state "s['http']")" = "$HTTP" ] || fail "the cluster's address changed"

# h3 comes back (its agent restarted): the launcher reconnects to it. Then h2 is lost: both
# decode processes move to h3, the one live host left that takes the decode role, and serve.
start_agent 3 "$WORK/agent3-again.log"
for _ in $(seq 120); do
  grep -q "troupe launch: the agent of host h3 is back$" "$WORK/launch.log" && break
  sleep 0.5
done
grep -q "troupe launch: the agent of host h3 is back$" "$WORK/launch.log" || fail "h3 did not come back"
[ "$(state "[h['state'] for h in s['hosts']]")" = "['up', 'up', 'up']" ] || fail "h3 is not up in the state file"
ip netns pids "$TAG-h2" | xargs -r kill -KILL
wait_running decode/0 host h3
wait_running decode/1 host h3
for name in decode/0 decode/1; do
  [ "$(ip netns identify "$(field "$name" pid)")" = "$TAG-h3" ] || fail "$name is not back on h3"
done
for _ in $(seq 240); do
  [ "$(grep -c "model loaded; serving in the decode pool" "$WORK/agent3-again.log")" = "2" ] && break
  sleep 0.5
done
back=$(ask "Hello from h2" 40)
[ "$back" = "$during" ] || fail "the greedy request after h2 was lost gave '$back', before '$during'"

# h1 lost: its agent and node processes killed (not the launcher, which stands for a machine
# of its own). The control process moves to h3, the other host that takes the control role,
# with its HTTP address; the store (which goes where the control may) and prefill/0 move there
# too (prefill/0's block fetcher with it), and the decode processes on h3 restart to join the
# new control process, without counting as crashes. The same greedy request gives the same
# tokens on the new address.
decode_restarts=$(field decode/0 restarts)
ip netns pids "$TAG-h1" | grep -vx "$LAUNCHER" | xargs -r kill -KILL
for name in control store prefill/0 fetcher/0; do wait_running "$name" host h3; done
for _ in $(seq 240); do
  NEW_HTTP=$(state 's["http"] or ""')
  [ -n "$NEW_HTTP" ] && [ "$NEW_HTTP" != "$HTTP" ] && break
  sleep 0.5
done
[ "${NEW_HTTP%:*}" = "$NET.3" ] || fail "the cluster serves on '$NEW_HTTP' after h1 was lost, not on h3"
grep -q "troupe launch: the control process moves from h1 to h3: control $NET.3:" "$WORK/launch.log" \
  || fail "no control move in the log"
for name in control store prefill/0 fetcher/0 decode/0 decode/1; do
  [ "$(ip netns identify "$(field "$name" pid)")" = "$TAG-h3" ] || fail "$name is not on h3"
  tr '\0' ' ' < "/proc/$(field "$name" pid)/cmdline" | grep -q -- "--control $NET.3:" \
    || fail "$name does not join the control process on h3"
done
[ "$(field decode/0 restarts)" = "$decode_restarts" ] || fail "decode/0's rejoin counted as a crash"
HTTP=$NEW_HTTP
for _ in $(seq 240); do
  [ "$(grep -c "model loaded; serving in the decode pool" "$WORK/agent3-again.log")" -ge 4 ] && break
  sleep 0.5
done
moved_control=$(ask "Hello from h2" 8)
[ "$moved_control" = "$first" ] || fail "the greedy request after the control moved gave '$moved_control', before '$first'"

# SIGTERM stops the cluster: every node process exits, the launcher with status 0.
kill -TERM "$LAUNCHER"
status=0
wait "$LAUNCHER" || status=$?
[ "$status" = "0" ] || fail "the launcher exited with $status"
for name in control store prefill/0 decode/0 decode/1; do
  pid=$(state "next(p['pid'] for p in s['processes'] if p['name']=='$name')")
  [ "$pid" = "0" ] || fail "$name still has pid $pid after the stop"
done
# The KV went from h1's prefill process to the decode processes over the fabric.
offered=$(cat "$WORK"/agent*.log | sed -n 's/.*troupe node\[prefill\/0\]: KV over the fabric: \([0-9]*\) offered.*/\1/p')
pulled=$(cat "$WORK"/agent2.log "$WORK"/agent3.log "$WORK"/agent3-again.log | sed -n 's/.*KV over the fabric: .* \([0-9]*\) pulled.*/\1/p' | awk '{s += $1} END {print s + 0}')
offered=$(echo "$offered" | awk '{s += $1} END {print s + 0}')
[ "$offered" -gt 0 ] && [ "${pulled:-0}" -gt 0 ] || fail "no KV over the fabric (offered ${offered:-0}, pulled ${pulled:-0})"
echo "KV over the fabric: $offered offered by prefill/0, $pulled pulled on h2 and h3"
# The last request was decoded on h3 after it came back: its KV came over the fabric there.
moved=$(sed -n 's/.*troupe node\[decode\/[01]\]: KV over the fabric: .* \([0-9]*\) pulled.*/\1/p' "$WORK"/agent3-again.log | awk '{s += $1} END {print s + 0}')
[ "$moved" -gt 0 ] || fail "no KV pulled on h3 after it came back"
echo "1 passed, 0 failed"
