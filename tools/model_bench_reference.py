"""The `transformers` reference's CPU speed on a model directory: the peer of the forward-pass bench.

Loads a directory written by `troupe model init` (e.g. `--preset small`) into the deepseek_v41
reference (the upstream files in --oracle, as tools/model_golden.py does), and measures with
`--threads` torch threads: prefill tokens/s (one forward over `--prompt` tokens per sequence) and
decode tokens/s (`--decode` one-token steps through the cache) at each batch size, and the
process's peak RSS. Prints one JSON object. Token ids are fixed pseudo-random ids (seed 0).

    tools/.venv-model/bin/python tools/model_bench_reference.py --oracle /path/to/oracle \\
        --model /tmp/small --threads 2 --prompt 256 --decode 16 --batch 1 8
"""
import argparse
import json
import pathlib
import resource
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import model_golden  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oracle", required=True, type=pathlib.Path)
    ap.add_argument("--model", required=True, type=pathlib.Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg_mod, modeling = model_golden.load_oracle(args.oracle.resolve())
    model, _ = model_golden.reference_from_dir(args.model, cfg_mod, modeling)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    out = {"model": str(args.model), "threads": args.threads, "prompt": args.prompt,
           "decode": args.decode, "torch": torch.__version__, "runs": []}
    for batch in args.batch:
        ids = torch.randint(3, vocab - 1, (batch, args.prompt + args.decode), generator=gen)
        if model.model.engram_hash_state is not None:
            model.model.engram_hash_state.history = None  # fresh n-gram history per run
        with torch.no_grad():
            t0 = time.perf_counter()
            res = model(input_ids=ids[:, : args.prompt], use_cache=True)
            t1 = time.perf_counter()
            cache = res.past_key_values
            for k in range(args.decode):
                step = model(input_ids=ids[:, args.prompt + k : args.prompt + k + 1], past_key_values=cache, use_cache=True)
                cache = step.past_key_values
            t2 = time.perf_counter()
        out["runs"].append({"batch": batch,
                            "prefill_tokens_per_s": batch * args.prompt / (t1 - t0),
                            "decode_tokens_per_s": batch * args.decode / (t2 - t1),
                            "prefill_s": t1 - t0, "decode_s": t2 - t1})
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
