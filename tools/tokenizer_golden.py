#!/usr/bin/env python3
"""Reference ids from Hugging Face `tokenizers` for the parity corpus.

Reads tests/recipe/golden/corpus.jsonl.gz and writes, next to it, ids.<mode>.bin.gz for the
three modes of recipe::encode_mode, and decode_each.jsonl.gz (HF decode of every single id):

  plain    Tokenizer.encode with encode_special_tokens = True (split_special_tokens=True)
  trusted  Tokenizer.encode, default (every added token matched)
  raw      the same tokenizer.json with its added_tokens removed (no added token matched)

ids.raw.bin.gz: for each corpus record, LEB128 varint count, then each id as a LEB128 varint.
ids.plain.bin.gz, ids.trusted.bin.gz: per record, varint 0 when the ids equal raw's, otherwise
varint count + 1 and the ids (most records hold no added-token string, so these stay small).

    tools/.venv-tokenizer/bin/python tools/tokenizer_golden.py
"""
import gzip
import json
import pathlib
import time

from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests/recipe/golden"
TOKENIZER = ROOT / "recipe/data/deepseek-v4/tokenizer.json.gz"


def varint(n, out):
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def main():
    with gzip.open(TOKENIZER, "rt", encoding="utf-8") as f:
        spec = json.load(f)
    trusted = Tokenizer.from_str(json.dumps(spec))
    plain = Tokenizer.from_str(json.dumps(spec))
    plain.encode_special_tokens = True
    stripped = dict(spec, added_tokens=[])
    raw = Tokenizer.from_str(json.dumps(stripped))
    with gzip.open(GOLDEN / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    nbytes = sum(len(s.encode()) for s in corpus)
    raw_ids = None
    for name, tok in [("raw", raw), ("plain", plain), ("trusted", trusted)]:
        t0 = time.perf_counter()
        encs = [tok.encode(s).ids for s in corpus]
        dt = time.perf_counter() - t0
        out = bytearray()
        ntok = 0
        bad_roundtrip = 0
        for r, ids in enumerate(encs):
            ntok += len(ids)
            if raw_ids is not None and raw_ids[r] == ids:
                varint(0, out)
                continue
            varint(len(ids) + (raw_ids is not None), out)
            for i in ids:
                varint(i, out)
        if raw_ids is None:
            raw_ids = encs
        for s, ids in list(zip(corpus, encs))[:2000]:
            if trusted.decode(ids, skip_special_tokens=False) != s:
                bad_roundtrip += 1
        with gzip.GzipFile(GOLDEN / f"ids.{name}.bin.gz", "wb", compresslevel=9, mtime=0) as f:
            f.write(bytes(out))
        print(f"{name}: {len(corpus)} records, {ntok} tokens, HF {nbytes / dt / 1e6:.2f} MB/s single "
              f"call per record; decode round-trip mismatches in first 2000: {bad_roundtrip}")
    n = max(a["id"] for a in spec["added_tokens"]) + 1
    with gzip.GzipFile(GOLDEN / "decode_each.jsonl.gz", "wb", compresslevel=9, mtime=0) as f:
        for i in range(n):
            f.write(json.dumps(trusted.decode([i], skip_special_tokens=False), ensure_ascii=False).encode() + b"\n")

if __name__ == "__main__":
    main()
