"""bench_grammar's peers: llguidance and, when it is installed, XGrammar, on the same workloads
(bench/grammar_workloads.json), the same DeepSeek-V4 tokenizer file and the same canonical JSON
form (", " and ": " separators, no other whitespace). An EBNF workload's GBNF text goes through
llguidance's own GBNF converter (llguidance.grammar_from("gbnf", ...)) and as it is to XGrammar's
EBNF compiler. Measured as bench_grammar measures troupe: compile = llguidance's new LLMatcher
from the schema or grammar / XGrammar's GrammarCompiler.compile_* (its cache off, one thread) and
a GrammarMatcher; mask = fill_next_token_bitmask before each token of the output; p50 / p99 over
all rounds (each round a new matcher, so llguidance's lazy caches start cold every round;
XGrammar builds its token masks at compile time), in thread CPU time (time.thread_time_ns, as
bench_grammar: the machine is shared). Python call overhead is included. A tool-call workload
runs on llguidance from its `llguidance_lark` field: the DSML block written by hand as a Lark
grammar, `<[128825]>` being the `｜DSML｜` token, each strict parameter's JSON through `%json`.
It differs from troupe's grammar in two places: a raw value holds no `<` (llguidance's lexer takes
the longest match, so a value that may hold `</` runs past the closing tag), and a raw date is
checked for its digits and month / day ranges only. XGrammar runs it from its
`xgrammar_structural_tag` field: the same block as a structural tag (`token` formats for
`｜DSML｜`, `json_schema` formats for the JSON values, with the same two differences, and
XGrammar's own whitespace rules inside the JSON values). Pinned:
bench/requirements-grammar.txt (llguidance) and bench/requirements-grammar-xgrammar.txt
(bench/setup-grammar-venv.sh [--xgrammar])."""
import argparse
import gzip
import importlib.metadata
import json
import os
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 129280


def pct(v, p):
    v = sorted(v)
    return v[int(p * (len(v) - 1))]


def header(name):
    print(f"\npeer: {name}")
    print(f"{'workload':15} {'tokens':>7} | {'compile p50 / p99':17} | {'mask p50 / p99':19} | max")


def report(w, ids, compile_us, mask_us):
    print(f"{w['name']:15} {len(ids) + 1:7} | {pct(compile_us, 0.5):7.0f} / {pct(compile_us, 0.99):7.0f} us | "
          f"{pct(mask_us, 0.5):7.1f} / {pct(mask_us, 0.99):7.0f} us | {max(mask_us):.0f} us")


def run_llguidance(text, workloads, rounds):
    import llguidance
    import llguidance.numpy as lnp
    tok = llguidance.LLTokenizer(text)
    header(f"llguidance {llguidance.get_version() if hasattr(llguidance, 'get_version') else '?'}, "
           f"vocabulary {tok.vocab_size} ids")
    for w in workloads:
        if "tools" in w and "llguidance_lark" not in w:
            print(f"{w['name']:15} not run: no llguidance form of its tool-call grammar")
            continue
        if "llguidance_lark" in w:
            grammar = llguidance.grammar_from("lark", w["llguidance_lark"])
        elif "ebnf" in w:
            grammar = llguidance.grammar_from("gbnf", w["ebnf"])
        elif "lark" in w:
            grammar = llguidance.grammar_from("lark", w["lark"])
        else:
            schema = dict(w["schema"])
            schema["x-guidance"] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        ids = tok.tokenize_str(w["output"])
        compile_us, mask_us = [], []
        bitmask = lnp.allocate_token_bitmask(1, tok.vocab_size)
        for _ in range(rounds):
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
        report(w, ids, compile_us, mask_us)


def run_xgrammar(text, workloads, rounds):
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tokenizer.json")
        with open(path, "w") as f:
            f.write(text)
        tok = PreTrainedTokenizerFast(tokenizer_file=path)
    eos = tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=VOCAB, stop_token_ids=[eos])
    header(f"XGrammar {importlib.metadata.version('xgrammar')}, vocabulary {info.vocab_size} ids")
    for w in workloads:
        if "tools" in w and "xgrammar_structural_tag" not in w:
            print(f"{w['name']:15} not run: no XGrammar form of its tool-call grammar")
            continue
        if "lark" in w:
            print(f"{w['name']:15} not run: XGrammar takes no Lark (vLLM converts Lark to GBNF for it)")
            continue
        ids = tok.encode(w["output"], add_special_tokens=False)
        compile_us, mask_us = [], []
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        for _ in range(rounds):
            compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            t0 = time.thread_time_ns()
            if "xgrammar_structural_tag" in w:
                compiled = compiler.compile_structural_tag(json.dumps(w["xgrammar_structural_tag"]))
            elif "ebnf" in w:
                compiled = compiler.compile_grammar(w["ebnf"])
            else:
                compiled = compiler.compile_json_schema(json.dumps(w["schema"]), any_whitespace=False,
                                                        separators=(", ", ": "))
            m = xgr.GrammarMatcher(compiled)
            compile_us.append((time.thread_time_ns() - t0) / 1e3)
            for i in range(len(ids) + 1):
                t0 = time.thread_time_ns()
                m.fill_next_token_bitmask(bitmask)
                mask_us.append((time.thread_time_ns() - t0) / 1e3)
                if i < len(ids) and not m.accept_token(ids[i]):
                    raise SystemExit(f"{w['name']}: token {i} refused by XGrammar")
        report(w, ids, compile_us, mask_us)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--workload", help="run this workload only")
    a = ap.parse_args()
    text = gzip.open(os.path.join(ROOT, "recipe/data/deepseek-v4/tokenizer.json.gz")).read().decode()
    workloads = json.load(open(os.path.join(ROOT, "bench/grammar_workloads.json")))
    if a.workload:
        workloads = [w for w in workloads if w["name"] == a.workload]
    run_llguidance(text, workloads, a.rounds)
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        print("\npeer: XGrammar not installed (bench/setup-grammar-venv.sh --xgrammar)")
        return
    run_xgrammar(text, workloads, a.rounds)


if __name__ == "__main__":
    main()
