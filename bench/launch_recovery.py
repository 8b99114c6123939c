"""Recovery of a launched cluster after a decode or the store process is killed (kill -9).

One invocation starts `troupe launch examples/topologies/local-cpu-3.toml` (a control
process, one prefill and two decode processes on CPU devices) on a model directory and, for
several rounds: opens --streams greedy Chat Completions streams over plain HTTP (max_tokens
--tokens), waits until every stream has had --warm tokens, kills decode/0 with SIGKILL, and
records when each stream's next token arrives. A stream that was on decode/0 stalls; its
request actor reroutes it to decode/1, which recomputes the context (prompt + tokens so far)
and continues. Figures per round:

  resumed      kill → the first token after the kill on the stalled streams (the longest of
               them: the round is recovered when its last stalled stream is), and the gap of
               the other streams (which only share decode/1 with the rerouted ones);
  rejoined     kill → the restarted decode/0 has loaded its model and announced itself to its
               balancer again (the node's "model loaded; serving in the decode pool" line),
               i.e. capacity back.

With --kill store, each round first makes a long prompt (--cached-words words, its own per
round) a prefix hit, then kills the store process while the streams decode, and records:

  stream gap   the longest time a stream went without a token after the kill (the streams
               do not use the store while they decode: nothing should stall);
  outage TTFT  the cached prompt asked right after the kill: its blocks cannot be read, so it
               is computed in full (and its cached_tokens);
  store back   kill → the restarted store process serves its directory again (its "serving
               the block store" line);
  hit TTFT     the cached prompt once the store is back (a prefix hit again), beside the hit
               TTFT before the kill.

With --shards N (N > 1) the topology's store is in N shards (`storage.shards`: N store
processes) and --kill store kills the last shard's process only: while it is down the cached
prompt is still a hit up to its first block on that shard (its cached_tokens say how much).
With --replicas R (2..N) every block is on R shards (`storage.replicas`), and the cached
prompt should stay a whole hit while the shard is down.

Every stream must complete with completion_tokens == --tokens, else the run fails. Rounds wait
for the killed process to be back before the next kill. It prints min and median over the rounds, with
the 1-minute load average of each round (a figure taken under load is not a figure), beside
the published figures of the peers: SGLang's elastic EP reports ~6-7 s to recover from a rank
failure on GPUs, and DeepSeek describes a restart of an inference instance as taking minutes.

    python3 bench/launch_recovery.py [--troupe build/troupe] [--model DIR] [--rounds 3]
        [--streams 4] [--tokens 96] [--warm 8] [--threads 1] [--kill decode|store]
        [--cached-words 300] [--shards 1] [--replicas 1]

Without --model it writes the small preset (`troupe model init --preset small --seed 1`) to a
temporary directory. The standard library only.
"""
import argparse
import http.client
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
MODEL_NAME = "deepseek-v4.1-flash"


def chunks(port, body):
    """Streams a greedy Chat Completions request: yields each SSE chunk (a dict)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": MODEL_NAME, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **body}
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"content-type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    for raw in r:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def has_text(chunk):
    return any(c.get("delta", {}).get("content") or c.get("delta", {}).get("reasoning_content")
               for c in chunk.get("choices", []))


def stream(port, prompt, tokens, arrivals, done):
    """One greedy SSE stream; appends the arrival time of each text chunk to `arrivals`."""
    usage = None
    for chunk in chunks(port, {"messages": [{"role": "user", "content": prompt}],
                               "max_tokens": tokens}):
        if chunk.get("usage"):
            usage = chunk["usage"]
        if has_text(chunk):
            arrivals.append(time.monotonic())
    done.append(usage)


def first_token(port, prompt):
    """A greedy one-token request: (seconds to its first token, the prompt's cached tokens)."""
    start = time.monotonic()
    ttft, cached = None, None
    for chunk in chunks(port, {"messages": [{"role": "user", "content": prompt}],
                               "max_tokens": 1, "thinking": {"type": "disabled"}}):
        if chunk.get("usage"):
            cached = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        if ttft is None and has_text(chunk):
            ttft = time.monotonic() - start
    return ttft, cached


def until_hit(port, prompt, what):
    """first_token() of `prompt` once it is a prefix hit (its blocks are committed shortly
    after the hand-off): (TTFT, cached tokens); fails after 10 s."""
    for _ in range(40):
        ttft, cached = first_token(port, prompt)
        if cached:
            return ttft, cached
        time.sleep(0.25)
    raise RuntimeError(f"{what}: the cached prompt is no hit")


def seconds_to_line(log, since, text, limit=300):
    """Seconds from `since` to the first line of `log` after it that holds `text` (waiting
    up to `limit` s for it), or None."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for t, l in log:
            if t > since and text in l:
                return t - since
        time.sleep(0.05)
    return None


def state(path):
    with open(path) as f:
        return json.load(f)


def proc(st, name):
    return next(p for p in st["processes"] if p["name"] == name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--troupe", default=str(REPO / "build" / "troupe"))
    ap.add_argument("--model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kill", choices=("decode", "store"), default="decode")
    ap.add_argument("--cached-words", type=int, default=300)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=1)
    a = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="troupe-recovery-")
    model = a.model
    if not model:
        model = os.path.join(tmp.name, "small")
        subprocess.run([a.troupe, "model", "init", "--preset", "small", "--seed", "1", "--out",
                        model], check=True, capture_output=True)
    state_file = os.path.join(tmp.name, "state.json")
    topology = str(REPO / "examples/topologies/local-cpu-3.toml")
    store_name, store_line = "store", "troupe node[store]: serving the block store"
    if a.shards > 1:
        store = f"shards = {a.shards}" + (f"\nreplicas = {a.replicas}" if a.replicas > 1 else "")
        text = open(topology).read().replace('capacity = "16GiB"', f'capacity = "16GiB"\n{store}')
        topology = os.path.join(tmp.name, "sharded.toml")
        with open(topology, "w") as f:
            f.write(text)
        store_name = f"store/{a.shards - 1}"
        store_line = f"troupe node[store]: serving shard {a.shards - 1} of {a.shards} of the block store"
    log = []
    launcher = subprocess.Popen(
        [a.troupe, "launch", topology, "--model", model,
         "--engram-map", "identity", "--listen", "127.0.0.1:0", "--threads", str(a.threads),
         "--grace", "3", "--kv-dir", os.path.join(tmp.name, "kv"), "--state", state_file],
        stderr=subprocess.PIPE, text=True)
    threading.Thread(target=lambda: [log.append((time.monotonic(), l)) for l in launcher.stderr],
                     daemon=True).start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if state(state_file).get("http"):
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("troupe launch did not serve:\n" + "".join(l for _, l in log))
        port = int(state(state_file)["http"].rsplit(":", 1)[1])
        rows = []
        for rnd in range(a.rounds):
            load = os.getloadavg()[0]
            arrivals = [[] for _ in range(a.streams)]
            done = []
            threads = [threading.Thread(target=stream, args=(
                port, f"Round {rnd}, stream {i}: tell me about supervision.", a.tokens,
                arrivals[i], done)) for i in range(a.streams)]
            if a.kill == "store":
                cached_prompt = " ".join(f"round{rnd}word{i}" for i in range(a.cached_words))
                first_token(port, cached_prompt)
                hit_before, _ = until_hit(port, cached_prompt, f"round {rnd}, before the kill")
            for t in threads:
                t.start()
            while min(len(x) for x in arrivals) < a.warm:
                time.sleep(0.005)
            victim = proc(state(state_file), "decode/0" if a.kill == "decode" else store_name)
            killed = time.monotonic()
            os.kill(victim["pid"], signal.SIGKILL)
            if a.kill == "store":
                outage, outage_cached = first_token(port, cached_prompt)
            for t in threads:
                t.join(timeout=900)
            if len(done) != a.streams or any(u is None or u["completion_tokens"] != a.tokens
                                             for u in done):
                raise RuntimeError(f"round {rnd}: a stream did not complete: {done}")
            if a.kill == "store":
                gap = max(next((t for t in x if t > killed), killed) - max(
                    [t for t in x if t <= killed] or [killed]) for x in arrivals)
                back = seconds_to_line(log, killed, store_line)
                if back is None:
                    raise RuntimeError(f"round {rnd}: the store process did not come back")
                hit_after, got = until_hit(port, cached_prompt, f"round {rnd}, after the restart")
                rows.append((gap, outage, back, hit_before, hit_after, load, outage_cached))
                print(f"round {rnd}: stream gap {gap:.3f} s, outage TTFT {outage:.3f} s "
                      f"(cached {outage_cached}), store back {back:.3f} s, hit TTFT "
                      f"{hit_before:.3f} s before / {hit_after:.3f} s after (cached {got}), "
                      f"load {load:.2f}", flush=True)
                time.sleep(2)
                continue
            gaps = []
            for x in arrivals:
                after = [t for t in x if t > killed]
                before = [t for t in x if t <= killed]
                if after and before:
                    gaps.append(after[0] - killed)
            typical = statistics.median(
                [b - a_ for x in arrivals for a_, b in zip(x, x[1:]) if b <= killed] or [0.0])
            stalled = [g for g in gaps if g > 5 * max(typical, 0.01)]
            resumed = max(stalled) if stalled else None
            # Capacity back: decode/0 restarted, loaded its model and is in its pool again.
            rejoined = seconds_to_line(log, killed, "troupe node[decode/0]: model loaded; serving")
            rows.append((resumed, max(g for g in gaps if g not in stalled) if len(stalled) < len(gaps) else None,
                         rejoined, load, len(stalled)))
            print(f"round {rnd}: stalled streams {len(stalled)}/{a.streams}, resumed "
                  f"{resumed if resumed is None else round(resumed, 3)} s, rejoined "
                  f"{rejoined if rejoined is None else round(rejoined, 3)} s, typical token gap "
                  f"{typical * 1000:.1f} ms, load {load:.2f}", flush=True)
            # Let the restarted process settle before the next round.
            time.sleep(2)
        if a.kill == "store":
            print(f"\nkill -9 of {store_name} ({a.shards} shard(s), {a.replicas} cop(ies) of each "
                  f"block), {a.streams} streams of "
                  f"{a.tokens} tokens, a cached prompt of {a.cached_words} words, {len(rows)} "
                  f"rounds (load average {min(r[5] for r in rows):.2f}..{max(r[5] for r in rows):.2f}); "
                  f"tokens still cached during the outage: {[r[6] for r in rows]}")
            for i, what in enumerate(("longest stream gap after the kill",
                                      "TTFT of the cached prompt while the store is down",
                                      "store process back (kill -> serving its directory)",
                                      "TTFT of the cached prompt before the kill (hit)",
                                      "TTFT of the cached prompt after the restart (hit)")):
                v = [r[i] for r in rows]
                print(f"  {what}: min {min(v):.3f} s, median {statistics.median(v):.3f} s")
            return 0
        res = [r[0] for r in rows if r[0] is not None]
        rej = [r[2] for r in rows if r[2] is not None]
        print(f"\nkill -9 of a decode process, {a.streams} streams of {a.tokens} tokens, "
              f"{len(rows)} rounds (load average {min(r[3] for r in rows):.2f}..{max(r[3] for r in rows):.2f})")
        if res:
            print(f"  stream resumed (kill -> next token of a stalled stream): min {min(res):.3f} s, "
                  f"median {statistics.median(res):.3f} s")
        if rej:
            print(f"  decode/0 back in its balancer (kill -> rejoined): min {min(rej):.3f} s, "
                  f"median {statistics.median(rej):.3f} s")
        print("  published peers: SGLang elastic EP ~6-7 s (GPU rank failure); DeepSeek: an "
              "instance restart takes minutes")
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=120)
        except subprocess.TimeoutExpired:
            launcher.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
