#!/usr/bin/env python3
"""The Python-side peers of bench/recipe_bench.cpp, measured in the same run (the bench calls this
script with the inputs it wrote and prints the ratios). Prints one JSON object.

  HF `tokenizers` (Rust core, one thread: RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false, the
  whole corpus in one encode_batch call, so no per-record Python overhead), trusted mode (its
  default) and plain mode (encode_special_tokens = True); a fresh tokenizer for the cold pass, the
  same one again for the warm pass.
  deepseek_recipe 0.2.0: Tokenizer.encode per record (it has no batch call), request -> ids
  (ChatCompletionRequest(body).convert + DeepseekV4Encoding.encode) per request, the 1M-token
  prompt, and its StreamProcessor over the generated ids (one id per push, and all ids in one push).

  tools/.venv-recipe/bin/python tools/recipe_bench_peer.py WORKDIR   # WORKDIR written by the bench
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import gzip, json, pathlib, sys, time

import deepseek_recipe as dr
import tokenizers

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOK_GZ = ROOT / "recipe/data/deepseek-v4/tokenizer.json.gz"
CORPUS = ROOT / "tests/recipe/golden/corpus.jsonl.gz"
REQUESTS = ROOT / "tests/recipe/golden/chat_completions.v4.jsonl.gz"


def main():
    work = pathlib.Path(sys.argv[1])
    text = gzip.decompress(TOK_GZ.read_bytes()).decode()
    records = [json.loads(l) for l in gzip.open(CORPUS, "rt") if l.strip()]
    mb = sum(len(r.encode()) for r in records) / 1e6
    out = {"tokenizers": tokenizers.__version__, "deepseek_recipe": dr.__version__, "corpus_mb": mb}

    for mode in ("trusted", "plain"):
        hf = tokenizers.Tokenizer.from_str(text)
        if mode == "plain":
            hf.encode_special_tokens = True
        t = time.perf_counter(); hf.encode_batch(records); cold = time.perf_counter() - t
        t = time.perf_counter(); hf.encode_batch(records); warm = time.perf_counter() - t
        out[f"hf_{mode}_cold_mb_s"] = mb / cold
        out[f"hf_{mode}_warm_mb_s"] = mb / warm

    hf = tokenizers.Tokenizer.from_str(text)
    t = time.perf_counter()
    for r in records: hf.encode(r)
    out["hf_trusted_per_record_mb_s"] = mb / (time.perf_counter() - t)

    tok = dr.Tokenizer.from_str(text)
    t = time.perf_counter()
    for r in records: tok.encode(r)
    out["dr_tokenizer_encode_mb_s"] = mb / (time.perf_counter() - t)

    enc = dr.DeepseekV4Encoding().with_tokenizer(tok)
    opts = dr.ConversionOptions()
    bodies = [json.dumps(r["request"], ensure_ascii=False) for r in
              (json.loads(l) for l in gzip.open(REQUESTS, "rt") if l.strip()) if "error" not in r]
    ok = []
    for b in bodies:
        try:
            dr.ChatCompletionRequest(b).convert(opts); ok.append(b)
        except Exception:
            pass
    rounds = int(os.environ.get("PEER_ROUNDS", "50"))
    t = time.perf_counter()
    for _ in range(rounds):
        for b in ok:
            enc.encode(dr.ChatCompletionRequest(b).convert(opts).conversation)
    out["dr_request_us"] = (time.perf_counter() - t) / (rounds * len(ok)) * 1e6
    out["requests"] = len(ok)

    big = (work / "prompt_1m.json").read_text()
    t = time.perf_counter()
    ids = enc.encode(dr.ChatCompletionRequest(big).convert(opts).conversation)
    out["dr_1m_prompt_s"] = time.perf_counter() - t
    out["dr_1m_prompt_tokens"] = len(ids)

    gen = json.loads((work / "stream_ids.json").read_text())
    req = (work / "stream_request.json").read_text()
    for name, per_push in (("dr_stream_ns_per_token_push_each", 1), ("dr_stream_ns_per_token_push_all", len(gen))):
        conv = dr.ChatCompletionRequest(req).convert(opts)
        sp = dr.StreamProcessor(dr.ChatCompletionRequest.chunk_generator(conv, "id", "m"), conv.parsing_options, tok)
        sp.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=1)))
        t = time.perf_counter()
        for i in range(0, len(gen), per_push):
            sp.push(dr.InferenceChunk.tokens(gen[i:i + per_push]))
        sp.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
        sp.finish()
        out[name] = (time.perf_counter() - t) / len(gen) * 1e9
    print(json.dumps(out))


if __name__ == "__main__":
    main()
