#!/usr/bin/env python3
"""Golden stream-event logs of the Responses and Messages protocols, from deepseek_recipe 0.2.0.

The generated outputs are those of tools/stream_golden.py (its CASES), each request rewritten into
the protocol's own shape (thinking, tools, tool_choice, stop sequences; Responses has no stop and
no prefix continuation, so those cases are left out there; Messages takes its prefix from a
final assistant message and has no `tool_choice` that opens the tool-call block, so the two
`required` cases are left out there). The reference's StreamProcessor (oracle) is fed the ids one per chunk,
as in stream_golden.py; each record stores its events (SSE event name, JSON object) with the
response id fixed and `created_at` / `completed_at` set to 0 and tool-call ids normalized to
`call_NN_X`.

Responses records also store `spec_events`: the reference's events with what the official OpenAI
spec requires put right (tests/recipe/fixtures/openai/response_stream_event.schema.json, the
spec's ResponseStreamEvent; each event validated against the schema of its type with Python
`jsonschema`, `spec_valid` records the result): a null `response.user` and a null
`response.usage` (created / in_progress) left out, `usage.input_tokens_details.cache_write_tokens`
(0) added, and `name` (the function's) added to `response.function_call_arguments.done`. These
are what troupe writes.

  tools/.venv-recipe/bin/python tools/stream_events_golden.py
  # writes tests/recipe/golden/stream_events.v4.jsonl.gz
"""
import gzip, json, pathlib, re, sys

import deepseek_recipe as dr
import tokenizers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from stream_golden import CASES, PROMPT_TOKENS, TOK_GZ, ROOT  # noqa: E402

OUT = ROOT / "tests/recipe/golden/stream_events.v4.jsonl.gz"
ID = "resp_test"
MODEL = "DeepSeek-V4-Pro"


def responses_body(chat):
    if "stop" in chat or len(chat["messages"]) != 1:
        return None  # no stop sequences, no prefix continuation in Responses
    b = {"model": MODEL, "input": chat["messages"][0]["content"], "stream": True,
         "reasoning": {"effort": "high" if chat["thinking"]["type"] == "enabled" else "none"}}
    if "tools" in chat:
        b["tools"] = [dict(type="function", **t["function"]) for t in chat["tools"]]
    tc = chat.get("tool_choice")
    if isinstance(tc, dict):
        b["tool_choice"] = {"type": "function", "name": tc["function"]["name"]}
    elif tc:
        b["tool_choice"] = tc
    return b


def messages_body(chat):
    if chat.get("tool_choice") == "required":
        # `any` converts like `auto` (the prompt opens no tool-call block), so the recorded
        # output, which starts inside the block, is not one this prompt leads to.
        return None
    b = {"model": MODEL, "max_tokens": 1000, "stream": True, "messages": [], 
         "thinking": {"type": chat["thinking"]["type"]}}
    if chat["thinking"]["type"] == "enabled":
        b["thinking"]["budget_tokens"] = 1024
    for m in chat["messages"]:
        if m["role"] == "user":
            b["messages"].append({"role": "user", "content": m["content"]})
        else:  # a prefix: the final assistant message is continued
            blocks = []
            if "reasoning_content" in m:
                blocks.append({"type": "thinking", "thinking": m["reasoning_content"], "signature": "s"})
            if m["content"]:
                blocks.append({"type": "text", "text": m["content"]})
            b["messages"].append({"role": "assistant", "content": blocks})
    if "tools" in chat:
        b["tools"] = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in chat["tools"]]
    tc = chat.get("tool_choice")
    if isinstance(tc, dict):
        b["tool_choice"] = {"type": "tool", "name": tc["function"]["name"]}
    if "stop" in chat:
        b["stop_sequences"] = chat["stop"]
    return b


def normalize(name, obj):
    s = json.dumps(obj, ensure_ascii=False)
    s = re.sub(r'"(call_\d+_)[A-Za-z0-9]+"', r'"\1X"', s)
    obj = json.loads(s)
    r = obj.get("response")
    if isinstance(r, dict):
        r["created_at"] = 0
        if r.get("completed_at") is not None:
            r["completed_at"] = 0
    return obj


SPEC = ROOT / "tests/recipe/fixtures/openai/response_stream_event.schema.json"


def spec_corrected(events):
    out, names = [], {}
    for name, e in events:
        e = json.loads(json.dumps(e))
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call":
            names[e["item"]["id"]] = e["item"]["name"]
        r = e.get("response")
        if isinstance(r, dict):
            if r.get("user", 0) is None:
                del r["user"]
            if r.get("usage", 0) is None:
                del r["usage"]
            elif isinstance(r.get("usage"), dict):
                d = r["usage"]["input_tokens_details"]
                r["usage"]["input_tokens_details"] = {"cached_tokens": d["cached_tokens"], "cache_write_tokens": 0}
        if e["type"] == "response.function_call_arguments.done":
            e = {k: v for k, v in e.items()}
            items = list(e.items())
            at = [k for k, _ in items].index("item_id") + 1
            items.insert(at, ("name", names[e["item_id"]]))
            e = dict(items)
        out.append([name, e])
    return out


def spec_validator():
    import jsonschema
    schema = json.loads(SPEC.read_text())
    defs = schema["$defs"]
    top = defs["ResponseStreamEvent"]
    by_type = {}
    for ref in top.get("anyOf", top.get("oneOf", [])):
        n = ref["$ref"].split("/")[-1]
        t = defs[n]["properties"]["type"]
        for v in t.get("enum", [t.get("const")]):
            by_type[v] = jsonschema.Draft202012Validator(dict(schema, **{"$ref": f"#/$defs/{n}"}))

    def errors(event):
        return [f"{event['type']}: {e.message[:200]}" for e in by_type[event["type"]].iter_errors(event)]
    return errors


def run(proto, body, ids, fin, tok):
    R = {"responses": dr.ResponsesRequest, "messages": dr.MessagesRequest}[proto]
    S = {"responses": dr.ResponsesResponse, "messages": dr.MessagesResponse}[proto]
    r = R(json.loads(json.dumps(body)))
    echo = r.echo() if proto == "responses" else None
    conv = r.convert(dr.ConversionOptions())
    po = conv.parsing_options
    g = R.chunk_generator(conv, ID, MODEL)
    if echo is not None:
        g = g.with_echo(echo)
    sp = dr.StreamProcessor(g, po, tok)
    out = sp.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=PROMPT_TOKENS)))
    for i in ids:
        if sp.finished:
            break
        out += sp.push(dr.InferenceChunk.tokens([i]))
    if not sp.finished:
        out += sp.push(dr.InferenceChunk.finish(fin))
    out += sp.finish()
    return [[S.sse_event_name(c), normalize(body, json.loads(c.to_json()))] for c in out]


def main():
    text = gzip.decompress(TOK_GZ.read_bytes()).decode()
    tok, hf = dr.Tokenizer.from_str(text), tokenizers.Tokenizer.from_str(text)
    finish = {"stop": dr.InferenceFinishReason.Stop, "length": dr.InferenceFinishReason.Length,
              "content_filter": dr.InferenceFinishReason.ContentFilter}
    lines, counts = [], {"responses": 0, "messages": 0}
    spec_errors, invalid = spec_validator(), 0
    for name, chat, generated, fin in CASES:
        ids = hf.encode(generated).ids
        for proto, make in (("responses", responses_body), ("messages", messages_body)):
            body = make(chat)
            if body is None:
                continue
            events = run(proto, body, ids, finish[fin], tok)
            counts[proto] += 1
            rec = {"name": name, "protocol": proto, "request": body, "generated": generated, "ids": ids,
                   "finish": fin, "prompt_tokens": PROMPT_TOKENS, "id": ID, "events": events}
            if proto == "responses":
                rec["spec_events"] = spec_corrected(events)
                errs = [m for _, e in rec["spec_events"] for m in spec_errors(e)]
                rec["spec_valid"] = not errs
                invalid += bool(errs)
                for m in errs[:3]:
                    print(f"  {name}: {m}")
            lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    OUT.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    print(f"{counts['responses']} Responses + {counts['messages']} Messages stream cases -> "
          f"{OUT.relative_to(ROOT)} (deepseek_recipe {dr.__version__}); Responses records whose "
          f"spec-corrected events fail the spec: {invalid}")


if __name__ == "__main__":
    main()
