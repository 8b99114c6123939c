"""Time to first token of a request whose long prefix is in the KV store, against the same
request cold, on `troupe serve` (issue 12 §6) or `troupe launch` (--launch).

One invocation starts `troupe serve` on a model directory with a fresh KV store directory and,
for several rounds, sends a chat request whose prompt is a new --prefix-token text (cold: no
block of it is cached), waits until its blocks are in the store, then sends the same request
again (hit: its prefix is restored from the store and only the tail is computed) — cold and
hit interleaved, so both see the same machine. TTFT is measured on the client from sending
the request to the end of its one generated token (the role chunk, which leaves at admission,
does not count). For every request it records the 1-minute
load average before it and the CPU time that processes other than the server used during it
(from /proc/stat less the server's own CPU time from /proc/PID/stat); a request during which
they used more than --max-foreign of a core was taken under contention: listed, not counted.
It prints min and median of each kind over the kept requests, their ratio, the cached tokens
the hits reported, and the load averages seen.

With --launch the server is `troupe launch examples/topologies/local-cpu-3.toml` (a control
process, the block store's process, one prefill and two decode processes, and the prefill's
block fetcher): a hit's blocks then come from the store process through the fetcher into
shared memory, the store's payloads over the fabric (--fabric, default tcp), and the server's
CPU time is that of the launcher and all its processes. --compare-fetchers starts two such
clusters, one with block fetchers and one without (the prefill process reads the store
itself), and measures both in every round, in alternating order: each server is idle while
the other is measured (its idle CPU counts as foreign).

With --next-turn it measures the next turn of a conversation instead, on two servers: one
that keeps window states (the default) and one with --window-memory 0. Each round's first turn
is a new prompt of --prefix rounded to 128·k − 1 tokens with max_tokens 2, so the decode
instance's first step ends on the block boundary 128·k, where the first server's decode device
keeps the window state. The second turn (the messages, the reply, one more user message) has
that prefix cached: the first server pulls the state from the decode instance, the second
replays the window. Its TTFT is what is compared (servers in alternating order); a round whose
reply did not tokenize back into its ids (its cached prefix ends earlier) is listed and not
counted.

    python3 bench/prefix_hit.py [--troupe build/troupe] [--model DIR] [--prefix 4096]
        [--rounds 3] [--threads 2] [--launch [--fabric tcp|shm] [--compare-fetchers]]
        [--next-turn]

Without --model it writes the small preset (`troupe model init --preset small --seed 1`) to a
temporary directory. Standard library only.
"""
import argparse
import http.client
import json
import os
import pathlib
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parent.parent


def cpu_busy_seconds():
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, troupe, model, kv_dir, threads, launch=None, fetchers="on", extra=()):
        args = [troupe, "serve", str(REPO / "examples/topologies/local-cpu.toml")]
        self.state = None
        if launch:
            self.state = kv_dir + ".state.json"
            args = [troupe, "launch", str(REPO / "examples/topologies/local-cpu-3.toml"),
                    "--state", self.state, "--fabric", launch, "--block-fetchers", fetchers]
        self.proc = subprocess.Popen(
            args + ["--model", model, "--engram-map", "identity", "--listen", "127.0.0.1:0",
                    "--kv-dir", kv_dir, "--threads", str(threads), *extra],
            stderr=subprocess.PIPE, text=True)
        self.log = []
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                if " on http://" in line:
                    ready.set()
        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout=600):
            self.stop()
            sys.exit("troupe serve did not start:\n" + "".join(self.log))
        line = next(l for l in self.log if " on http://" in l)
        self.port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))

    def pids(self):
        """The server's processes: troupe serve, or the launcher and its node processes."""
        if not self.state:
            return [self.proc.pid]
        with open(self.state) as f:
            return [self.proc.pid] + [p["pid"] for p in json.load(f)["processes"] if p["pid"]]

    def metric(self, name):
        """The sum of the samples of `name` (a family, or one labelled sample)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                       if line.startswith(name + " ") or line.startswith(name + "{"))

    def ttft(self, body):
        """Seconds to the first content chunk, and the usage of the stream (its text goes to
        `last_text`)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.monotonic()
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            sys.exit(f"HTTP {resp.status}: {resp.read()[:500]!r}")
        first, usage = None, None
        self.last_text = ""
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            # The first chunk carrying generated text, or the end of a one-token request (the
            # role chunk leaves at admission, before any token exists).
            choice = (chunk.get("choices") or [{}])[0]
            delta = choice.get("delta") or {}
            produced = (delta.get("content") or delta.get("reasoning_content")
                        or choice.get("finish_reason"))
            if first is None and produced:
                first = time.monotonic() - t0
            self.last_text += delta.get("content") or ""
            if chunk.get("usage"):
                usage = chunk["usage"]
        conn.close()
        return first, usage

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=120)


def measured(server, body):
    load = os.getloadavg()[0]
    pids = server.pids()
    own = lambda: sum(process_cpu_seconds(p) for p in pids)
    busy0, own0 = cpu_busy_seconds(), own()
    t0 = time.monotonic()
    ttft, usage = server.ttft(body)
    wall = time.monotonic() - t0
    foreign = (cpu_busy_seconds() - busy0) - (own() - own0)
    return ttft, usage, max(0.0, foreign) / wall, load


def exact_prompt(troupe, tokens):
    """A chat body (non-thinking, 2 tokens, streamed) whose prompt is exactly `tokens` tokens,
    each round's with a word of its own; None when the next word does not fit exactly."""
    words = iter(["sea", "ship", "wave", "wind", "rock", "sand", "salt", "star", "moon", "sun",
                  "rain", "snow", "tree", "leaf", "bird", "fish", "road", "door", "lamp", "book"])

    def body(word, n):
        return {"model": "deepseek-v4.1-flash", "max_tokens": 2, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True},
                "thinking": {"type": "disabled"},
                "messages": [{"role": "user", "content": " ".join([word] * n)}]}

    def length(b):
        out = subprocess.run([troupe, "encode", "--protocol", "chat", "-"], input=json.dumps(b),
                             check=True, capture_output=True, text=True)
        return len(json.loads(out.stdout)["ids"])

    def make():
        for word in words:
            n = tokens
            for _ in range(3):
                got = length(body(word, n))
                if got == tokens:
                    return body(word, n)
                n += tokens - got
        return None
    return make


def next_turn(args, model, tmp):
    names = ["keeping", "no keeping"]
    servers = {name: Server(args.troupe, model, os.path.join(tmp.name, f"kv-{i}"), args.threads,
                            extra=() if name == "keeping" else ("--window-memory", "0"))
               for i, name in enumerate(names)}
    boundary = max(1, args.prefix // 128) * 128
    make = exact_prompt(args.troupe, boundary - 1)
    kept = {n: [] for n in names}
    dropped = {n: 0 for n in names}
    loads, unmatched = [], 0
    try:
        for r in range(args.rounds):
            first = make()
            if first is None:
                sys.exit("no word left that gives an exact prompt length")
            for name in (names if r % 2 == 0 else names[::-1]):
                server = servers[name]
                blocks = server.metric("troupe_store_blocks")
                server.ttft(first)
                reply = server.last_text
                # Blocks 0 .. k-2 from prefill, k-1 from decode: wait until all are in.
                for _ in range(600):
                    if server.metric("troupe_store_blocks") >= blocks + boundary // 128:
                        break
                    time.sleep(0.1)
                second = dict(first)
                second["messages"] = first["messages"] + [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": "And then?"}]
                outcome = {o: server.metric(f'troupe_kv_restores_total{{device="prefill/0",outcome="{o}"}}')
                           for o in ("exact", "pulled", "replayed")}
                ttft, usage, foreign, load = measured(server, second)
                after = {o: server.metric(f'troupe_kv_restores_total{{device="prefill/0",outcome="{o}"}}')
                         for o in outcome}
                how = ",".join(o for o in outcome if after[o] > outcome[o]) or "none"
                hit = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                ok = foreign <= args.max_foreign
                match = hit == boundary
                print(f"round {r + 1} {name:10}: next turn {usage['prompt_tokens']} tokens, cached "
                      f"{hit} ({how}), TTFT {ttft:.3f} s, load {load:.2f}, foreign "
                      f"{foreign:.2f} cores{'' if ok else '  (contended: dropped)'}"
                      f"{'' if match else '  (the reply did not tokenize back: not counted)'}",
                      flush=True)
                loads.append(load)
                if not match:
                    unmatched += 1
                elif ok:
                    kept[name].append(ttft)
                else:
                    dropped[name] += 1
    finally:
        for server in servers.values():
            server.stop()
    print()
    for name in names:
        v = kept[name]
        if v:
            print(f"{name}: next-turn TTFT min {min(v):.3f} s, median {statistics.median(v):.3f} s "
                  f"over {len(v)} runs ({dropped[name]} dropped)")
    if kept["keeping"] and kept["no keeping"]:
        ratio = statistics.median(kept["keeping"]) / statistics.median(kept["no keeping"])
        print(f"keeping / no keeping (median): {ratio:.3f}")
    print(f"prefix {boundary} tokens; {unmatched} unmatched; load average "
          f"{min(loads):.2f}-{max(loads):.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--troupe", default=str(REPO / "build/troupe"))
    ap.add_argument("--model")
    ap.add_argument("--prefix", type=int, default=4096,
                    help="prompt length in tokens (approximately: random words of ~3 tokens)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-foreign", type=float, default=0.1,
                    help="cores other processes may use during a request before it is dropped")
    ap.add_argument("--launch", action="store_true",
                    help="troupe launch (local-cpu-3.toml) instead of troupe serve")
    ap.add_argument("--fabric", default="tcp", help="with --launch: the libfabric provider")
    ap.add_argument("--compare-fetchers", action="store_true",
                    help="with --launch: a cluster with block fetchers and one without")
    ap.add_argument("--next-turn", action="store_true",
                    help="a conversation's next turn, on a server that keeps window states and "
                         "one that does not (--window-memory 0)")
    args = ap.parse_args()
    if args.compare_fetchers and not args.launch:
        sys.exit("--compare-fetchers needs --launch")

    tmp = tempfile.TemporaryDirectory(prefix="troupe-prefix-hit-")
    model = args.model
    if not model:
        model = os.path.join(tmp.name, "small")
        subprocess.run([args.troupe, "model", "init", "--preset", "small", "--seed", "1",
                        "--out", model], check=True, capture_output=True)
    if args.next_turn:
        next_turn(args, model, tmp)
        return
    names = ["fetchers", "no fetchers"] if args.compare_fetchers else ["server"]
    servers = {}
    for name in names:
        servers[name] = Server(args.troupe, model, os.path.join(tmp.name, f"kv-{len(servers)}"),
                               args.threads, args.fabric if args.launch else None,
                               "off" if name == "no fetchers" else "on")
    rng = random.Random(1)
    kept = {(n, k): [] for n in names for k in ("cold", "hit")}
    dropped = {(n, k): 0 for n in names for k in ("cold", "hit")}
    loads, cached = [], []
    try:
        for r in range(args.rounds):
            words = " ".join(f"w{rng.randrange(10**6)}" for _ in range(args.prefix // 3))
            body = {"model": "deepseek-v4.1-flash", "max_tokens": 1, "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": words}]}
            for name in (names if r % 2 == 0 else names[::-1]):
                server = servers[name]
                blocks_before = server.metric("troupe_store_blocks")
                for kind in ("cold", "hit"):
                    if kind == "hit":
                        # The cold request's blocks are written after its hand-off: wait for them.
                        want = blocks_before + (prompt - 1) // 128
                        for _ in range(600):
                            if server.metric("troupe_store_blocks") >= want:
                                break
                            time.sleep(0.1)
                    ttft, usage, foreign, load = measured(server, body)
                    prompt = usage["prompt_tokens"]
                    hit = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    ok = foreign <= args.max_foreign
                    print(f"round {r + 1} {name} {kind:4}: prompt {prompt} tokens, cached {hit}, TTFT "
                          f"{ttft:.3f} s, load {load:.2f}, foreign {foreign:.2f} cores"
                          f"{'' if ok else '  (contended: dropped)'}", flush=True)
                    loads.append(load)
                    if kind == "hit":
                        cached.append(hit)
                    if ok:
                        kept[(name, kind)].append(ttft)
                    else:
                        dropped[(name, kind)] += 1
    finally:
        for server in servers.values():
            server.stop()
    print()
    for name in names:
        for kind in ("cold", "hit"):
            v = kept[(name, kind)]
            label = kind if len(names) == 1 else f"{name}, {kind}"
            if v:
                print(f"{label}: TTFT min {min(v):.3f} s, median {statistics.median(v):.3f} s "
                      f"over {len(v)} runs ({dropped[(name, kind)]} dropped)")
            else:
                print(f"{label}: every run was contended ({dropped[(name, kind)]} dropped)")
        if kept[(name, "cold")] and kept[(name, "hit")]:
            ratio = statistics.median(kept[(name, "hit")]) / statistics.median(kept[(name, "cold")])
            print(f"{'' if len(names) == 1 else name + ': '}hit / cold (median): {ratio:.3f}")
    print(f"cached tokens reported by the hits: {cached}; load average {min(loads):.2f}-{max(loads):.2f}")


if __name__ == "__main__":
    main()
