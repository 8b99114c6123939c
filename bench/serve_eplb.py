"""`troupe serve --eplb RANKS` on the CPU engine: the balancedness it reaches, what it costs.

One invocation starts two `troupe serve` processes on the same model directory, one plain and
one with `--eplb RANKS --eplb-interval 2s`, and checks that they give the same greedy text.

Balancedness: for --intervals intervals it sends the EPLB server --concurrent requests with
different prompts at once, waits for the balancer's next placement, and reads from /metrics
the balancedness (mean / max rank load) of each device's ranks under that interval's router
load, with the placement the device ran (`previous`: contiguous expert ranges before the first
switch) and with the new one. It prints min and median of both per device.

Cost: for several rounds (the order rotating every round) it sends each server the same greedy streams,
1 and then --concurrent at once, and prints min and median tokens/s
(bench/serve_vs_generate.py's definition). A run during which other processes used more than
--max-foreign of a core is dropped (listed, not counted). The ranks are not separate devices
here: one CPU device computes them all, so EPLB cannot make it faster; this measures what
dispatching by a placement costs.

    python3 bench/serve_eplb.py [--troupe build/troupe] [--model DIR] [--ranks 4]
        [--intervals 8] [--rounds 3] [--max-rounds 8] [--tokens 32] [--threads 2]
        [--concurrent 8] [--max-foreign 0.1]

Without --model it writes the small preset (16 routed experts, top-4; random weights). The
standard library only.
"""
import argparse
import concurrent.futures
import pathlib
import re
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import serve_vs_generate as svg  # noqa: E402

DEVICES = ("prefill/0", "decode/0")


def metrics(port):
    text = svg.metrics_text(port)
    out = {}
    for d in DEVICES:
        m = re.search(r'troupe_device_expert_placements_total\{device="%s",outcome="applied"\} (\S+)'
                      % d, text)
        out[(d, "applied")] = int(float(m.group(1))) if m else 0
        for p in ("previous", "new"):
            m = re.search(r'troupe_eplb_balancedness\{device="%s",placement="%s"\} (\S+)' % (d, p),
                          text)
            out[(d, p)] = float(m.group(1)) if m else None
    return out


def prompts(round_, n):
    topics = ["supervision trees", "expert parallelism", "KV caches", "load balancers",
              "speculative decoding", "grammar masks", "sliding windows", "autoscaling",
              "block stores", "hash chains", "prefill chunks", "decode batches"]
    return [f"Round {round_}: explain {topics[(round_ * n + i) % len(topics)]} to a {i}-year-old."
            for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    svg.add_round_options(ap, tokens=32)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--intervals", type=int, default=8)
    args = ap.parse_args()
    model, tmp = svg.model_or_small(args.troupe, args.model, "troupe-bench-eplb-")
    servers = {"plain": svg.Server(args.troupe, model, args.threads),
               "eplb": svg.Server(args.troupe, model, args.threads,
                                  ("--eplb", str(args.ranks), "--eplb-interval", "2s"))}
    try:
        for p in prompts(0, 3):
            want, got = (svg.answer(servers[s].port, p, args.tokens) for s in ("plain", "eplb"))
            if got != want:
                raise RuntimeError(f"--eplb answered {got!r}, the plain server {want!r}")

        seen = {(d, p): [] for d in DEVICES for p in ("previous", "new")}
        port = servers["eplb"].port
        with concurrent.futures.ThreadPoolExecutor(args.concurrent) as pool:
            for i in range(args.intervals):
                before = metrics(port)
                list(pool.map(lambda p: svg.answer(port, p, args.tokens), prompts(i + 1, args.concurrent)))
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:  # the next placement after this load
                    now = metrics(port)
                    if all(now[(d, "applied")] > before[(d, "applied")] for d in DEVICES):
                        break
                    time.sleep(0.25)
                time.sleep(2.5)  # a full interval of that load, idle after it: not re-placed
                now = metrics(port)
                line = []
                for d in DEVICES:
                    for p in ("previous", "new"):
                        if now[(d, p)] is not None:
                            seen[(d, p)].append(now[(d, p)])
                    line.append(f"{d} {now[(d, 'previous')]:.3f} -> {now[(d, 'new')]:.3f}")
                print(f"interval {i + 1}: " + ", ".join(line), flush=True)

        svg.interleaved_rounds(servers, args)
        print()
        print(f"balancedness over {args.intervals} intervals ({args.ranks} ranks), min / median:")
        for d in DEVICES:
            prev, new = seen[(d, "previous")], seen[(d, "new")]
            if prev and new:
                print(f"  {d:10s} running placement {min(prev):.3f} / {statistics.median(prev):.3f}"
                      f"   new placement {min(new):.3f} / {statistics.median(new):.3f}")
    finally:
        for s in servers.values():
            s.stop()
        if tmp:
            tmp.cleanup()


if __name__ == "__main__":
    main()
