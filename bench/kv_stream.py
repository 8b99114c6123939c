"""A prompt's KV streamed to its decode process while the prefill computes, against one transfer
after it (`troupe launch --kv-stream on|off`).

One invocation runs, for several rounds and in both modes (their order alternating by round),
`troupe launch examples/topologies/local-cpu-3.toml` (a control process, one prefill and two
decode processes on CPU devices, KV over the `tcp` fabric) on a model directory, and sends it
--requests greedy Chat Completions streams, one at a time, each with a prompt of its own (no
prefix hit) of --words words. The prefill process computes a prompt in 512-token chunks; with
--kv-stream on the request books its decode process as the prefill begins, and that process
pulls each chunk's full blocks while the next chunk computes, so only the last blocks and the
window state cross after the prefill. Figures per request:

  ttft     request sent → its first token (which leaves with the end of the prefill);
  handoff  first token → second token: the KV crossing (what is left of it), its import on
           the decode device, and one decode step.

It prints min and median of each over every request of a mode, with the 1-minute load
average of each round (a figure taken under load is not a figure), and the KV the decode
processes pulled while a prefill still computed (their "KV over the fabric" lines). Both modes
must give the same text for the same prompt (greedy), else the run fails.

    python3 bench/kv_stream.py [--troupe build/troupe] [--model DIR] [--rounds 3]
        [--requests 2] [--words 150] [--tokens 4] [--threads 1]

Without --model it writes the small preset (`troupe model init --preset small --seed 1`) to a
temporary directory. The standard library only.
"""
import argparse
import http.client
import json
import os
import pathlib
import re
import statistics
import subprocess
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
MODEL_NAME = "deepseek-v4.1-flash"


def timed_stream(port, prompt, tokens):
    """One greedy SSE stream: (arrival time of each text chunk, the text, request start)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    body = {"model": MODEL_NAME, "temperature": 0, "stream": True, "max_tokens": tokens,
            "thinking": {"type": "disabled"},
            "messages": [{"role": "user", "content": prompt}]}
    start = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"content-type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    arrivals, text = [], []
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for c in json.loads(line[6:]).get("choices", []):
            piece = c.get("delta", {}).get("content")
            if piece:
                arrivals.append(time.monotonic())
                text.append(piece)
    return arrivals, "".join(text), start


def prompt_of(n, words):
    """A prompt of its own for request `n` (its first block differs from every other's)."""
    return f"Request {n}. " + " ".join(f"item{(n * 7919 + i) % 100003} is next to the other "
                                       f"items of row {i}." for i in range(words))


def run_mode(a, model, tmp, mode, first_request):
    """Launches the cluster with --kv-stream `mode`, sends the requests; returns their figures,
    texts, and the runs of blocks the decode processes pulled while a prefill computed."""
    state_file = os.path.join(tmp, f"state-{mode}-{first_request}.json")
    log = []
    launcher = subprocess.Popen(
        [a.troupe, "launch", str(REPO / "examples/topologies/local-cpu-3.toml"), "--model", model,
         "--engram-map", "identity", "--listen", "127.0.0.1:0", "--threads", str(a.threads),
         "--grace", "1", "--kv-dir", os.path.join(tmp, f"kv-{mode}-{first_request}"),
         "--state", state_file, "--kv-stream", mode],
        stderr=subprocess.PIPE, text=True)
    reader = threading.Thread(target=lambda: [log.append(l) for l in launcher.stderr], daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with open(state_file) as f:
                    if json.load(f).get("http"):
                        break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("troupe launch did not serve:\n" + "".join(log))
        with open(state_file) as f:
            port = int(json.load(f)["http"].rsplit(":", 1)[1])
        timed_stream(port, prompt_of(10**6 + first_request, 20), 2)  # warm both paths
        rows, texts = [], {}
        for n in range(first_request, first_request + a.requests):
            arrivals, text, start = timed_stream(port, prompt_of(n, a.words), a.tokens)
            if len(arrivals) < 2:
                raise RuntimeError(f"request {n}: fewer than two tokens: {text!r}")
            rows.append((arrivals[0] - start, arrivals[1] - arrivals[0]))
            texts[n] = text
    finally:
        launcher.terminate()
        launcher.wait(timeout=120)
        reader.join(timeout=10)
    early = sum(int(m.group(1)) for l in log
                if (m := re.search(r"decode/\d+\]: KV over the fabric: .*; (\d+) run\(s\)", l)))
    return rows, texts, early


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--troupe", default=str(REPO / "build" / "troupe"))
    ap.add_argument("--model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--words", type=int, default=150)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="troupe-kv-stream-")
    model = a.model
    if not model:
        model = os.path.join(tmp.name, "small")
        subprocess.run([a.troupe, "model", "init", "--preset", "small", "--seed", "1", "--out",
                        model], check=True, capture_output=True)
    figures = {"on": [], "off": []}
    early = {"on": 0, "off": 0}
    texts = {"on": {}, "off": {}}
    for rnd in range(a.rounds):
        for mode in (("on", "off") if rnd % 2 == 0 else ("off", "on")):
            load = os.getloadavg()[0]
            # The same prompts in both modes of a round (greedy: the same text).
            rows, t, e = run_mode(a, model, tmp.name, mode, rnd * a.requests)
            figures[mode] += rows
            texts[mode].update(t)
            early[mode] += e
            print(f"round {rnd + 1} --kv-stream {mode}: load {load:.2f}, "
                  + ", ".join(f"ttft {f:.3f} s handoff {h * 1000:.1f} ms" for f, h in rows),
                  flush=True)
    if texts["on"] != texts["off"]:
        raise SystemExit(f"the modes' texts differ: {texts}")
    print(f"\n{a.words} words per prompt ({a.requests} requests x {a.rounds} rounds per mode), "
          f"the same greedy text in both modes")
    for mode in ("on", "off"):
        ttft = [f for f, _ in figures[mode]]
        hand = [h * 1000 for _, h in figures[mode]]
        print(f"--kv-stream {mode:3}: ttft min {min(ttft):.3f} s median {statistics.median(ttft):.3f} s; "
              f"handoff min {min(hand):.1f} ms median {statistics.median(hand):.1f} ms; "
              f"runs of blocks pulled while a prefill computed: {early[mode]}")


if __name__ == "__main__":
    main()
