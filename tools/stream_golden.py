#!/usr/bin/env python3
"""Golden stream-event logs for recipe/stream_parser.cpp, from deepseek_recipe 0.2.0 (PyPI, MIT).

Each record: a Chat Completions request (it sets thinking mode, tools and tool_choice, which decide
where the parser starts and whether it parses tool calls), the generated text, its ids (HF
`tokenizers` encode with the shipped V4 tokenizer, added tokens matched: the markers are the
control ids a model emits), the backend finish reason, and what the reference's StreamProcessor
emits when the ids are pushed one per chunk:
  `chunks`: its chat.completion.chunk objects (id, created and tool-call ids normalized);
  `events`: the same mapped to troupe's neutral events, adjacent deltas of one kind merged:
      ["reasoning", s] ["text", s] ["tool_call", index, name] ["arguments", index, s]
      ["finish", reason] ["usage", prompt_tokens, completion_tokens, reasoning_tokens | null]

  tools/.venv-recipe/bin/python tools/stream_golden.py   # writes tests/recipe/golden/stream.v4.jsonl.gz
"""
import gzip, json, pathlib, re

import deepseek_recipe as dr
import tokenizers

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOK_GZ = ROOT / "recipe/data/deepseek-v4/tokenizer.json.gz"
OUT = ROOT / "tests/recipe/golden/stream.v4.jsonl.gz"
PROMPT_TOKENS = 37

W = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
S = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def req(thinking=False, tools=False, tool_choice=None, usage=False, stop=None):
    r = {"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "hi"}], "stream": True,
         "thinking": {"type": "enabled" if thinking else "disabled"}}
    if stop: r["stop"] = stop
    if tools: r["tools"] = [W, S]
    if tool_choice: r["tool_choice"] = tool_choice
    if usage: r["stream_options"] = {"include_usage": True}
    return r


def call(name, *params):
    out = f'<｜DSML｜invoke name="{name}">\n'
    for k, v, is_str in params:
        out += f'<｜DSML｜parameter name="{k}" string="{"true" if is_str else "false"}">{v}</｜DSML｜parameter>\n'
    return out + "</｜DSML｜invoke>\n"


def block(*calls):
    return "<｜DSML｜tool_calls>\n" + "".join(calls) + "</｜DSML｜tool_calls>"


PARIS = call("get_weather", ("city", "Paris", True), ("days", "3", False))
CASES = [
    # plain content
    ("chat.hello", req(), "Hello, world!", "stop"),
    ("chat.usage", req(usage=True), "Hello there.", "stop"),
    ("chat.leading_newlines", req(), "\n\nHello\n\n  ", "stop"),
    ("chat.unicode", req(), "naïve café 中文字 👨‍👩‍👧 مرحبا ✓", "stop"),
    ("chat.html_like", req(), "Use <b>bold</b> and a < b > c, 1<2.", "stop"),
    ("chat.length", req(), "This reply is cut", "length"),
    ("chat.content_filter", req(), "Some text", "content_filter"),
    ("chat.empty", req(), "", "stop"),
    ("chat.newlines_only", req(), "\n\n\n", "stop"),
    ("chat.tools_no_call", req(tools=True), "It is sunny\n\n", "stop"),
    ("chat.tools_lt_text", req(tools=True), "a <\n< b\n\n<x", "stop"),
    # thinking
    ("think.basic", req(thinking=True, usage=True), "Let me think.</think>The answer is 4.", "stop"),
    ("think.newlines", req(thinking=True, usage=True), "\n\nreason  \n\n</think>\n\nHello\n\n", "stop"),
    ("think.spaces", req(thinking=True, usage=True), " \n reason \n a\n\n</think>\n\n \nHello", "stop"),
    ("think.begin_end_one_token_run", req(thinking=True, usage=True), "</think>answer", "stop"),
    ("think.no_end", req(thinking=True, usage=True), "still thinking about it", "length"),
    ("think.unicode", req(thinking=True, usage=True), "思考中…🤔</think>答案：四", "stop"),
    ("think.trailing_newline_end", req(thinking=True, usage=True), "r\n\n", "length"),
    ("think.empty", req(thinking=True, usage=True), "", "stop"),
    ("think.only_end", req(thinking=True, usage=True), "</think>", "stop"),
    # tool calls
    ("tools.one_call", req(tools=True), "Let me check.\n\n" + block(PARIS), "stop"),
    ("tools.call_only", req(tools=True), block(PARIS), "stop"),
    ("tools.two_calls", req(tools=True), block(PARIS, call("search", ("query", "weather in Paris", True))), "stop"),
    ("tools.three_calls", req(tools=True), "x" + block(PARIS, call("search"), call("get_weather", ("city", "Rome", True))), "stop"),
    ("tools.no_params", req(tools=True), block(call("search")), "stop"),
    ("tools.json_values", req(tools=True), block(call("search", ("q", '{"a": [1, 2.5, null], "b": "x"}', False),
                                                      ("flag", "true", False), ("n", "-12", False))), "stop"),
    ("tools.escapes", req(tools=True), block(call("search", ("query", 'say "hi"\\ \n\ttab/é😀 \u0001', True))), "stop"),
    ("tools.value_with_lt", req(tools=True), block(call("search", ("query", "a<b </x> <", True))), "stop"),
    ("tools.empty_list", req(tools=True), "Nothing to call.\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>", "stop"),
    ("tools.text_after_block", req(tools=True), block(PARIS) + "\n\ntrailing words", "stop"),
    ("tools.stop_in_value", req(tools=True), '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
                                              '<｜DSML｜parameter name="city" string="true">Pa"r\\is\n', "stop"),
    ("tools.stop_after_invoke_open", req(tools=True), '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="search">\n', "length"),
    ("tools.stop_between_params", req(tools=True), '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="search">\n'
                                                   '<｜DSML｜parameter name="q" string="false">7</｜DSML｜parameter>\n', "length"),
    ("tools.complete_then_length", req(tools=True), block(PARIS), "length"),
    ("tools.think_then_call", req(thinking=True, tools=True, usage=True), "I need the weather.</think>\n\n" + block(PARIS), "stop"),
    ("tools.think_then_empty_list", req(thinking=True, tools=True, usage=True),
     "\n\nreason\n\n</think>\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>", "stop"),
    ("tools.required", req(tools=True, tool_choice="required"), call("get_weather", ("city", "Oslo", True)) + "</｜DSML｜tool_calls>", "stop"),
    ("tools.required_two", req(tools=True, tool_choice="required"), PARIS + call("search") + "</｜DSML｜tool_calls>", "stop"),
    ("tools.named", req(tools=True, tool_choice={"type": "function", "function": {"name": "search"}}),
     call("search", ("query", "x", True)) + "</｜DSML｜tool_calls>", "stop"),
    ("tools.unicode_name_value", req(tools=True), block(call("get_weather", ("city", "東京 🗼", True))), "stop"),
    # prefix continuation (the last assistant message is continued)
    ("prefix.chat", dict(req(), messages=[{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "Roses are", "prefix": True}]),
     "\n red,\nviolets", "stop"),
    ("prefix.think_content", dict(req(thinking=True), messages=[{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "Roses", "prefix": True}]), "\n\n are red", "stop"),
    ("prefix.think_reasoning", dict(req(thinking=True, usage=True), messages=[{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "", "reasoning_content": "Hmm", "prefix": True}]),
     "\n\n so</think>\n\nDone", "stop"),
    # stop sequences (the answer only)
    ("stop.basic", req(stop=["END", "ab"]), "Hello END world", "stop"),
    ("stop.partial_at_end", req(stop=["END", "ab"]), "Hello EN", "stop"),
    ("stop.second_candidate", req(stop=["END", "ab"]), "xaEND", "stop"),
    ("stop.after_newlines", req(stop=["END"]), "first\n\nEND", "stop"),
    ("stop.beats_length", req(stop=["END"]), "Hello END world", "length"),
    ("stop.not_in_reasoning", req(thinking=True, usage=True, stop=["END"]), "think END more</think>answer END x", "stop"),
    ("stop.not_in_arguments", req(tools=True, stop=["END"]), "pre" + block(call("search", ("q", "aENDb", True))), "stop"),
    ("stop.multibyte", req(stop=["。"]), "你好。再见", "stop"),
    ("stop.inside_token", req(stop=["orl"]), "hello world peace", "stop"),
    ("tools.multiline_value", req(tools=True), block(call("search", ("code", "def f():\n    return 1\n", True))), "stop"),
]


def neutral(chunks):
    ev = []
    def add(kind, *rest):
        if ev and kind in ("text", "reasoning") and ev[-1][0] == kind:
            ev[-1][1] += rest[0]
        elif ev and kind == "arguments" and ev[-1][0] == kind and ev[-1][1] == rest[0]:
            ev[-1][2] += rest[1]
        else:
            ev.append([kind, *rest])
    for c in chunks:
        for ch in c["choices"]:
            d = ch["delta"]
            if d.get("reasoning_content"): add("reasoning", d["reasoning_content"])
            if d.get("content"): add("text", d["content"])
            for tc in d.get("tool_calls") or []:
                if "id" in tc: add("tool_call", tc["index"], tc["function"]["name"])
                if tc["function"].get("arguments"): add("arguments", tc["index"], tc["function"]["arguments"])
            if ch["finish_reason"]: add("finish", ch["finish_reason"])
        u = c.get("usage")
        if u:
            add("usage", u["prompt_tokens"], u["completion_tokens"],
                (u.get("completion_tokens_details") or {}).get("reasoning_tokens"))
    return ev


def main():
    text = gzip.decompress(TOK_GZ.read_bytes()).decode()
    tok, hf = dr.Tokenizer.from_str(text), tokenizers.Tokenizer.from_str(text)
    finish = {"stop": dr.InferenceFinishReason.Stop, "length": dr.InferenceFinishReason.Length,
              "content_filter": dr.InferenceFinishReason.ContentFilter}
    lines = []
    for name, body, generated, fin in CASES:
        conv = dr.ChatCompletionRequest(json.loads(json.dumps(body))).convert(dr.ConversionOptions())
        po = conv.parsing_options
        stage = po.thinking_initial_stage
        sp = dr.StreamProcessor(dr.ChatCompletionRequest.chunk_generator(conv, "chatcmpl-test", "DeepSeek-V4-Pro"), po, tok)
        ids = hf.encode(generated).ids
        out = sp.push(dr.InferenceChunk.ready(prompt_usage=dr.PromptUsage(prompt_tokens=PROMPT_TOKENS)))
        for i in ids:
            if sp.finished: break  # a stop sequence ended the output
            out += sp.push(dr.InferenceChunk.tokens([i]))
        if not sp.finished:
            out += sp.push(dr.InferenceChunk.finish(finish[fin]))
        out += sp.finish()
        chunks = [json.loads(c.to_json()) for c in out]
        for c in chunks:
            c["created"] = 0
            for ch in c["choices"]:
                for tc in ch["delta"].get("tool_calls") or []:
                    if "id" in tc: tc["id"] = re.sub(r"^(call_\d+_).*$", r"\1X", tc["id"])
        rec = {"name": name, "request": body, "generated": generated, "ids": ids, "finish": fin,
               "parse_tool_calls": po.parse_tool_calls, "starts_in_tool_calls": po.starts_in_tool_calls,
               "thinking": None if stage is None else str(stage).split(".")[-1],
               "prompt_tokens": PROMPT_TOKENS, "chunks": chunks, "events": neutral(chunks)}
        lines.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    OUT.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    print(f"{len(CASES)} stream cases -> {OUT.relative_to(ROOT)} (deepseek_recipe {dr.__version__})")


if __name__ == "__main__":
    main()
