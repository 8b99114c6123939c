#!/usr/bin/env bash
# troupe serve end to end on one machine's devices (docs/cuda.md, "Serving on CUDA"): a random
# small-preset model, `troupe serve TOPOLOGY` on it, greedy chat completions sent with curl —
# three prompts one at a time, then eight requests at once — each reply compared with what
# `troupe generate --greedy --batch-invariant` computes on the CPU for the same prompt; then
# the same with speculative decoding (--spec dspark: verify steps, rollbacks, the DSpark
# drafts). bench/gpu_check.sh --serve runs it on a GPU with examples/topologies/local-cuda.toml;
# with local-cpu.toml it runs anywhere. Needs curl and python3 (standard library only).
#
# Prints each reply's verdict and the server's load and first-reply times; exits 1 when a
# reply differs or anything fails. (A reply can differ without a fault: the random small
# model has fp8 / fp4 codes within rounding of a boundary, docs/cuda.md; the texts are printed
# side by side to judge.)
# Usage: bench/serve_check.sh [troupe binary, default build/troupe] [topology, default
#        examples/topologies/local-cuda.toml]
set -uo pipefail
cd "$(dirname "$0")/.."
troupe=${1:-build/troupe}
topology=${2:-examples/topologies/local-cuda.toml}
[ -x "$troupe" ] || { echo "serve_check: no troupe binary at $troupe" >&2; exit 1; }
command -v curl >/dev/null || { echo "serve_check: needs curl" >&2; exit 1; }
command -v python3 >/dev/null || { echo "serve_check: needs python3" >&2; exit 1; }
tmp=$(mktemp -d /tmp/troupe-serve-check.XXXXXX)
server=
cleanup() {
  [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
status=0
started=$(date +%s)
say() { printf '\n== %s (%ds)\n' "$*" $(( $(date +%s) - started )); }

say "a random small-preset model"
timeout 120 "$troupe" model init --preset small --out "$tmp/model" >/dev/null \
  || { echo "serve_check: model init failed" >&2; exit 1; }

body() {  # body PROMPT MAX_TOKENS: a greedy chat completion request
  python3 -c 'import json, sys; print(json.dumps({"model": "deepseek-v4.1-flash",
    "messages": [{"role": "user", "content": sys.argv[1]}], "max_tokens": int(sys.argv[2]),
    "temperature": 0}))' "$1" "$2"
}
reply_text() {  # the reply's reasoning and content, as served_text in tests/python/test_serve.py
  python3 -c 'import json, sys; m = json.load(sys.stdin)["choices"][0]["message"];
print((m.get("reasoning_content") or "") + (m.get("content") or ""), end="")'
}
expected_text() {  # expected_text BODY N: troupe generate's greedy text on the CPU
  local ids tokens
  ids=$(printf '%s' "$1" | "$troupe" encode --protocol chat - \
        | python3 -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))') || return 1
  tokens=$(timeout 600 "$troupe" generate --model "$tmp/model" --tokens "$ids" --greedy \
           --batch-invariant --ignore-eos --max-new "$2" --engram-map identity) || return 1
  "$troupe" detokenize --ids "[$tokens]"
}

prompts=("Tell me about actors." "What is a supervision tree?" "Explain KV caches in one line.")
n=12
declare -a want
say "the expected replies (troupe generate on the CPU)"
for i in "${!prompts[@]}"; do
  want[$i]=$(expected_text "$(body "${prompts[$i]}" $n)" $n) \
    || { echo "serve_check: troupe generate failed" >&2; exit 1; }
done

check_server() {  # check_server LABEL [serve options...]
  local label=$1; shift
  say "troupe serve $topology $* ($label)"
  local t0=$(date +%s)
  "$troupe" serve "$topology" --model "$tmp/model" --engram-map identity \
    --listen 127.0.0.1:0 --kv-dir "$tmp/kv-$label" --grace 5 "$@" 2>"$tmp/serve-$label.log" &
  server=$!
  local addr=
  for _ in $(seq 1 600); do
    addr=$(grep -o 'on http://[0-9.:]*' "$tmp/serve-$label.log" | head -1 | sed 's/on //')
    [ -n "$addr" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.5
  done
  if [ -z "$addr" ]; then
    cat "$tmp/serve-$label.log"
    echo "serve_check: the server did not come up" >&2
    server=
    return 1
  fi
  echo "ready in $(( $(date +%s) - t0 )) s at $addr"
  local i got
  for i in "${!prompts[@]}"; do
    got=$(curl -s --max-time 600 "$addr/v1/chat/completions" -H 'content-type: application/json' \
          -d "$(body "${prompts[$i]}" $n)" | reply_text) || got="(request failed)"
    if [ "$got" == "${want[$i]}" ]; then
      echo "prompt $i: same as troupe generate"
    else
      printf 'prompt %d: DIFFERENT\n  served:   %q\n  expected: %q\n' "$i" "$got" "${want[$i]}"
      status=1
    fi
  done
  # Eight at once: every reply equals the one served alone (batch-invariant devices).
  local k
  for k in $(seq 1 8); do
    curl -s --max-time 600 "$addr/v1/chat/completions" -H 'content-type: application/json' \
      -d "$(body "${prompts[0]}" $n)" >"$tmp/concurrent-$k.json" &
  done
  wait $(jobs -p | grep -v "^$server\$") 2>/dev/null
  local same=0
  for k in $(seq 1 8); do
    [ "$(reply_text <"$tmp/concurrent-$k.json" 2>/dev/null)" == "${want[0]}" ] && same=$((same + 1))
  done
  echo "8 concurrent requests: $same of 8 equal to troupe generate"
  [ $same -eq 8 ] || status=1
  kill -TERM "$server"
  wait "$server"
  local rc=$?
  server=
  [ $rc -eq 0 ] || { echo "serve_check: the server exited $rc"; tail -20 "$tmp/serve-$label.log"; status=1; }
}

check_server plain || status=1
check_server dspark --spec dspark || status=1

say "done"
[ $status -eq 0 ] && echo "serve_check: passed" || echo "serve_check: FAILED" >&2
exit $status
