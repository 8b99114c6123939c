"""bench_grammar's peer: llguidance on the same workloads (bench/grammar_workloads.json), the same
DeepSeek-V4 tokenizer file and the same canonical JSON form (", " and ": " separators, no other
whitespace); an EBNF workload's GBNF text goes through llguidance's own GBNF converter
(llguidance.grammar_from("gbnf", ...)). Measured as bench_grammar measures troupe: compile = a
new LLMatcher from the schema or grammar,
mask = fill_next_token_bitmask before each token of the output, p50 / p99 over all rounds (each
round a new matcher, so its first-pass caches are cold every round), in thread CPU time
(time.thread_time_ns, as bench_grammar: the machine is shared). Python call overhead is
included. Pinned: bench/requirements-grammar.txt (bench/setup-grammar-venv.sh)."""
import argparse
import gzip
import json
import os
import time

import llguidance
import llguidance.numpy as lnp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pct(v, p):
    v = sorted(v)
    return v[int(p * (len(v) - 1))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    text = gzip.open(os.path.join(ROOT, "recipe/data/deepseek-v4/tokenizer.json.gz")).read().decode()
    tok = llguidance.LLTokenizer(text)
    workloads = json.load(open(os.path.join(ROOT, "bench/grammar_workloads.json")))
    print(f"\npeer: llguidance {llguidance.get_version() if hasattr(llguidance, 'get_version') else '?'}, "
          f"vocabulary {tok.vocab_size} ids")
    print(f"{'workload':15} {'tokens':>7} | {'compile p50 / p99':17} | {'mask p50 / p99':19} | max")
    for w in workloads:
        if "tools" in w:  # the DSML block would have to be written as a Lark grammar with special tokens
            print(f"{w['name']:15} not run: tool-call grammars are not written for llguidance")
            continue
        if "ebnf" in w:
            grammar = llguidance.grammar_from("gbnf", w["ebnf"])
        else:
            schema = dict(w["schema"])
            schema["x-guidance"] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        ids = tok.tokenize_str(w["output"])
        compile_us, mask_us = [], []
        bitmask = lnp.allocate_token_bitmask(1, tok.vocab_size)
        for _ in range(a.rounds):
            t0 = time.thread_time_ns()
            m = llguidance.LLMatcher(tok, grammar)
            compile_us.append((time.thread_time_ns() - t0) / 1e3)
            if m.is_error():
                raise SystemExit(f"{w['name']}: {m.get_error()}")
            for i in range(len(ids) + 1):
                t0 = time.thread_time_ns()
                lnp.fill_next_token_bitmask(m, bitmask, 0)
                mask_us.append((time.thread_time_ns() - t0) / 1e3)
                if i < len(ids) and not m.consume_token(ids[i]):
                    raise SystemExit(f"{w['name']}: token {i} refused: {m.get_error()}")
        print(f"{w['name']:15} {len(ids) + 1:7} | {pct(compile_us, 0.5):7.0f} / {pct(compile_us, 0.99):7.0f} us | "
              f"{pct(mask_us, 0.5):7.1f} / {pct(mask_us, 0.99):7.0f} us | {max(mask_us):.0f} us")


if __name__ == "__main__":
    main()
