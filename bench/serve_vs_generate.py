"""`troupe serve` end to end on the CPU engine, beside `troupe generate` (the direct engine).

One invocation starts `troupe serve examples/topologies/local-cpu.toml` on a model directory
(a prefill and a decode instance, each one CPU device with --threads threads, the KV handed off
between them) and, for several rounds, runs in turn (the order rotating every round):

  served 1    one Chat Completions stream (greedy, max_tokens --tokens) over plain HTTP;
  served 16   16 such streams at once (the decode instance batches them);
  direct      `troupe generate --greedy --batch-invariant --ignore-eos --timings` on the same
              prompt ids (what the recipe encodes for the same request body) with the same
              threads: the engine alone, no actors, no HTTP.

Definitions. TTFT: served, from the request being sent to the first SSE chunk that carries
text; direct, from the start of the generation (model loaded) to the first token drawn.
Inter-token latency (ITL): the gaps between a stream's successive text chunks (served) or
tokens (direct). tokens/s: all tokens of the run over the time from the first request sent
(direct: the generation start) to the last token: the aggregate throughput, which at 1
stream is the stream's own rate, TTFT included. decode/s: the tokens after each stream's
first over the time from the earliest first token to the last token (at 1 stream, the decode
rate alone). Both run the prompt through the LM head at its last position only
(`forward_last`), so the TTFTs compare too (the served one adds HTTP, the prefill instance's
hand-off of the KV to the decode instance, and the recipe's encoding). Every served stream
must report completion_tokens == --tokens, else the run fails.

Each run waits (up to 10 minutes) for 2 quiet seconds, then records the 1-minute load
average, and during the run the CPU time that processes other than this script, the server and
`troupe generate` used (from /proc/stat): a run during which they used more than --max-foreign
of a core is listed but not counted, and rounds go on (up to --max-rounds) until every mode has
--rounds kept runs. It prints, per mode, the min and median tokens/s of the kept runs and
TTFT / ITL p50 and p99 over their streams, then the ratios of the goals of issue 12.

    python3 bench/serve_vs_generate.py [--troupe build/troupe] [--model DIR] [--rounds 3]
        [--max-rounds 8] [--tokens 64] [--threads 2] [--concurrent 16] [--max-foreign 0.1]

Without --model it writes the small preset (`troupe model init --preset small --seed 1`) to a
temporary directory. The standard library only.
"""
import argparse
import http.client
import json
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
MODEL_NAME = "deepseek-v4.1-flash"
PROMPT = "Tell me about actors, messages and supervision trees."


def cpu_busy_seconds():
    """Busy CPU time of the whole machine (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def own_cpu_seconds():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def wait_quiet(server_pid, max_foreign, limit_s=600):
    """Waits (up to limit_s) for 2 s during which others used at most max_foreign of a core."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        busy0, own0, srv0 = cpu_busy_seconds(), own_cpu_seconds(), process_cpu_seconds(server_pid)
        time.sleep(2)
        own = (own_cpu_seconds() - own0) + (process_cpu_seconds(server_pid) - srv0)
        if (cpu_busy_seconds() - busy0 - own) / 2 <= max_foreign:
            return


def answer(port, prompt, tokens):
    """The greedy Chat Completions answer to `prompt` (reasoning and content), not streamed."""
    body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": tokens, "temperature": 0})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    conn.close()
    msg = reply["choices"][0]["message"]
    return (msg.get("reasoning_content") or "") + (msg.get("content") or "")


def metrics_text(port):
    """The server's /metrics."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def add_round_options(ap, tokens):
    """The options of the benches that compare servers in interleaved rounds."""
    ap.add_argument("--troupe", default=str(REPO / "build/troupe"))
    ap.add_argument("--model", type=pathlib.Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=tokens)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--max-foreign", type=float, default=0.10)


def interleaved_rounds(servers, args):
    """Greedy streams to each server of `servers` (name -> Server), 1 and then args.concurrent
    at once, the order rotating every round, until each has args.rounds uncontended runs (at
    most args.max_rounds rounds); prints every run, then min and median tokens/s per server
    and streams, and the load average over the kept runs."""
    runs = [(name, n) for name in servers for n in (1, args.concurrent)]
    kept = {r: [] for r in runs}
    loads = []
    pids = [s.proc.pid for s in servers.values()]
    for rnd in range(args.max_rounds):
        if all(len(v) >= args.rounds for v in kept.values()):
            break
        for name, n in runs[rnd % len(runs):] + runs[:rnd % len(runs)]:
            r, load, foreign = measured_run(pids, servers[name].port, n, args.tokens,
                                            args.max_foreign)
            contended = foreign > args.max_foreign
            print(f"round {rnd + 1} {name:7s} x{n:<3d} load {load:4.2f} others {foreign:4.2f} "
                  f"cores  {r['tokens/s']:7.2f} tokens/s{'  (dropped)' if contended else ''}",
                  flush=True)
            if not contended:
                kept[(name, n)].append(r["tokens/s"])
                loads.append(load)
    print()
    print(f"{'server':8s} {'streams':>7s} {'runs':>4s} {'min tok/s':>10s} {'median':>8s}")
    for (name, n), v in kept.items():
        if v:
            print(f"{name:8s} {n:7d} {len(v):4d} {min(v):10.2f} {statistics.median(v):8.2f}")
    if loads:
        print(f"load average (1 min) over kept runs: {min(loads):.2f}-{max(loads):.2f}")


def measured_run(pids, port, n, tokens, max_foreign):
    """run_served(port, n, tokens) after a quiet wait (wait_quiet on pids[0]): its result, the
    1-minute load average before it, and the cores that processes other than this script and
    `pids` used during it."""
    wait_quiet(pids[0], max_foreign)
    load = os.getloadavg()[0]
    busy0, own0 = cpu_busy_seconds(), own_cpu_seconds()
    srv0 = sum(process_cpu_seconds(p) for p in pids)
    t0 = time.monotonic()
    r = run_served(port, n, tokens)
    wall = time.monotonic() - t0
    own = own_cpu_seconds() - own0 + sum(process_cpu_seconds(p) for p in pids) - srv0
    return r, load, max(0.0, cpu_busy_seconds() - busy0 - own) / wall


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


class Server:
    def __init__(self, troupe, model, threads, extra=()):
        self.proc = subprocess.Popen(
            [troupe, "serve", str(REPO / "examples/topologies/local-cpu.toml"), "--model", model,
             "--engram-map", "identity", "--listen", "127.0.0.1:0", "--threads", str(threads),
             "--grace", "5", *extra],
            stderr=subprocess.PIPE, text=True)
        log = []
        for line in self.proc.stderr:
            log.append(line)
            m = re.search(r" on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        else:
            raise RuntimeError("troupe serve did not start:\n" + "".join(log))
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def stream_once(port, body, start, out):
    """One streaming request; appends (t_sent, [text chunk times], completion_tokens) to out."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start.wait()
    sent = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    times, tokens = [], None
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                times.append(time.perf_counter())
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    conn.close()
    out.append((sent, times, tokens))


def run_served(port, n, tokens):
    body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": PROMPT}],
                       "stream": True, "max_tokens": tokens, "temperature": 0})
    start, out = threading.Barrier(n), []
    threads = [threading.Thread(target=stream_once, args=(port, body, start, out))
               for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(out) != n or any(t != tokens for _, _, t in out):
        raise RuntimeError(f"{n} streams: completion tokens {[t for _, _, t in out]}, "
                           f"expected {tokens} each")
    first = min(s for s, _, _ in out)
    last = max(ts[-1] for _, ts, _ in out)
    decode = sum(len(ts) - 1 for _, ts, _ in out) / (last - min(ts[0] for _, ts, _ in out))
    return {"tokens/s": n * tokens / (last - first), "decode/s": decode,
            "ttft": [ts[0] - s for s, ts, _ in out],
            "itl": [b - a for _, ts, _ in out for a, b in zip(ts, ts[1:])],
            "chunks": sum(len(ts) for _, ts, _ in out)}


def run_direct(troupe, model, ids, tokens, threads):
    out = subprocess.run(
        [troupe, "generate", "--model", model, "--tokens", ",".join(map(str, ids)), "--greedy",
         "--batch-invariant", "--ignore-eos", "--max-new", str(tokens), "--threads", str(threads),
         "--engram-map", "identity", "--timings"],
        check=True, capture_output=True, text=True)
    t = json.loads(out.stderr.strip().splitlines()[-1])["token_s"]
    return {"tokens/s": len(t) / t[-1], "decode/s": (len(t) - 1) / (t[-1] - t[0]),
            "ttft": [t[0]], "itl": [b - a for a, b in zip(t, t[1:])], "chunks": len(t)}


def model_or_small(troupe, model, prefix):
    """(the model directory, the temporary directory holding it or None): `model`, else the
    small preset written with seed 1 to a temporary directory."""
    if model is not None:
        return str(model), None
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    out = pathlib.Path(tmp.name) / "small"
    subprocess.run([troupe, "model", "init", "--preset", "small", "--seed", "1", "--out", str(out)],
                   check=True, capture_output=True)
    return str(out), tmp


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--troupe", default=str(REPO / "build/troupe"))
    ap.add_argument("--model", type=pathlib.Path)
    ap.add_argument("--rounds", type=int, default=3, help="kept runs wanted per mode")
    ap.add_argument("--max-rounds", type=int, default=8,
                    help="rounds at most, to replace the runs dropped under contention")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrent", type=int, default=16)
    ap.add_argument("--max-foreign", type=float, default=0.10,
                    help="cores other processes may use during a run before it is dropped")
    args = ap.parse_args()
    model, tmp = model_or_small(args.troupe, args.model, "troupe-bench-serve-")
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": args.tokens, "temperature": 0}
    ids = json.loads(subprocess.run([args.troupe, "encode", "--protocol", "chat", "-"],
                                    input=json.dumps(body), check=True, capture_output=True,
                                    text=True).stdout)["ids"]
    server = Server(args.troupe, model, args.threads)
    c = args.concurrent
    modes = {
        "served 1": lambda: run_served(server.port, 1, args.tokens),
        f"served {c}": lambda: run_served(server.port, c, args.tokens),
        "direct": lambda: run_direct(args.troupe, model, ids, args.tokens, args.threads),
    }
    names = list(modes)
    kept = {name: [] for name in names}
    loads = []
    try:
        for name in names:  # warm-up, not counted: the server's first requests, the page cache
            modes[name]()
        for r in range(args.max_rounds):
            if all(len(kept[n]) >= args.rounds for n in names):
                break
            for name in names[r % len(names):] + names[:r % len(names)]:
                if len(kept[name]) >= args.rounds:
                    continue
                wait_quiet(server.proc.pid, args.max_foreign)
                load = os.getloadavg()[0]
                busy0, own0, srv0, t0 = (cpu_busy_seconds(), own_cpu_seconds(),
                                         process_cpu_seconds(server.proc.pid), time.monotonic())
                fig = modes[name]()
                wall = time.monotonic() - t0
                own = (own_cpu_seconds() - own0) + (process_cpu_seconds(server.proc.pid) - srv0)
                foreign = max(0.0, cpu_busy_seconds() - busy0 - own) / wall
                loads.append(load)
                contended = foreign > args.max_foreign
                print(f"round {r + 1} {name:10s} load {load:4.2f} others {foreign:4.2f} cores"
                      + ("  DROPPED (contention)" if contended else "")
                      + f"  {fig['tokens/s']:6.1f} tokens/s, decode {fig['decode/s']:6.1f}/s, "
                      f"TTFT p50 "
                      f"{percentile(fig['ttft'], 0.5) * 1e3:6.1f} ms, ITL p50 "
                      f"{percentile(fig['itl'], 0.5) * 1e3:5.1f} ms p99 "
                      f"{percentile(fig['itl'], 0.99) * 1e3:5.1f} ms, {fig['chunks']} text "
                      f"chunks", flush=True)
                if not contended:
                    kept[name].append(fig)
    finally:
        server.stop()
    print()
    print(f"model {model}, prompt {len(ids)} ids, {args.tokens} tokens per stream, "
          f"{args.threads} threads per device; kept "
          + ", ".join(f"{n} {len(kept[n])}" for n in names)
          + f"; load average before runs {min(loads):.2f}..{max(loads):.2f}")
    if any(not kept[n] for n in names):
        print("no figure: every run of a mode was taken under contention")
        return 1
    print(f"{'mode':10s} {'tokens/s best':>13s} {'median':>7s} {'decode/s best':>13s} "
          f"{'median':>7s} {'TTFT p50':>9s} {'p99':>7s} {'ITL p50':>8s} {'p99':>6s}  (ms)")
    med, dec = {}, {}
    for n in names:
        rates = [f["tokens/s"] for f in kept[n]]
        ttft = [x for f in kept[n] for x in f["ttft"]]
        itl = [x for f in kept[n] for x in f["itl"]]
        decodes = [f["decode/s"] for f in kept[n]]
        med[n], dec[n] = statistics.median(rates), statistics.median(decodes)
        print(f"{n:10s} {max(rates):13.1f} {med[n]:7.1f} {max(decodes):13.1f} {dec[n]:7.1f} "
              f"{percentile(ttft, 0.5) * 1e3:9.1f} "
              f"{percentile(ttft, 0.99) * 1e3:7.1f} {percentile(itl, 0.5) * 1e3:8.1f} "
              f"{percentile(itl, 0.99) * 1e3:6.1f}")
    print(f"served 1 / direct, decode/s (medians): {dec['served 1'] / dec['direct']:.3f} "
          f"(goal >= 0.95); tokens/s: {med['served 1'] / med['direct']:.3f}")
    print(f"served {c} tokens/s / direct decode/s: {med[f'served {c}'] / dec['direct']:.2f}, "
          f"/ served 1 tokens/s: {med[f'served {c}'] / med['served 1']:.2f} (goal > 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
