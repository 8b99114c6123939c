#!/usr/bin/env python3
"""Copy one schema of the official OpenAI spec, with every schema it references, into a
standalone JSON Schema (2020-12) under tests/recipe/fixtures/openai/ (MIT, LICENSE copied beside).

  python3 tools/openai_schema_subset.py /path/to/openai-openapi CreateChatCompletionRequest create_chat_completion_request
"""
import json, pathlib, re, shutil, sys
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
src, name, out = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
spec = yaml.safe_load((src / "openapi.yaml").read_text())
schemas = spec["components"]["schemas"]
need, todo = {}, [name]
while todo:
    n = todo.pop()
    if n in need: continue
    need[n] = schemas[n]
    todo += re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(schemas[n]))
text = json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": f"#/$defs/{name}",
                   "$defs": dict(sorted(need.items()))}, indent=1, ensure_ascii=False)
text = text.replace("#/components/schemas/", "#/$defs/")
dst = ROOT / "tests/recipe/fixtures/openai"
dst.mkdir(parents=True, exist_ok=True)
(dst / f"{out}.schema.json").write_text(text + "\n")
shutil.copy(src / "LICENSE", dst / "LICENSE")
print(f"{name}: {len(need)} schemas -> {dst.relative_to(ROOT)}/{out}.schema.json")
