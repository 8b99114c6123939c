#!/usr/bin/env python3
"""Golden DeepSeek-V4.1 image token counts from deepseek_recipe 0.2.0 (PyPI, MIT).

For each image size (seeded random sizes over several scales, plus edge sizes), the reference's
token count: `MultiModalData([ImageInfo(b"", w, h)]).image_token_adjustment() + 1`, or `null` when
it raises CalcResizeError. One JSON line per size: [width, height, tokens].

  tools/.venv-recipe/bin/python tools/image_golden.py  # writes tests/recipe/golden/image_tokens.v41.jsonl.gz
"""
import gzip, json, pathlib, random

import deepseek_recipe as dr

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/recipe/golden/image_tokens.v41.jsonl.gz"


def tokens(w, h):
    try:
        return dr.MultiModalData([dr.ImageInfo(b"", w, h)]).image_token_adjustment() + 1
    except dr.CalcResizeError:
        return None


def main():
    rng = random.Random(20261129)
    sizes = [(w, h) for w in (1, 2, 13, 14, 15, 41, 42, 43, 543, 544, 545, 1302, 1303, 4096, 50000)
             for h in (1, 2, 14, 42, 544, 1302, 30000)]
    sizes += [(640, 480), (800, 600), (1024, 768), (1280, 720), (1920, 1080), (1080, 1920), (3024, 4032), (2048, 2048)]
    scales = [(1, 100), (100, 1000), (1000, 5000), (1, 20000)]
    for _ in range(5000):
        a, b = rng.choice(scales), rng.choice(scales)
        sizes.append((rng.randint(*a), rng.randint(*b)))
    lines = [json.dumps([w, h, tokens(w, h)]) for w, h in sizes]
    OUT.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    fails = sum(line.endswith("null]") for line in lines)
    print(f"{len(sizes)} image sizes -> {OUT.relative_to(ROOT)} (deepseek_recipe {dr.__version__}); {fails} not fitted")


if __name__ == "__main__":
    main()
