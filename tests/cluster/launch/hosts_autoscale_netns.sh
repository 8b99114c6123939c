#!/usr/bin/env bash
# `troupe launch --hosts` with the autoscaler, the hosts' `devices` and hosts joining and
# leaving, across three hosts built on this machine (network namespaces, netns_hosts.sh): h1
# takes the control process, the store and prefill/0, h2 and h3 the decode instances, one
# device each. The launch starts with h1 and h2 in its hosts file: decode/0 goes to h2. h3 is
# added to the file and the launcher told by SIGHUP: its agent joins. Under load (six
# requests on instances that hold two) the autoscaler orders a second decode instance, which
# the launcher starts on h3 (the host that takes the role with a device free), bound to h3's
# address; its order of a third finds every decode host's device taken, fails, and is said
# once however often the autoscaler asks again. Every request gets its greedy tokens. Once
# idle the autoscaler removes decode/1: it drains, exits and h3's device is free again. Then
# h2 leaves the file (SIGHUP): decode/0 drains there and starts on h3, not counted as a
# restart, and h2 is dropped; a file that takes the control role from h1 is refused. Needs
# root (ip netns); exits 77 (skipped) without it.
#   bash tests/cluster/launch/hosts_autoscale_netns.sh build/troupe
HOSTS=3 NET=10.231.8
source "$(dirname "$0")/netns_hosts.sh" "$1"
for i in 1 2 3; do start_agent "$i"; done
{ host 1 '["control", "prefill"]' 1; host 2 '["decode"]' 1; } > "$WORK/hosts.toml"
# The autoscaler decides every second, with no margin, and removes an idle instance after 2 s.
sed -e 's/interval = "10s"/interval = "1s"/' -e 's/scale_down_after = "30s"/scale_down_after = "2s"/' \
  -e 's/over_provision = 0.25/over_provision = 0/' -e 's/grace = "5s"/grace = "1s"/' \
  "$ROOT/examples/topologies/local-cpu-autoscale.toml" > "$WORK/topology.toml"
[ "$(grep -c -E '^(interval = "1s"|scale_down_after = "2s"|over_provision = 0 |grace = "1s")' "$WORK/topology.toml")" = 4 ] \
  || fail "the example topology changed: the test's edits do not apply"

# shellcheck disable=SC2046
ip netns exec "$TAG-h1" "$TROUPE" launch "$WORK/topology.toml" --model "$WORK/model" \
  --engram-map identity --hosts "$WORK/hosts.toml" --max-batch 2 --listen "$NET.1:0" \
  --threads 1 --grace 1 --kv-dir "$WORK/kv" --state "$WORK/state.json" $(launcher_tls) \
  > "$WORK/launch.log" 2>&1 &
LAUNCHER=$!
PIDS=("$LAUNCHER" "${PIDS[@]}")

taken() { state "next(h['devices_taken'] for h in s['hosts'] if h['name']=='$1')"; }
wait_serving
[ "$(field decode/0 host)" = "h2" ] || fail "decode/0 placed on $(field decode/0 host), expected h2"

# h3 joins.
host 3 '["decode"]' 1 >> "$WORK/hosts.toml"
kill -HUP "$LAUNCHER"
for _ in $(seq 100); do
  grep -q "troupe launch: the agent of host h3 joined$" "$WORK/launch.log" && break
  sleep 0.2
done
grep -q "troupe launch: SIGHUP: read $WORK/hosts.toml: 3 host(s), h3 joins$" "$WORK/launch.log" \
  || fail "the launcher did not read the hosts file again"
grep -q "troupe launch: the agent of host h3 joined$" "$WORK/launch.log" || fail "h3 did not join"
[ "$(taken h2)/$(taken h3)" = "1/0" ] || fail "devices taken on h2/h3: $(taken h2)/$(taken h3)"

want=$(ask "Why do pools grow?" 200)
[ "${want%% *}" = "200" ] || fail "request: $want"

# Six at once: three instances' worth.
ASKS=()
for i in 1 2 3 4 5 6; do
  ask "Why do pools grow?" 200 > "$WORK/answer$i" &
  ASKS+=($!)
  sleep 0.2
done
for _ in $(seq 240); do
  [ "$(field decode/1 state)" = "running" ] && break
  sleep 0.5
done
[ "$(field decode/1 host)" = "h3" ] || fail "decode/1 is on '$(field decode/1 host)', expected h3"
pid=$(field decode/1 pid)
[ "$(ip netns identify "$pid")" = "$TAG-h3" ] || fail "decode/1 (pid $pid) is not in $TAG-h3"
tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "--fabric-host $NET.3 " \
  || fail "decode/1 does not bind its fabric endpoint on h3"
[ "$(taken h3)" = "1" ] || fail "h3's device is not taken by decode/1"
for a in "${ASKS[@]}"; do wait "$a" || fail "a request under load failed"; done
for i in 1 2 3 4 5 6; do
  [ "$(cat "$WORK/answer$i")" = "$want" ] || fail "request $i under load: '$(cat "$WORK/answer$i")', alone: '$want'"
done
grep -q "troupe launch: the autoscaler orders decode/1$" "$WORK/launch.log" || fail "decode/1 was not ordered"
refused="; every live host that takes the decode role has all its devices taken (the hosts file's \`devices\`)"
[ "$(grep -c -F "$refused" "$WORK/launch.log")" = "1" ] \
  || fail "the refused order was said $(grep -c -F "$refused" "$WORK/launch.log") times, not once"
grep -q "troupe launch: the autoscaler orders decode/2" "$WORK/launch.log" && fail "decode/2 was started"
echo "decode/1 placed on h3 under load; an order beyond the hosts' devices refused"

# Idle: decode/1 is drained and removed, and h3's device is free again.
for _ in $(seq 240); do
  [ -z "$(field decode/1 name)" ] && break
  sleep 0.5
done
[ -z "$(field decode/1 name)" ] || fail "decode/1 was not removed"
grep -Eq "troupe launch: decode/1 \(pid [0-9]+\) exited with status 0; removed" "$WORK/launch.log" \
  || fail "decode/1 did not exit cleanly"
[ "$(taken h3)" = "0" ] || fail "h3's device is still taken"
again=$(ask "Why do pools grow?" 200)
[ "$again" = "$want" ] || fail "after the removal: '$again', before: '$want'"

# A file that takes the control role from h1 is refused.
cp "$WORK/hosts.toml" "$WORK/hosts-ok.toml"
{ host 1 '["prefill"]' 1; host 2 '["decode", "control"]' 1; host 3 '["decode"]' 1; } > "$WORK/hosts.toml"
kill -HUP "$LAUNCHER"
for _ in $(seq 50); do
  grep -q "SIGHUP: host h1 runs the control process" "$WORK/launch.log" && break
  sleep 0.2
done
grep -q "troupe launch: SIGHUP: host h1 runs the control process, so it must stay and keep the control role; the hosts stay as they were" \
  "$WORK/launch.log" || fail "a hosts file without h1's control role was not refused"
# h2 leaves: decode/0 drains there and starts on h3; h2 is dropped. (While decode/0 is between
# hosts its pool has no instance up: the autoscaler counts it as starting, and an order it
# gives meanwhile waits, so that no replacement takes h3's device.)
{ host 1 '["control", "prefill"]' 1; host 3 '["decode"]' 1; } > "$WORK/hosts.toml"
kill -HUP "$LAUNCHER"
for _ in $(seq 240); do
  grep -q "troupe launch: host h2 left$" "$WORK/launch.log" && [ "$(field decode/0 state)" = "running" ] && break
  sleep 0.5
done
grep -q "troupe launch: decode/0 leaves host h2 (it drains first)$" "$WORK/launch.log" || fail "decode/0 did not leave h2"
grep -q "troupe launch: decode/0 moves from h2 to h3$" "$WORK/launch.log" || fail "decode/0 did not move to h3"
grep -q "troupe launch: host h2 left$" "$WORK/launch.log" || fail "h2 was not dropped"
[ "$(field decode/0 host)" = "h3" ] || fail "decode/0 is on '$(field decode/0 host)', expected h3"
[ "$(field decode/0 restarts)" = "0" ] || fail "the move counted as a restart"
! grep -q "troupe launch: the autoscaler removes decode/0$" "$WORK/launch.log" || fail "the autoscaler removed decode/0 while it moved"
[ "$(state "[h['name'] for h in s['hosts']]")" = "['h1', 'h3']" ] || fail "hosts after h2 left: $(state "[h['name'] for h in s['hosts']]")"
[ "$(ip netns identify "$(field decode/0 pid)")" = "$TAG-h3" ] || fail "decode/0 is not in $TAG-h3"
for _ in $(seq 240); do
  grep -q "troupe node\[decode/0\]: model loaded; serving in the decode pool" "$WORK/agent3.log" && break
  sleep 0.5
done
moved=$(ask "Why do pools grow?" 200)
[ "$moved" = "$want" ] || fail "after decode/0 moved: '$moved', before: '$want'"
echo "h3 joined and h2 left by SIGHUP; decode/0 moved to h3"
if grep -q "not started while decode/0 moves to another host" "$WORK/launch.log"; then
  echo "(the autoscaler ordered a decode instance while decode/0 moved; it waited)"
fi

kill -TERM "$LAUNCHER"
status=0
wait "$LAUNCHER" || status=$?
[ "$status" = "0" ] || fail "the launcher exited with $status"
echo "1 passed, 0 failed"
