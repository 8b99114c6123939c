#!/usr/bin/env bash
# A fault plan's link slowdown carried out by `troupe launch --hosts` across two hosts built
# on this machine (network namespaces, netns_hosts.sh): h1 runs the control process, the
# store and prefill/0, h2 both decode instances. The plan slows the link prefill/0 <-> decode
# by a factor of 100 for 6 s: both agents put traffic control on their host's interface
# (net_shape.hpp), so that a bulk TCP transfer between the hosts, in either direction, runs
# at about 1/100 of the veth's nominal 10 Gbit/s while the slowdown lasts and at full speed
# before and after it, and a greedy request sent meanwhile, whose KV crosses the slowed link
# over the fabric, gets its usual tokens. Needs root (ip netns); exits 77 (skipped) without it.
#   bash tests/cluster/launch/hosts_slow_link_netns.sh build/troupe
HOSTS=2 NET=10.231.9
source "$(dirname "$0")/netns_hosts.sh" "$1"
for i in 1 2; do start_agent "$i"; done
{ host 1 '["control", "prefill"]'; host 2 '["decode"]'; } > "$WORK/hosts.toml"
cat > "$WORK/faults.toml" <<TOML
[[fault]]
at = "8s"
kind = "slow"
link = ["prefill/0", "decode"]
factor = 100
duration = "6s"
TOML

# shellcheck disable=SC2046
ip netns exec "$TAG-h1" "$TROUPE" launch "$ROOT/examples/topologies/local-cpu-3.toml" \
  --model "$WORK/model" --engram-map identity --hosts "$WORK/hosts.toml" \
  --faults "$WORK/faults.toml" --listen "$NET.1:0" --threads 1 --grace 1 --kv-dir "$WORK/kv" \
  --state "$WORK/state.json" $(launcher_tls) > "$WORK/launch.log" 2>&1 &
LAUNCHER=$!
PIDS=("$LAUNCHER" "${PIDS[@]}")

wait_serving

# send FROM TO: seconds to send 8 MB over TCP from host FROM to host TO (acknowledged at the end).
cat > "$WORK/bulk.py" <<'PY'
import socket, sys, time
mode, addr = sys.argv[1], sys.argv[2]
size = 8 << 20
if mode == "serve":
    s = socket.create_server((addr, 7800))
    s.settimeout(60)
    c, _ = s.accept()
    got = 0
    while got < size:
        b = c.recv(1 << 20)
        if not b:
            break
        got += len(b)
    c.sendall(b"k")
    c.close()
else:
    for _ in range(100):
        try:
            c = socket.create_connection((addr, 7800), 5)
            break
        except OSError:
            time.sleep(0.05)
    t = time.monotonic()
    c.sendall(b"\0" * size)
    assert c.recv(1) == b"k"
    print(f"{time.monotonic() - t:.3f}")
PY
send() {
  ip netns exec "$TAG-$2" python3 "$WORK/bulk.py" serve "$NET.${2#h}" &
  local server=$!
  ip netns exec "$TAG-$1" python3 "$WORK/bulk.py" send "$NET.${2#h}"
  wait "$server"
}
before_12=$(send h1 h2)
before_21=$(send h2 h1)
want=$(ask "Slow links" 16)
[ "${want%% *}" = "16" ] || fail "request: $want"
echo "before the slowdown: 8 MB h1 -> h2 in $before_12 s, h2 -> h1 in $before_21 s"

for _ in $(seq 300); do
  grep -q "troupe agent\[h2\]: traffic to $NET.1 slowed 100x" "$WORK/agent2.log" \
    && grep -q "troupe agent\[h1\]: traffic to $NET.2 slowed 100x" "$WORK/agent1.log" && break
  sleep 0.1
done
grep -q "troupe agent\[h1\]: traffic to $NET.2 slowed 100x, to 100 Mbit/s" "$WORK/agent1.log" \
  || fail "h1's agent did not slow its traffic to h2"
grep -q "troupe agent\[h2\]: traffic to $NET.1 slowed 100x, to 100 Mbit/s" "$WORK/agent2.log" \
  || fail "h2's agent did not slow its traffic to h1"
grep -q "troupe launch: fault 0: slowed h1 <-> h2 100x for 6 s (prefill/0 <-> decode/0)" "$WORK/launch.log" \
  || fail "the launcher did not slow the link of fault 0"
ip netns exec "$TAG-h1" tc class show dev "$TAG-v1" | grep -q "rate 100Mbit" \
  || fail "no 100 Mbit/s class on h1: $(ip netns exec "$TAG-h1" tc class show dev "$TAG-v1")"
during_12=$(send h1 h2)
during_21=$(send h2 h1)
during=$(ask "Slow links" 16)
echo "during the slowdown: 8 MB h1 -> h2 in $during_12 s, h2 -> h1 in $during_21 s"
[ "$during" = "$want" ] || fail "the greedy request during the slowdown gave '$during', before '$want'"
# 8 MB at 100 Mbit/s take 0.67 s: at least 0.4 s, and ten times the time before.
python3 -c "import sys; b=[float(x) for x in sys.argv[1:5]]; sys.exit(0 if all(d >= 0.4 and d >= 10 * o for o, d in ((b[0], b[2]), (b[1], b[3]))) else 1)" \
  "$before_12" "$before_21" "$during_12" "$during_21" || fail "the slowed link was not slow enough"

for _ in $(seq 200); do
  grep -q "troupe agent\[h1\]: traffic to $NET.2 at full speed again" "$WORK/agent1.log" \
    && grep -q "troupe agent\[h2\]: traffic to $NET.1 at full speed again" "$WORK/agent2.log" && break
  sleep 0.1
done
grep -q "troupe agent\[h2\]: traffic to $NET.1 at full speed again" "$WORK/agent2.log" \
  || fail "h2's agent did not lift the slowdown"
ip netns exec "$TAG-h1" tc qdisc show dev "$TAG-v1" | grep -q htb && fail "h1 kept its htb qdisc"
after_12=$(send h1 h2)
after_21=$(send h2 h1)
echo "after the slowdown: 8 MB h1 -> h2 in $after_12 s, h2 -> h1 in $after_21 s"
python3 -c "import sys; b=[float(x) for x in sys.argv[1:]]; sys.exit(0 if b[0] < b[2] / 4 and b[1] < b[3] / 4 else 1)" \
  "$after_12" "$after_21" "$during_12" "$during_21" || fail "the link is still slow after the slowdown"
for name in control prefill/0 decode/0 decode/1; do
  [ "$(state "next(p['restarts'] for p in s['processes'] if p['name']=='$name')")" = "0" ] \
    || fail "$name restarted over the slowdown"
done

kill -TERM "$LAUNCHER"
status=0
wait "$LAUNCHER" || status=$?
[ "$status" = "0" ] || fail "the launcher exited with $status"
echo "1 passed, 0 failed"
