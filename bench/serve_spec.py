"""`troupe serve --spec off|fixed5|dspark` on the CPU engine: what speculation costs and gains.

One invocation starts three `troupe serve` processes on the same model directory, one per
`--spec` mode, and for several rounds (the order rotating every round) sends each the same
greedy Chat Completions streams: 1 stream, then --concurrent streams at once. Each run waits
for 2 quiet seconds first and is dropped (listed, not counted) when processes other than this
script and the three servers used more than --max-foreign of a core during it; rounds go on (up
to --max-rounds) until every mode has --rounds kept runs. It prints per mode the min and
median tokens/s (bench/serve_vs_generate.py's definition), and the decode device's draft
counters from /metrics: drafts proposed, verified and accepted over the whole invocation.

Every mode must give the same text (speculation never changes a greedy output); a run whose
streams differ from the `off` server's fails the bench.

    python3 bench/serve_spec.py [--troupe build/troupe] [--model DIR] [--rounds 3]
        [--max-rounds 8] [--tokens 64] [--threads 2] [--concurrent 8] [--max-foreign 0.1]

Without --model it writes the small preset (random weights: its drafts are chance, so this
measures what drafting and verifying cost more than what they gain). The standard library only.
"""
import argparse
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import serve_vs_generate as svg  # noqa: E402

MODES = ("off", "fixed5", "dspark")


def drafts(port):
    text = svg.metrics_text(port)
    out = {}
    for outcome in ("proposed", "verified", "accepted"):
        m = re.search(r'troupe_device_drafts_total\{device="decode/0",outcome="%s"\} (\S+)'
                      % outcome, text)
        out[outcome] = int(float(m.group(1))) if m else 0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    svg.add_round_options(ap, tokens=64)
    args = ap.parse_args()
    model, tmp = svg.model_or_small(args.troupe, args.model, "troupe-bench-spec-")
    servers = {m: svg.Server(args.troupe, model, args.threads, ("--spec", m)) for m in MODES}
    try:
        want = svg.answer(servers["off"].port, svg.PROMPT, args.tokens)
        for m in MODES[1:]:
            got = svg.answer(servers[m].port, svg.PROMPT, args.tokens)
            if got != want:
                raise RuntimeError(f"--spec {m} answered {got!r}, --spec off {want!r}")
        svg.interleaved_rounds(servers, args)
        for m in MODES:
            d = drafts(servers[m].port)
            print(f"drafts {m:7s} proposed {d['proposed']}, verified {d['verified']}, "
                  f"accepted {d['accepted']}")
    finally:
        for s in servers.values():
            s.stop()
        if tmp:
            tmp.cleanup()


if __name__ == "__main__":
    main()
