"""Requests waiting for a decode place in `troupe serve`: how long a full batch keeps them.

One invocation starts `troupe serve examples/topologies/local-cpu.toml --max-batch B` with each
binary given (--troupe, twice to compare two builds), in turn, rotating the order every round,
and sends N greedy Chat Completions streams of --tokens tokens at once: with N > B, N - B of
them wait for a decode place, which a finished request frees. It records per run:

  makespan   from the first request sent to the last stream's end;
  handover   for each request that waited (its first decode token came after another
             stream's end), the gap from the latest stream end before its first decode token
             to that token: how long a freed place stayed empty, plus a decode step.

and prints per binary the min and median makespan and the median and max handover over its
runs, with the 1-minute load average before each run (a figure taken under contention is not
a figure: runs start after 2 quiet seconds, up to a minute of waiting).

    python3 bench/decode_wait.py --troupe build/troupe [--troupe OTHER] [--model DIR]
        [--rounds 3] [--requests 6] [--batch 2] [--tokens 48]

Without --model it writes the small preset (`troupe model init --preset small --seed 1`) to a
temporary directory. The standard library only.
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quiet(seconds=2.0, limit=60.0):
    """Waits until the 1-minute load average stops rising for `seconds`; returns it."""
    deadline = time.monotonic() + limit
    while True:
        before = os.getloadavg()[0]
        time.sleep(seconds)
        now = os.getloadavg()[0]
        if now <= before or time.monotonic() > deadline:
            return now


def serve(troupe, model, batch, kv_dir):
    proc = subprocess.Popen(
        [troupe, "serve", os.path.join(ROOT, "examples/topologies/local-cpu.toml"), "--model",
         model, "--engram-map", "identity", "--listen", "127.0.0.1:0", "--max-batch", str(batch),
         "--kv-dir", kv_dir], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if " on http://" in line:
            port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, port
    raise RuntimeError(f"{troupe} serve did not start")


def stream(port, i, tokens, out):
    body = {"model": "deepseek-v4.1-flash", "max_tokens": tokens, "temperature": 0,
            "stream": True,
            "messages": [{"role": "user", "content": f"Request {i}: tell me about actors."}]}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    chunks = []
    for raw in conn.getresponse():
        line = raw.decode().strip()
        if line.startswith("data: {"):
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content") or delta.get("reasoning_content"):
                chunks.append(time.monotonic())
    out[i] = (sent, chunks, time.monotonic())


def run(troupe, model, args):
    with tempfile.TemporaryDirectory() as kv:
        proc, port = serve(troupe, model, args.batch, kv)
        try:
            load = quiet()
            out = {}
            threads = [threading.Thread(target=stream, args=(port, i, args.tokens, out))
                       for i in range(args.requests)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    runs = list(out.values())
    if any(len(c) < 2 for _, c, _ in runs):
        raise RuntimeError("a stream ended with fewer than 2 text chunks")
    makespan = max(e for _, _, e in runs) - min(s for s, _, _ in runs)
    ends = sorted(e for _, _, e in runs)
    handovers = []
    for _, chunks, _ in runs:
        before = [e for e in ends if e < chunks[1]]
        if before:
            handovers.append(chunks[1] - before[-1])
    return makespan, handovers, load


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--troupe", action="append", required=True)
    p.add_argument("--model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--tokens", type=int, default=48)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if not model:
            model = os.path.join(tmp, "small")
            subprocess.run([args.troupe[0], "model", "init", "--preset", "small", "--seed", "1",
                            "--out", model], check=True, capture_output=True)
        results = {t: [] for t in args.troupe}
        for r in range(args.rounds):
            order = args.troupe[r % len(args.troupe):] + args.troupe[:r % len(args.troupe)]
            for t in order:
                makespan, handovers, load = run(t, model, args)
                results[t].append((makespan, handovers, load))
                print(f"round {r + 1} {t}: makespan {makespan:.2f} s, handovers "
                      f"{', '.join(f'{h * 1e3:.0f}' for h in sorted(handovers))} ms, "
                      f"load average {load:.2f}", file=sys.stderr)
    print(f"{args.requests} streams of {args.tokens} tokens, --max-batch {args.batch}, "
          f"{args.rounds} rounds")
    print(f"{'binary':40} {'makespan min / median s':>24} {'handover median / max ms':>26}"
          f" {'load avg':>9}")
    for t, rs in results.items():
        spans = sorted(m for m, _, _ in rs)
        hs = sorted(h for _, hh, _ in rs for h in hh)
        print(f"{t:40} {spans[0]:11.2f} / {statistics.median(spans):6.2f}"
              f" {statistics.median(hs) * 1e3 if hs else 0:15.0f} / {hs[-1] * 1e3 if hs else 0:6.0f}"
              f" {max(l for _, _, l in rs):9.2f}")


if __name__ == "__main__":
    main()
