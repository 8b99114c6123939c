#!/usr/bin/env python3
"""Golden non-streaming response objects of the three protocols, from deepseek_recipe 0.2.0.

Each case is a request and what the model generated, given as parts (reasoning, content, tool
calls, the backend's finish reason). The script writes the model's raw output (the reasoning,
`</think>`, the content and a DSML tool-call block), tokenizes it with our shipped V4 tokenizer,
feeds the ids through the reference's `StreamProcessor` with the protocol's chunk generator and
accumulates the events into its `ChatCompletionResponse` / `ResponsesResponse` /
`MessagesResponse`. Recorded: the request, the parts, the values the reference's stream parser
decided that the C++ renderer takes as inputs (tool-call ids and argument text, the token
counts, `created_at` of Responses), the reference's response object (`reference`) and
`expected`: the same with the fields the official OpenAI spec requires or forbids put right
(spec_fixed). Chat Completions and Responses objects are validated against the official schemas
(tests/recipe/fixtures/openai/create_chat_completion_response.schema.json, response.schema.json)
with Python `jsonschema`: `reference_schema_valid` (the reference's object; false for every one)
and `schema_valid` (`expected`).

  tools/.venv-recipe/bin/python tools/result_golden.py  # writes tests/recipe/golden/results.v4.jsonl.gz
"""
import gzip, json, pathlib, tempfile

import deepseek_recipe as dr

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOK_GZ = ROOT / "recipe/data/deepseek-v4/tokenizer.json.gz"
OUT = ROOT / "tests/recipe/golden/results.v4.jsonl.gz"
FIXTURES = ROOT / "tests/recipe/fixtures/openai"
MODEL = "DeepSeek-V4-Pro"
ID, CREATED, PROMPT, CACHED = "resp_7f3a", 1700000000, 1234, 512
FIN = {"stop": dr.InferenceFinishReason.Stop, "length": dr.InferenceFinishReason.Length,
       "content_filter": dr.InferenceFinishReason.ContentFilter}
OFF = {"type": "disabled"}

W_CHAT = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}}}
W_RESP = {"type": "function", "name": "get_weather", "strict": False, "parameters": W_CHAT["function"]["parameters"]}
W_MSG = {"name": "get_weather", "input_schema": W_CHAT["function"]["parameters"]}


def chat(**kw): return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **kw}
def resp(**kw): return {"model": MODEL, "input": "Hi", **kw}
def msgs(**kw): return {"model": MODEL, "max_tokens": 256, "messages": [{"role": "user", "content": "Hi"}], **kw}
def G(content="", reasoning=None, calls=(), finish="stop", stop=None):
    """What the model generated; `stop`: a stop sequence it wrote after the content (not part of it)."""
    return {"content": content, "reasoning": reasoning, "calls": [{"name": n, "arguments": a} for n, a in calls], "finish": finish,
            "stop": stop}


PARIS = ("get_weather", {"city": "Paris", "days": 3})
ROME = ("get_weather", {"city": "Rome 罗马"})
GENS = {
    "text": G("Hello there!"),
    "think": G("Hello there!", reasoning="The user greets me."),
    "think_empty_reasoning": G("Hi!", reasoning=""),
    "length": G("Hello th", finish="length"),
    "length_in_reasoning": G(None, reasoning="Let me think about", finish="length"),
    "content_filter": G("Hello", finish="content_filter"),
    "unicode": G("naïve 中文 👨‍👩‍👧 \"quoted\" \\ back", reasoning="思考"),
}
TOOL_GENS = {
    "tool_call": G("", reasoning="Need the weather.", calls=[PARIS]),
    "tool_call_with_text": G("Let me check.", reasoning="r", calls=[PARIS]),
    "tool_calls_parallel": G("", reasoning="two cities", calls=[PARIS, ROME]),
    "tool_call_length": G("", reasoning="x", calls=[PARIS], finish="length"),
}
TOOL_GENS_CHAT = {k + "_chat_mode": {**v, "reasoning": None} for k, v in TOOL_GENS.items() if k != "tool_call_length"}

CASES = []
for proto, base, tools in (("chat_completions", chat, {"tools": [W_CHAT]}), ("responses", resp, {"tools": [W_RESP]}),
                           ("messages", msgs, {"tools": [W_MSG]})):
    off = {"reasoning": {"effort": "none"}} if proto == "responses" else {"thinking": OFF}
    for name, g in GENS.items():
        thinking = g["reasoning"] is not None
        CASES.append((proto, name, base(**({} if thinking else off)), g))
    for name, g in TOOL_GENS.items():
        CASES.append((proto, name, base(**tools), g))
    for name, g in TOOL_GENS_CHAT.items():
        CASES.append((proto, name, base(**tools, **off), g))
CASES += [
    ("chat_completions", "echo_fields", chat(temperature=0.5, top_p=0.9, max_tokens=99, seed=3), GENS["think"]),
    ("responses", "echo_fields", resp(instructions="Be brief.", max_output_tokens=99, temperature=0.5, top_p=0.9, top_logprobs=2,
                                      user="u1", metadata={"k": "v"}, store=True, parallel_tool_calls=False, previous_response_id="resp_0",
                                      reasoning={"effort": "low", "summary": "auto"}), GENS["think"]),
    ("responses", "echo_text_format", resp(text={"format": {"type": "json_schema", "name": "city", "description": "A city.", "strict": True,
                                                            "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}},
                                           reasoning={"effort": "none"}), G('{"name": "Paris"}')),
    ("responses", "echo_tools_choice", resp(tools=[W_RESP, {"type": "function", "name": "noop", "description": "Nothing.", "strict": True,
                                                            "parameters": {"type": "object", "properties": {}}}],
                                            tool_choice={"type": "function", "name": "get_weather"}, reasoning={"effort": "none"}),
     G("", calls=[PARIS])),
    ("messages", "stop_sequence", msgs(stop_sequences=["END"], thinking=OFF), G("Hello ", stop="END")),
    ("messages", "stop_sequence_think", msgs(stop_sequences=["##"]), G("Answer: 4 ", reasoning="2+2", stop="##")),
]


def spec_fixed(proto, obj, request):
    """The reference's object with the fields the official spec requires or forbids put right
    (docs/recipe.md lists them), and `parallel_tool_calls` as the request set it (troupe enforces
    it; the reference always reports true): what our renderer writes."""
    obj = json.loads(json.dumps(obj))
    if proto == "chat_completions":
        for c in obj["choices"]:
            c["message"].setdefault("refusal", None)
        if obj.get("system_fingerprint") is None: obj.pop("system_fingerprint", None)
    elif proto == "responses":
        if obj.get("user") is None: obj.pop("user", None)
        obj["usage"]["input_tokens_details"].setdefault("cache_write_tokens", 0)
        obj["parallel_tool_calls"] = request.get("parallel_tool_calls", True)
    return obj


def raw_text(g, thinking):
    out = ""
    if thinking: out += (g["reasoning"] or "") + ("</think>" if g["content"] is not None else "")
    out += g["content"] or ""
    if g["stop"]: return out + g["stop"] + " and more"
    if g["calls"]:
        out += "\n\n<｜DSML｜tool_calls>\n"
        for c in g["calls"]:
            out += f'<｜DSML｜invoke name="{c["name"]}">\n'
            for k, v in c["arguments"].items():
                s = isinstance(v, str)
                out += f'<｜DSML｜parameter name="{k}" string="{"true" if s else "false"}">{v if s else json.dumps(v)}</｜DSML｜parameter>\n'
            out += "</｜DSML｜invoke>\n"
        out += "</｜DSML｜tool_calls>"
    return out


def main():
    import jsonschema
    validators = {p: jsonschema.Draft202012Validator(json.loads((FIXTURES / f"{f}.schema.json").read_text()))
                  for p, f in (("chat_completions", "create_chat_completion_response"), ("responses", "response"))}
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "tokenizer.json"
        path.write_bytes(gzip.decompress(TOK_GZ.read_bytes()))
        tok = dr.Tokenizer.from_file(str(path))
    lines, invalid = [], []
    for proto, name, request, g in CASES:
        cls = {"chat_completions": dr.ChatCompletionRequest, "responses": dr.ResponsesRequest, "messages": dr.MessagesRequest}[proto]
        req = cls(json.loads(json.dumps(request)))
        echo = req.echo() if proto == "responses" else None
        cr = req.convert(dr.ConversionOptions())
        thinking = cr.conversation.thinking_mode
        if proto == "messages":
            gen, resp_cls = dr.MessagesChunkGenerator(ID, MODEL, thinking), dr.MessagesResponse
        else:
            gen = cls.chunk_generator(cr, ID, MODEL)
            if echo is not None: gen = gen.with_echo(echo)
            resp_cls = dr.ResponsesResponse if proto == "responses" else dr.ChatCompletionResponse
        text = raw_text(g, thinking)
        ids = tok.encode(text)
        sp = dr.StreamProcessor(gen, cr.parsing_options, tok)
        events = sp.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=PROMPT, prompt_cache_hit_tokens=CACHED)))
        events += sp.push(dr.InferenceChunk.tokens(ids))
        if not sp.finished: events += sp.push(dr.InferenceChunk.finish(FIN[g["finish"]]))
        events += sp.finish()
        out = resp_cls(ID, MODEL, CREATED, PROMPT, CACHED)
        for e in events: out.accumulate(e)
        obj = json.loads(out.to_json())
        # What the reference's stream parser decided: inputs of the C++ renderer.
        if proto == "chat_completions":
            calls = [(c["id"], c["function"]["arguments"]) for c in obj["choices"][0]["message"].get("tool_calls") or []]
        elif proto == "responses":
            calls = [(o["call_id"], o["arguments"]) for o in obj["output"] if o["type"] == "function_call"]
        else:
            calls = [(b["id"], json.dumps(b["input"], ensure_ascii=False)) for b in obj["content"] if b["type"] == "tool_use"]
        reasoning_tokens = len(tok.encode(g["reasoning"] or "")) if thinking else 0
        generation = {"content": g["content"] or "", "reasoning": g["reasoning"] if thinking else None,
                      "tool_calls": [{"id": i, "name": c["name"], "arguments": a} for (i, a), c in zip(calls, g["calls"])],
                      "finish": g["finish"], "completion_tokens": len(ids), "reasoning_tokens": reasoning_tokens,
                      "stop_sequence": g["stop"]}
        rec = {"protocol": proto, "name": name, "request": request, "raw_output": text, "generation": generation,
               "meta": {"id": ID, "model": MODEL, "created": obj.get("created_at", CREATED), "prompt_tokens": PROMPT,
                        "cached_tokens": CACHED},
               "reference": obj, "expected": spec_fixed(proto, obj, request)}
        if proto in validators:
            rec["reference_schema_valid"] = validators[proto].is_valid(obj)
            rec["schema_valid"] = validators[proto].is_valid(rec["expected"])
            if not rec["schema_valid"]: invalid.append(f"{proto}/{name}")
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    OUT.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    print(f"{len(CASES)} response objects -> {OUT.relative_to(ROOT)} (deepseek_recipe {dr.__version__}); schema-invalid: {invalid}")


if __name__ == "__main__":
    main()
