# Sourced by the multi-host launch tests: hosts h1..h$HOSTS built on this machine as network
# namespaces, joined by veth pairs to a bridge in one more namespace (the switch), at
# $NET.1..$NET.$HOSTS; a small model and TLS certificates under $WORK (`troupe certs`, two
# CAs as docs/tls.md advises: one of the agents and the launcher, `launcher` and one per host;
# one of the cluster's processes, `cluster`; every process but the agents trusts both).
# Defines TROUPE, ROOT, TAG, NET, WORK, PIDS (killed at exit, with the namespaces and $WORK),
# fail, launcher_tls (the launcher's TLS options, its processes' included), start_agent, host
# (a hosts file entry), and
# for a launch whose --state is $WORK/state.json and pid $LAUNCHER: state, field,
# wait_serving and ask. Exits 77 (skipped) without root and iproute2.
#   HOSTS=3 NET=10.231.7 source netns_hosts.sh build/troupe
set -euo pipefail
TROUPE=$(realpath "$1")
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
  echo "skipped: needs root and iproute2 for network namespaces"
  exit 77
fi
TAG="tr$$"
SW="$TAG-sw"
WORK=$(mktemp -d /tmp/troupe-hosts-XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for i in $(seq "$HOSTS"); do ip netns del "$TAG-h$i" 2>/dev/null || true; done
  ip netns del "$SW" 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$WORK"/*.log; do echo "--- $(basename "$f")"; cat "$f"; done
  exit 1
}

# The hosts and the switch.
ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for i in $(seq "$HOSTS"); do
  ns="$TAG-h$i"
  ip netns add "$ns"
  ip link add "$TAG-v$i" type veth peer name "$TAG-p$i"
  ip link set "$TAG-v$i" netns "$ns"
  ip link set "$TAG-p$i" netns "$SW"
  ip -n "$SW" link set "$TAG-p$i" master br0 up
  ip -n "$ns" addr add "$NET.$i/24" dev "$TAG-v$i"
  ip -n "$ns" link set "$TAG-v$i" up
  ip -n "$ns" link set lo up
done

"$TROUPE" model init --preset small --seed 1 --out "$WORK/model" >/dev/null
"$TROUPE" certs --out "$WORK/certs/agents" --nodes "launcher$(printf ',h%s' $(seq "$HOSTS"))" >/dev/null
"$TROUPE" certs --out "$WORK/certs/cluster" --nodes cluster >/dev/null
cat "$WORK/certs/agents/ca.pem" "$WORK/certs/cluster/ca.pem" > "$WORK/certs/both.pem"
launcher_tls() {
  echo --tls-ca "$WORK/certs/both.pem" --tls-cert "$WORK/certs/agents/launcher.pem" \
    --tls-key "$WORK/certs/agents/launcher.key" --node-tls-ca "$WORK/certs/both.pem" \
    --node-tls-cert "$WORK/certs/cluster/cluster.pem" --node-tls-key "$WORK/certs/cluster/cluster.key"
}

# start_agent I [LOG]: host hI's agent, on $NET.I:7700, logging to $WORK/agentI.log (or LOG).
start_agent() {
  ip netns exec "$TAG-h$1" "$TROUPE" agent --listen "$NET.$1:7700" --name "h$1" \
    --tls-ca "$WORK/certs/agents/ca.pem" --tls-cert "$WORK/certs/agents/h$1.pem" \
    --tls-key "$WORK/certs/agents/h$1.key" \
    > "${2:-$WORK/agent$1.log}" 2>&1 &
  PIDS+=($!)
}

# host I ROLES [DEVICES]: the hosts file entry of host hI, ROLES a TOML list.
host() {
  printf '[[host]]\nname = "h%s"\nagent = "%s.%s:7700"\nroles = %s\n' "$1" "$NET" "$1" "$2"
  [ -z "${3:-}" ] || printf 'devices = %s\n' "$3"
  echo
}

# state EXPR: a Python expression over the launch's --state JSON `s`, printed.
state() { python3 -c "import json,sys; s=json.load(open('$WORK/state.json')); print(eval(sys.argv[1]))" "$1"; }
# field NAME KEY: process NAME's KEY in the state ('' when there is no such process).
field() { state "next((p['$2'] for p in s['processes'] if p['name']=='$1'), '')"; }
# wait_serving: until the launch serves (5 min at most); sets HTTP to its address.
wait_serving() {
  for _ in $(seq 600); do
    [ -f "$WORK/state.json" ] && [ "$(state 's["http"] or ""')" != "" ] && break
    kill -0 "$LAUNCHER" 2>/dev/null || fail "the launcher exited"
    sleep 0.5
  done
  HTTP=$(state 's["http"]')
  [ -n "$HTTP" ] || fail "the cluster did not serve"
  echo "serving on $HTTP"
}
# ask TEXT N: a greedy chat request of N tokens from h2's namespace (FROM=hI: hI's); prints
# the completion tokens and the text.
ask() {
  ip netns exec "$TAG-${FROM:-h2}" curl -sS -m 600 "http://$HTTP/v1/chat/completions" \
    -H 'content-type: application/json' \
    -d "{\"model\":\"deepseek-v4.1-flash\",\"messages\":[{\"role\":\"user\",\"content\":\"$1\"}],\"max_tokens\":$2,\"temperature\":0}" \
    | python3 -c "import json,sys; r=json.load(sys.stdin); print(r['usage']['completion_tokens'], r['choices'][0]['message'].get('reasoning_content','') + (r['choices'][0]['message'].get('content') or ''))"
}
