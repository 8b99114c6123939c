#!/usr/bin/env python3
"""Generates the tokenizer parity corpus: tests/recipe/golden/corpus.jsonl.gz.

One JSON string per line (UTF-8, ensure_ascii=False). Deterministic for a given seed and
repository content: real text comes from this repository's own files (docs, C++ and Python code,
TOML, JSON), the rest is generated: English-like and Chinese prose, JSON, emoji and ZWJ
sequences, combining marks, RTL scripts, whitespace and digit runs of every kind, every added
token string (alone, glued together, cut in half), every code point whose class changed between
Unicode 15.0 and 16.0 (in context), and random code points from the whole of Unicode (fuzz).
Standard library only.

    tools/.venv-tokenizer/bin/python tools/tokenizer_corpus.py [--mb 3] [--seed 6]
"""
import argparse
import gzip
import json
import pathlib
import random

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "recipe/data/deepseek-v4/tokenizer.json.gz"
OUT = ROOT / "tests/recipe/golden/corpus.jsonl.gz"

WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there would their we him been has when who will "
         "more no if out so said what up its about into than them can only other new some could "
         "time these two may then do first any my now such like our over man me even most made "
         "after also did many before must through back years where much your way well down should "
         "because each just those people Mr how too little state good very make world still own "
         "see men work long get here between both life being under never day same another know "
         "while last might us great old year off come since against go came right used take "
         "serving tokenizer actor cluster prefill decode expert cache KV GPU DeepSeek isn't "
         "don't we'll they're I'm O'Neil e.g. i.e. U.S.A. naïve café résumé façade Zürich").split()
HAN = [chr(c) for c in range(0x4E00, 0x9FFF)] + [chr(c) for c in range(0x3400, 0x3500)]
HAN_COMMON = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴"
KANA = [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x30A1, 0x30FB)]
HANGUL = [chr(c) for c in range(0xAC00, 0xAC00 + 2000)]
ARABIC = [chr(c) for c in range(0x0621, 0x064B)]
ARABIC_MARKS = [chr(c) for c in range(0x064B, 0x0653)]
HEBREW = [chr(c) for c in range(0x05D0, 0x05EB)]
HEBREW_MARKS = [chr(c) for c in range(0x05B0, 0x05BD)]
DEVANAGARI = [chr(c) for c in range(0x0915, 0x0939)] + [chr(c) for c in range(0x093E, 0x094E)]
THAI = [chr(c) for c in range(0x0E01, 0x0E3A)] + [chr(c) for c in range(0x0E40, 0x0E4F)]
CYRILLIC = [chr(c) for c in range(0x0410, 0x0450)]
GREEK = [chr(c) for c in range(0x0391, 0x03CA) if c != 0x03A2]
COMBINING = [chr(c) for c in range(0x0300, 0x0370)] + [chr(0x20DD), chr(0x20E3), chr(0xFE0F), chr(0xFE0E)]
EMOJI = [chr(c) for c in list(range(0x1F600, 0x1F650)) + list(range(0x1F300, 0x1F400)) +
         list(range(0x1F900, 0x1F9FF)) + list(range(0x2600, 0x2700))]
SKIN = [chr(c) for c in range(0x1F3FB, 0x1F400)]
ZWJ_SEQS = ["👨‍👩‍👧‍👦", "👩‍❤️‍💋‍👨", "🏳️‍🌈", "🧑🏽‍💻", "👁️‍🗨️", "❤️‍🔥", "🐻‍❄️", "👨🏿‍🦰", "1️⃣", "#️⃣", "🇨🇳🇺🇸🇯🇵🇫🇷", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
SPACES = [" ", "  ", "    ", "\t", "\n", "\r\n", "\r", "\n\n", "\u3000", "\u00a0", "\u2028", "\u2029",
          "\x0b", "\x0c", "\x85", "\u2003", "\u200b", "\u202f", "\u205f", "\u1680", " \n ", "\t\n\t"]
DIGITS = "0123456789" + "٠١٢٣٤٥٦٧٨٩" + "０１２３４５６７８９" + "²³¹¼½¾" + "ⅠⅡⅢⅣⅫ" + "①②③" + "०१२३" + "𝟎𝟏𝟐" + "〇"
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + list("，。！？；：「」『』（）《》、…—·“”‘’【】〔〕¡¿«»‹›§¶†‡•‰′″€£¥¢©®™°±×÷≠≤≥∞√∑∫←→↑↓")
ASCII_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# The 5,812 code points whose pre-tokenizer class (general category L, M, N, P, S, Z or none)
# differs between Unicode 15.0 (the ICU troupe used before) and 16.0 (HF tokenizers 0.23.3):
# computed once with PyPI unicodedata2 15.0.0 and 16.0.0, first and last of each run.
UNICODE_16_CHANGES = [
    (0x897, 0x897), (0x1B4E, 0x1B4F), (0x1B7F, 0x1B7F), (0x1C89, 0x1C8A), (0x2427, 0x2429), (0x2FFC, 0x2FFF),
    (0x31E4, 0x31E5), (0x31EF, 0x31EF), (0xA7CB, 0xA7CD), (0xA7DA, 0xA7DC), (0x105C0, 0x105F3), (0x10D40, 0x10D65),
    (0x10D69, 0x10D85), (0x10D8E, 0x10D8F), (0x10EC2, 0x10EC4), (0x10EFC, 0x10EFC), (0x11380, 0x11389),
    (0x1138B, 0x1138B), (0x1138E, 0x1138E), (0x11390, 0x113B5), (0x113B7, 0x113C0), (0x113C2, 0x113C2),
    (0x113C5, 0x113C5), (0x113C7, 0x113CA), (0x113CC, 0x113D5), (0x113D7, 0x113D8), (0x113E1, 0x113E2),
    (0x116D0, 0x116E3), (0x11BC0, 0x11BE1), (0x11BF0, 0x11BF9), (0x11F5A, 0x11F5A), (0x13460, 0x143FA),
    (0x16100, 0x16139), (0x16D40, 0x16D79), (0x18CFF, 0x18CFF), (0x1CC00, 0x1CCF9), (0x1CD00, 0x1CEB3),
    (0x1E5D0, 0x1E5FA), (0x1E5FF, 0x1E5FF), (0x1F8B2, 0x1F8BB), (0x1F8C0, 0x1F8C1), (0x1FA89, 0x1FA89),
    (0x1FA8F, 0x1FA8F), (0x1FABE, 0x1FABE), (0x1FAC6, 0x1FAC6), (0x1FADC, 0x1FADC), (0x1FADF, 0x1FADF),
    (0x1FAE9, 0x1FAE9), (0x1FBCB, 0x1FBEF), (0x2EBF0, 0x2EE5D),
]


def added_tokens():
    with gzip.open(TOKENIZER, "rt", encoding="utf-8") as f:
        return [a["content"] for a in json.load(f)["added_tokens"]]


def english(r, n):
    out = []
    for _ in range(n):
        w = r.choice(WORDS)
        if r.random() < 0.08:
            w = w.capitalize()
        out.append(w)
        x = r.random()
        if x < 0.07:
            out.append(r.choice([",", ".", ";", ":", "!", "?", " —", "..."]))
        elif x < 0.09:
            out.append(" " + str(r.randint(0, 10 ** r.randint(1, 9))))
        out.append(" " if r.random() < 0.95 else r.choice(SPACES))
    return "".join(out)


def chinese(r, n):
    out = []
    for _ in range(n):
        x = r.random()
        if x < 0.75:
            out.append(r.choice(HAN_COMMON) if r.random() < 0.9 else r.choice(HAN))
        elif x < 0.87:
            out.append(r.choice("，。、！？；：「」（）《》“”…"))
        elif x < 0.93:
            out.append(r.choice(WORDS) if r.random() < 0.5 else str(r.randint(0, 99999)))
        elif x < 0.97:
            out.append(r.choice(KANA))
        else:
            out.append(r.choice(SPACES))
    return "".join(out)


def script_text(r, letters, marks, n):
    out = []
    for _ in range(n):
        out.append(r.choice(letters))
        if marks and r.random() < 0.3:
            out.append(r.choice(marks))
        if r.random() < 0.15:
            out.append(r.choice([" ", " ", "، ", ". ", "\n", "؟", "־", " 123 "]))
    return "".join(out)


def json_blob(r, depth=0):
    def value(d):
        x = r.random()
        if d > 3 or x < 0.3:
            return r.choice([r.randint(-10 ** 12, 10 ** 12), r.random() * 10 ** r.randint(-5, 8), True, False, None,
                             english(r, r.randint(0, 8)).strip(), chinese(r, r.randint(0, 10))])
        if x < 0.65:
            return {r.choice(WORDS) + ("_" + r.choice(WORDS) if r.random() < 0.4 else ""): value(d + 1)
                    for _ in range(r.randint(0, 6))}
        return [value(d + 1) for _ in range(r.randint(0, 6))]
    return json.dumps(value(depth), ensure_ascii=r.random() < 0.2, indent=r.choice([None, 2, 4, "\t"]))


def emoji_text(r, n):
    out = []
    for _ in range(n):
        x = r.random()
        if x < 0.4:
            out.append(r.choice(EMOJI))
            if r.random() < 0.2:
                out.append(r.choice(SKIN))
        elif x < 0.55:
            out.append(r.choice(ZWJ_SEQS))
        elif x < 0.65:
            out.append(r.choice(EMOJI) + "\u200d" + r.choice(EMOJI))
        elif x < 0.85:
            out.append(r.choice(WORDS))
        else:
            out.append(r.choice(SPACES + PUNCT))
    return "".join(out)


def combining_text(r, n):
    out = []
    for _ in range(n):
        x = r.random()
        if x < 0.5:
            out.append(r.choice(ASCII_LETTERS + "aeiouαβγжщ中あ1 2.!"))
        elif x < 0.6:
            out.append(r.choice(DEVANAGARI + THAI))
        else:
            out.append(r.choice(COMBINING))
        if r.random() < 0.1:
            out.append(r.choice(SPACES))
    return "".join(out)


def whitespace_digits(r, n):
    out = []
    for _ in range(n):
        x = r.random()
        if x < 0.3:
            out.append(r.choice(SPACES) * r.randint(1, 40))
        elif x < 0.55:
            out.append("".join(r.choice("0123456789") for _ in range(r.randint(1, 60))))
        elif x < 0.7:
            out.append("".join(r.choice(DIGITS) for _ in range(r.randint(1, 12))))
        elif x < 0.85:
            out.append(r.choice(WORDS))
        else:
            out.append(r.choice(PUNCT) * r.randint(1, 6))
    return "".join(out)


def punct_mix(r, n):
    pool = PUNCT + list(ASCII_LETTERS) + SPACES + list("0123456789") + ["\n", "\r\n", "'s", "'t", "``", "://"]
    return "".join(r.choice(pool) for _ in range(n))


def fuzz(r, n):
    out = []
    for _ in range(n):
        x = r.random()
        if x < 0.5:
            c = r.randint(0, 0x2FFFF)
        elif x < 0.6:
            c = r.randint(0, 0x10FFFF)
        else:
            c = r.randint(0, 0x3000)
        if 0xD800 <= c <= 0xDFFF:
            c = 0xFFFD
        out.append(chr(c))
    return "".join(out)


def specials(r, toks, n):
    out = []
    for _ in range(n):
        x = r.random()
        if x < 0.35:
            out.append(r.choice(toks))
        elif x < 0.45:
            t = r.choice(toks)
            out.append(t[: r.randint(1, max(1, len(t) - 1))])
        elif x < 0.55:
            out.append(r.choice(toks) + r.choice(toks))
        elif x < 0.8:
            out.append(english(r, r.randint(1, 6)))
        else:
            out.append(r.choice(SPACES + PUNCT + ["<", "<｜", "｜>", "▁", "<|", "|>"]))
    return "".join(out)


def unicode_16(chunk=32):
    """Each changed code point after a space, a letter and punctuation, before a digit and a
    newline, as a Unicode 15.0 tokenizer would split them differently; 32 code points a record."""
    cps = [c for first, last in UNICODE_16_CHANGES for c in range(first, last + 1)]
    records = ["I feel \U0001FAE9", "I feel \U0001FAE9\U0001FAE9 today", " \u2FFC\u2FFD\u2FFE\u2FFF"]
    for i in range(0, len(cps), chunk):
        records.append("".join(f" {chr(c)}a{chr(c)}.{chr(c)}1{chr(c)}\n" for c in cps[i:i + chunk]))
    return records


def repo_files():
    exts = {".md", ".cpp", ".hpp", ".txt", ".toml", ".py", ".cmake", ".sh", ".json", ".capnp", ".jsonl"}
    files = []
    for p in sorted(ROOT.rglob("*")):
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith(("build", "tools/.venv", ".git", "tests/recipe/golden")) or "/." in rel:
            continue
        if p.is_file() and p.suffix in exts and p.stat().st_size < 400_000:
            try:
                files.append(p.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                pass
    return files


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    r = random.Random(a.seed)
    toks = added_tokens()
    records = []
    # Every added token alone, and each glued to text on both sides.
    records += toks
    records += [f"x{t}y" for t in toks]
    records += ["", " ", "\n", "a", "  a", "\r\n\r\n", " \u3000 ", "12345678901234567890"]
    records += unicode_16()
    # Real files of this repository, cut in pieces of varied size.
    for text in repo_files():
        i = 0
        while i < len(text):
            k = r.choice([64, 256, 1024, 4096])
            records.append(text[i:i + k])
            i += k
    gens = [
        (0.22, lambda: english(r, r.randint(1, 400))),
        (0.16, lambda: chinese(r, r.randint(1, 600))),
        (0.08, lambda: json_blob(r)),
        (0.07, lambda: emoji_text(r, r.randint(1, 120))),
        (0.06, lambda: combining_text(r, r.randint(1, 200))),
        (0.05, lambda: script_text(r, r.choice([ARABIC, HEBREW]), r.choice([ARABIC_MARKS, HEBREW_MARKS, []]), r.randint(1, 300))),
        (0.04, lambda: script_text(r, r.choice([CYRILLIC, GREEK, HANGUL, DEVANAGARI, THAI]), [], r.randint(1, 300))),
        (0.09, lambda: whitespace_digits(r, r.randint(1, 100))),
        (0.08, lambda: punct_mix(r, r.randint(1, 400))),
        (0.07, lambda: fuzz(r, r.randint(1, 300))),
        (0.08, lambda: specials(r, toks, r.randint(1, 40))),
    ]
    weights = [w for w, _ in gens]
    target = int(a.mb * 1_000_000)
    size = sum(len(s.encode()) for s in records)
    while size < target:
        s = r.choices(gens, weights)[0][1]()
        if r.random() < 0.1:  # mix two kinds in one record
            s += r.choices(gens, weights)[0][1]()
        records.append(s)
        size += len(s.encode())
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(out, "wb", compresslevel=9, mtime=0) as f:
        for s in records:
            f.write(json.dumps(s, ensure_ascii=False).encode() + b"\n")
    print(f"{out}: {len(records)} records, {size / 1e6:.2f} MB of text")


if __name__ == "__main__":
    main()
