"""The CPU engine against the `transformers` reference, interleaved, with contention dropped.

One invocation runs both engines on the same model directory, alternately, for several
rounds (troupe first in odd rounds, the reference first in even ones), each engine in its own
process with the same thread count: `build/bench/bench_model` and
tools/model_bench_reference.py (the upstream deepseek_v41 modeling files from --oracle, as
tools/model_golden.py loads them). For every run it records the 1-minute load average before
it and the CPU time that OTHER processes used during it (from /proc/stat, less the child's own
CPU time). A run during which others used more than --max-foreign of a core is taken under
contention: its figures are listed but not counted. It prints, per figure, the min and median
over the kept runs of each engine, their ratio, and the load averages seen.

    tools/.venv-model/bin/python bench/model_vs_reference.py --oracle /work/oracle/deepseek_v41 \\
        [--model DIR] [--rounds 5] [--prompt 256] [--decode 32] [--threads 2]

Without --model it writes the small preset (`build/troupe model init --preset small --seed 1`)
to a temporary directory. Needs tools/.venv-model (tools/requirements-model.txt).
"""
import argparse
import json
import os
import pathlib
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


def cpu_busy_seconds():
    """Busy CPU time of the whole machine (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_measured(cmd):
    """Runs cmd; returns (stdout, wall seconds, foreign cores, load average before)."""
    load = os.getloadavg()[0]
    busy0, own0, t0 = cpu_busy_seconds(), children_cpu_seconds(), time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - t0
    foreign = (cpu_busy_seconds() - busy0) - (children_cpu_seconds() - own0)
    return out, wall, max(0.0, foreign) / wall, load


def troupe_figures(text, batches):
    fig = {}
    m = re.search(r"^prefill \d+ tokens: ([\d.]+) tokens/s", text, re.M)
    fig["prefill tok/s"] = float(m.group(1))
    for b in batches:
        m = re.search(rf"^decode batch {b} \(context \d+\): ([\d.]+) tokens/s", text, re.M)
        fig[f"decode b{b} tok/s"] = float(m.group(1))
    m = re.search(r"^peak RSS (\d+) MiB", text, re.M)
    fig["peak RSS MiB"] = float(m.group(1))
    return fig


def reference_figures(text, batches):
    # transformers prints warnings to stdout too: the JSON object is the output's last part.
    doc = json.loads(text[text.index("\n{\n") + 1 if not text.startswith("{") else 0:])
    runs = {r["batch"]: r for r in doc["runs"]}
    fig = {"prefill tok/s": runs[1]["prefill_tokens_per_s"]}
    for b in batches:
        fig[f"decode b{b} tok/s"] = runs[b]["decode_tokens_per_s"]
    fig["peak RSS MiB"] = doc["peak_rss_mib"]
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oracle", required=True, type=pathlib.Path)
    ap.add_argument("--model", type=pathlib.Path)
    ap.add_argument("--bench", type=pathlib.Path, default=REPO / "build/bench/bench_model")
    ap.add_argument("--troupe", type=pathlib.Path, default=REPO / "build/troupe")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-foreign", type=float, default=0.10,
                    help="cores other processes may use during a run before it is dropped")
    args = ap.parse_args()
    batches = [1, 8]
    tmp = None
    model = args.model
    if model is None:
        tmp = tempfile.TemporaryDirectory(prefix="troupe-bench-ref-")
        model = pathlib.Path(tmp.name) / "small"
        subprocess.run([str(args.troupe), "model", "init", "--preset", "small", "--seed", "1",
                        "--out", str(model)], check=True, capture_output=True)
    engines = {
        "troupe": ([str(args.bench), "--model", str(model), "--prompt", str(args.prompt),
                    "--decode", str(args.decode), "--threads", str(args.threads)],
                   troupe_figures),
        "reference": ([sys.executable, str(REPO / "tools/model_bench_reference.py"),
                       "--oracle", str(args.oracle), "--model", str(model),
                       "--threads", str(args.threads), "--prompt", str(args.prompt),
                       "--decode", str(args.decode), "--batch", *map(str, batches)],
                      reference_figures),
    }
    kept = {name: [] for name in engines}
    loads = []
    for r in range(args.rounds):
        order = ["troupe", "reference"] if r % 2 == 0 else ["reference", "troupe"]
        for name in order:
            cmd, parse = engines[name]
            out, wall, foreign, load = run_measured(cmd)
            fig = parse(out, batches)
            loads.append(load)
            contended = foreign > args.max_foreign
            print(f"round {r + 1} {name:9s} load {load:4.2f} others {foreign:4.2f} cores"
                  + ("  DROPPED (contention)" if contended else "") + "  "
                  + ", ".join(f"{k} {v:.1f}" for k, v in fig.items()), flush=True)
            if not contended:
                kept[name].append(fig)
    print()
    print(f"model {model}, prompt {args.prompt}, decode {args.decode}, {args.threads} threads, "
          f"{args.rounds} rounds; kept troupe {len(kept['troupe'])}, reference "
          f"{len(kept['reference'])}; load average before runs {min(loads):.2f}..{max(loads):.2f}")
    if not kept["troupe"] or not kept["reference"]:
        print("no figure: every run of an engine was taken under contention")
        return 1
    # "best" is the run with the least time: the highest throughput (the lowest RSS); the ratio
    # is troupe / reference of the medians (above 1: troupe is faster, or uses more memory).
    print(f"{'figure':16s} {'troupe best':>11s} {'median':>9s} {'ref best':>9s} {'median':>9s} "
          f"{'ratio (medians)':>16s}")
    for key in kept["troupe"][0]:
        t = [f[key] for f in kept["troupe"]]
        ref = [f[key] for f in kept["reference"]]
        # Throughputs: the best run is the max; memory: the min.
        best = min if "RSS" in key else max
        ratio = statistics.median(t) / statistics.median(ref)
        print(f"{key:16s} {best(t):11.1f} {statistics.median(t):9.1f} {best(ref):9.1f} "
              f"{statistics.median(ref):9.1f} {ratio:15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
