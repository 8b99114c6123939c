#!/usr/bin/env python3
"""troupe.recipe's encode speed from Python beside deepseek_recipe 0.2.0 and HF tokenizers 0.23.3,
on the same inputs in the same process, rounds interleaved (every peer once per round), min and
median over the rounds. Not a test: prints one line per figure and a JSON summary.

  Inputs: the tokenizer parity corpus (tests/recipe/golden/corpus.jsonl.gz, 10 MB, 13,436
  records) and the accepted Chat Completions goldens (tests/recipe/golden/chat_completions.v4).
  - per record: one encode call per record from a Python loop (trusted mode: every added token
    matched, the mode all three have), the same tokenizer object every round (warm caches after
    the first round);
  - batch: one call for the whole corpus on one thread (troupe encode_batch threads=1, HF
    encode_batch with RAYON_NUM_THREADS=1); deepseek_recipe has no batch call;
  - request -> ids: body (JSON text) -> converted conversation -> prompt ids, per request.

Needs the three packages in one venv: tools/.venv-recipe (tools/requirements-recipe.txt) with
the troupe wheel installed into it (docs/benchmarks.md says how).

  tools/.venv-recipe/bin/python bench/python_recipe.py [--rounds 5]
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse, gzip, json, pathlib, statistics, time

import deepseek_recipe as dr
import tokenizers

import troupe
from troupe import recipe as tr

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests/recipe/golden"


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    load_before = os.getloadavg()

    text = gzip.decompress((ROOT / "recipe/data/deepseek-v4/tokenizer.json.gz").read_bytes()).decode()
    records = [json.loads(l) for l in gzip.open(GOLDEN / "corpus.jsonl.gz", "rt") if l.strip()]
    mb = sum(len(r.encode()) for r in records) / 1e6
    bodies = [json.dumps(g["request"], ensure_ascii=False) for g in
              (json.loads(l) for l in gzip.open(GOLDEN / "chat_completions.v4.jsonl.gz", "rt"))
              if "error" not in g]

    ours = tr.Tokenizer.from_str(text)
    hf = tokenizers.Tokenizer.from_str(text)
    ddr = dr.Tokenizer.from_str(text)
    # The three agree on the inputs (else the speeds are not comparable).
    sample = records[::50]
    assert [ours.encode(r) for r in sample] == [hf.encode(r).ids for r in sample] == [ddr.encode(r) for r in sample]
    our_enc = tr.DeepseekV4Encoding(ours)
    dr_enc = dr.DeepseekV4Encoding().with_tokenizer(ddr)
    opts, dr_opts = tr.ConversionOptions(), dr.ConversionOptions()
    assert [our_enc.encode(tr.ChatCompletionRequest(b).convert(opts).conversation) for b in bodies] == \
        [dr_enc.encode(dr.ChatCompletionRequest(b).convert(dr_opts).conversation) for b in bodies]

    peers = {
        "per_record_mb_s": {
            "troupe": lambda: [ours.encode(r) for r in records],
            "hf": lambda: [hf.encode(r) for r in records],
            "deepseek_recipe": lambda: [ddr.encode(r) for r in records],
        },
        "batch_1_thread_mb_s": {
            "troupe": lambda: ours.encode_batch(records, threads=1),
            "hf": lambda: hf.encode_batch(records),
        },
        "request_to_ids_us": {
            "troupe": lambda: [our_enc.encode(tr.ChatCompletionRequest(b).convert(opts).conversation) for b in bodies * 20],
            "deepseek_recipe": lambda: [dr_enc.encode(dr.ChatCompletionRequest(b).convert(dr_opts).conversation) for b in bodies * 20],
        },
    }
    times = {(f, p): [] for f, ps in peers.items() for p in ps}
    for _ in range(args.rounds):
        for f, ps in peers.items():
            for p, fn in ps.items():
                times[(f, p)].append(timed(fn))

    out = {"rounds": args.rounds, "corpus_mb": round(mb, 2), "requests": len(bodies),
           "versions": {"troupe": troupe.__version__, "deepseek_recipe": dr.__version__,
                        "tokenizers": tokenizers.__version__},
           "load_average_before": load_before, "load_average_after": os.getloadavg(), "figures": {}}
    for (f, p), ts in times.items():
        if f == "request_to_ids_us":
            per = [t / (len(bodies) * 20) * 1e6 for t in ts]
            best, med = min(per), statistics.median(per)
        else:
            best, med = mb / min(ts), mb / statistics.median(ts)  # min time = best speed
        out["figures"].setdefault(f, {})[p] = {"best": round(best, 2), "median": round(med, 2)}
        print(f"{f:22} {p:16} best {best:9.2f}  median {med:9.2f}")
    print(f"load average before {load_before}, after {os.getloadavg()} (shared 2-core machine)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
