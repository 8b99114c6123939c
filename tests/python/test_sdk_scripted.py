"""The official OpenAI and Anthropic Python SDKs, unchanged, against troupe's HTTP entrypoint.

The server is tests/entrypoint/api_server (troupe_test_api_server): the real entrypoint on
127.0.0.1 over a scripted list of token ids (plain text, reasoning then text, or a DSML tool
call whose arguments span many tokens). Every test runs twice: against a fake generation
service that streams the script ("fake"), and against the real serving graph ("graph": request
actors, the balancers, a prefill and a decode instance and the KV hand-off between them) whose
devices are script devices: the prefill device samples the first token and the decode device
continues from the position the hand-off carries, so a lost or refused hand-off shows as a
repeated first token. Each fixture starts one server on an ephemeral port and stops it at
the end; every call has a bounded timeout and the SDKs' retries are off, so a server bug fails a
test instead of hanging it.

Run: TROUPE_API_SERVER=build/tests/troupe_test_api_server build/python-venv/bin/python -m pytest
tests/python/test_sdk_scripted.py (ctest -L sdk does both steps).
"""

import json
import os
import subprocess
import threading

import anthropic
import openai
import pytest

API_KEY = "sk-troupe-sdk-test"
MODEL = "DeepSeek-V4-Flash"
TEXT = "Hello from troupe! This is a scripted reply."
REASONING = "The user greets me. I should greet them back."
ANSWER = "Hello! How can I help you today?"
CITY = "San Francisco, California, United States of America"
TIMEOUT_S = 20

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
OPENAI_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather forecast",
                 "parameters": WEATHER_PARAMETERS},
}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Weather forecast",
                  "parameters": WEATHER_PARAMETERS}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather forecast",
                  "input_schema": WEATHER_PARAMETERS}
USER = [{"role": "user", "content": "Hello there"}]


class Server:
    """One troupe_test_api_server process; `port` and `tokens` (the script's length)."""

    def __init__(self, backend, *args):
        binary = os.environ.get("TROUPE_API_SERVER")
        if not binary or not os.path.exists(binary):
            pytest.skip("TROUPE_API_SERVER is not set to the troupe_test_api_server binary")
        self.backend = backend
        graph = ["--graph"] if backend == "graph" else []
        self.proc = subprocess.Popen(
            [binary, "--api-key", API_KEY, "--exit-on-stdin-close", *graph, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = {}
        reader = threading.Thread(target=lambda: line.update(text=self.proc.stdout.readline()))
        reader.start()
        reader.join(timeout=60)
        words = line.get("text", "").split()
        if len(words) != 4 or words[0] != "port":
            self.stop()
            raise RuntimeError(f"the server did not start: {line.get('text')!r}")
        self.port = int(words[1])
        self.tokens = int(words[3])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream:
                stream.close()

    def openai(self, api_key=API_KEY):
        return openai.OpenAI(api_key=api_key, base_url=f"http://127.0.0.1:{self.port}/v1",
                             max_retries=0, timeout=TIMEOUT_S)

    def anthropic(self, api_key=API_KEY):
        return anthropic.Anthropic(api_key=api_key, base_url=f"http://127.0.0.1:{self.port}",
                                   max_retries=0, timeout=TIMEOUT_S)


def start(request, *args):
    server = Server(request.param, *args)
    try:
        yield server
    finally:
        server.stop()
        assert server.proc.returncode == 0, "the server did not stop cleanly on SIGTERM"


BACKENDS = ["fake", "graph"]


@pytest.fixture(scope="module", params=BACKENDS)
def text_server(request):
    yield from start(request, "--script", "text")


@pytest.fixture(scope="module", params=BACKENDS)
def reasoning_server(request):
    yield from start(request, "--script", "reasoning", "--thinking")


@pytest.fixture(scope="module", params=BACKENDS)
def tool_server(request):
    yield from start(request, "--script", "tool")


# -- Chat Completions --------------------------------------------------------------------------

def test_chat_completion(text_server):
    r = text_server.openai().chat.completions.create(model=MODEL, messages=USER)
    assert r.object == "chat.completion"
    assert r.model == MODEL
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == TEXT
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == text_server.tokens
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_completion_stream_with_usage(text_server):
    client = text_server.openai()
    whole = client.chat.completions.create(model=MODEL, messages=USER)
    stream = client.chat.completions.create(model=MODEL, messages=USER, stream=True,
                                            stream_options={"include_usage": True})
    text, finish, usage, chunks = "", None, None, 0
    for chunk in stream:
        chunks += 1
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert chunks > 5
    assert text == TEXT
    assert finish == "stop"
    assert usage.completion_tokens == text_server.tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_completion_stop_sequence(text_server):
    client = text_server.openai()
    r = client.chat.completions.create(model=MODEL, messages=USER, stop=["scripted"])
    assert r.choices[0].message.content == "Hello from troupe! This is a "
    assert r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=MODEL, messages=USER, stop="troupe",
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello from "


def test_chat_completion_max_tokens(text_server):
    r = text_server.openai().chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_chat_completion_reasoning(reasoning_server):
    client = reasoning_server.openai()
    r = client.chat.completions.create(model=MODEL, messages=USER)
    message = r.choices[0].message
    assert message.content == ANSWER
    assert getattr(message, "reasoning_content", None) == REASONING
    assert r.usage.completion_tokens == reasoning_server.tokens
    stream = client.chat.completions.create(model=MODEL, messages=USER, stream=True)
    reasoning, text = "", ""
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            text += delta.content or ""
    assert reasoning == REASONING
    assert text == ANSWER


def test_chat_completion_tool_call(tool_server):
    r = tool_server.openai().chat.completions.create(model=MODEL, messages=USER,
                                                     tools=[OPENAI_TOOL])
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": CITY, "days": 3}
    assert r.usage.completion_tokens == tool_server.tokens


def test_chat_completion_tool_call_stream(tool_server):
    stream = tool_server.openai().chat.completions.create(
        model=MODEL, messages=USER, tools=[OPENAI_TOOL], stream=True)
    calls, finish, pieces = {}, None, 0
    for chunk in stream:
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = delta.id or call["id"]
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
                pieces += 1
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather"
    assert calls[0]["id"].startswith("call_")
    assert pieces > 5, "the arguments should arrive in many chunks"
    assert json.loads(calls[0]["arguments"]) == {"city": CITY, "days": 3}


# -- Responses ---------------------------------------------------------------------------------

def test_responses(text_server):
    r = text_server.openai().responses.create(model=MODEL, input="Hello there")
    assert r.object == "response"
    assert r.status == "completed"
    assert r.output_text == TEXT
    assert r.usage.output_tokens == text_server.tokens
    assert r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_responses_stream(text_server):
    stream = text_server.openai().responses.create(model=MODEL, input="Hello there",
                                                   stream=True)
    kinds, text, final = [], "", None
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            final = event.response
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert text == TEXT
    assert final.output_text == TEXT
    assert final.usage.output_tokens == text_server.tokens


def test_responses_stream_helper_and_reasoning(reasoning_server):
    with reasoning_server.openai().responses.stream(model=MODEL, input="Hello there") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.output_text == ANSWER
    kinds = [item.type for item in final.output]
    assert kinds == ["reasoning", "message"]
    assert final.output[0].content[0].text == REASONING
    assert final.usage.output_tokens == reasoning_server.tokens
    assert final.usage.output_tokens_details.reasoning_tokens > 0


def test_responses_tool_call(tool_server):
    client = tool_server.openai()
    r = client.responses.create(model=MODEL, input="Weather?", tools=[RESPONSES_TOOL])
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": CITY, "days": 3}
    stream = client.responses.create(model=MODEL, input="Weather?", tools=[RESPONSES_TOOL],
                                     stream=True)
    deltas, done = "", None
    for event in stream:
        if event.type == "response.function_call_arguments.delta":
            deltas += event.delta
        if event.type == "response.function_call_arguments.done":
            done = event.arguments
    assert json.loads(deltas) == json.loads(done) == {"city": CITY, "days": 3}


# -- Anthropic Messages ------------------------------------------------------------------------

def test_messages(text_server):
    m = text_server.anthropic().messages.create(model=MODEL, max_tokens=256, messages=USER)
    assert m.type == "message"
    assert m.role == "assistant"
    assert m.content[0].type == "text"
    assert m.content[0].text == TEXT
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens == text_server.tokens
    assert m.usage.input_tokens > 0


def test_messages_stream(text_server):
    client = text_server.anthropic()
    with client.messages.stream(model=MODEL, max_tokens=256, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == TEXT
    assert final.content[0].text == TEXT
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == text_server.tokens


def test_messages_stop_sequence(text_server):
    client = text_server.anthropic()
    m = client.messages.create(model=MODEL, max_tokens=256, messages=USER,
                               stop_sequences=["scripted"])
    assert m.content[0].text == "Hello from troupe! This is a "
    assert m.stop_reason == "stop_sequence"
    assert m.stop_sequence == "scripted"
    with client.messages.stream(model=MODEL, max_tokens=256, messages=USER,
                                stop_sequences=["This"]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello from troupe! "
    assert final.stop_reason == "stop_sequence"


def test_messages_max_tokens(text_server):
    m = text_server.anthropic().messages.create(model=MODEL, max_tokens=4, messages=USER)
    assert m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == 4


def test_messages_thinking(reasoning_server):
    client = reasoning_server.anthropic()
    m = client.messages.create(model=MODEL, max_tokens=1024, messages=USER,
                               thinking={"type": "enabled", "budget_tokens": 512})
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == REASONING
    assert m.content[1].text == ANSWER
    with client.messages.stream(model=MODEL, max_tokens=1024, messages=USER,
                                thinking={"type": "enabled", "budget_tokens": 512}) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == REASONING
    assert final.content[1].text == ANSWER
    assert final.usage.output_tokens == reasoning_server.tokens


def test_messages_tool_use(tool_server):
    client = tool_server.anthropic()
    m = client.messages.create(model=MODEL, max_tokens=512, messages=USER,
                               tools=[ANTHROPIC_TOOL])
    assert m.stop_reason == "tool_use"
    (block,) = [b for b in m.content if b.type == "tool_use"]
    assert block.name == "get_weather"
    assert block.input == {"city": CITY, "days": 3}
    partial = []
    with client.messages.stream(model=MODEL, max_tokens=512, messages=USER,
                                tools=[ANTHROPIC_TOOL]) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                partial.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert len(partial) > 5, "the input should arrive in many deltas"
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert block.input == {"city": CITY, "days": 3}
    assert final.usage.output_tokens == tool_server.tokens


# -- logprobs (the graph's script devices report logprob 0 for every token they sample) ---------

def graph_only(server):
    if server.backend != "graph":
        pytest.skip("the fake service sends no logprobs")


def spelled(entries):
    return b"".join(bytes(e.bytes) for e in entries).decode("utf-8")


def check_script_entries(entries):
    for e in entries:
        assert e.logprob == 0
        assert [(t.token, t.logprob) for t in e.top_logprobs] == [(e.token, 0)]


def chat_logprobs(server, stream, **extra):
    """The answer text and its logprob entries, streamed or not."""
    client = server.openai()
    body = dict(model=MODEL, messages=USER, logprobs=True, top_logprobs=3, **extra)
    if not stream:
        r = client.chat.completions.create(**body)
        return r.choices[0].message.content or "", r.choices[0].logprobs.content, r.usage
    text, entries, usage = "", [], None
    for chunk in client.chat.completions.create(**body, stream=True,
                                                stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.logprobs and c.logprobs.content:
                assert c.delta.content, "logprobs ride on content chunks only"
                entries += c.logprobs.content
    return text, entries, usage


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_of_a_text_reply(text_server, stream):
    graph_only(text_server)
    text, entries, usage = chat_logprobs(text_server, stream)
    assert text == TEXT
    # every token but the end of sentence
    assert len(entries) == usage.completion_tokens - 1 == text_server.tokens - 1
    assert spelled(entries) == TEXT
    check_script_entries(entries)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_stop_at_a_stop_sequence(text_server, stream):
    graph_only(text_server)
    text, entries, _ = chat_logprobs(text_server, stream, stop=["scripted"])
    assert text == "Hello from troupe! This is a "
    # The tokens with a byte before the stop sequence: the last one (" scripted") reaches into it.
    assert spelled(entries).startswith(text)
    assert text.startswith(spelled(entries[:-1]))
    assert len(entries) < text_server.tokens - 1


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_leave_out_the_reasoning(reasoning_server, stream):
    graph_only(reasoning_server)
    text, entries, usage = chat_logprobs(reasoning_server, stream)
    assert text == ANSWER
    assert spelled(entries) == ANSWER
    # all tokens but the reasoning's, `</think>` and the end of sentence
    reasoning = usage.completion_tokens_details.reasoning_tokens
    assert len(entries) == usage.completion_tokens - reasoning - 2
    check_script_entries(entries)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_leave_out_tool_calls(tool_server, stream):
    graph_only(tool_server)
    text, entries, _ = chat_logprobs(tool_server, stream, tools=[OPENAI_TOOL])
    assert text == ""
    assert entries == []


def test_responses_logprobs(reasoning_server):
    graph_only(reasoning_server)
    client = reasoning_server.openai()
    body = dict(model=MODEL, input="Hello there", top_logprobs=1,
                include=["message.output_text.logprobs"])
    r = client.responses.create(**body)
    (message,) = [item for item in r.output if item.type == "message"]
    part = message.content[0]
    assert part.text == ANSWER
    assert spelled(part.logprobs) == ANSWER
    check_script_entries(part.logprobs)
    deltas, done = [], None
    for event in client.responses.create(**body, stream=True):
        if event.type == "response.output_text.delta":
            deltas += event.logprobs
        if event.type == "response.output_text.done":
            done = event.logprobs
    tuples = [(e.token, e.logprob) for e in part.logprobs]
    assert [(e.token, e.logprob) for e in deltas] == [(e.token, e.logprob) for e in done] == tuples


# -- models and errors -------------------------------------------------------------------------

def test_models_list(text_server):
    assert [m.id for m in text_server.openai().models.list()] == [MODEL]
    assert [m.id for m in text_server.anthropic().models.list()] == [MODEL]


def test_errors_surface_as_sdk_exceptions(text_server):
    with pytest.raises(openai.AuthenticationError):
        text_server.openai(api_key="wrong").chat.completions.create(model=MODEL, messages=USER)
    with pytest.raises(anthropic.AuthenticationError):
        text_server.anthropic(api_key="wrong").messages.create(model=MODEL, max_tokens=16,
                                                               messages=USER)
    with pytest.raises(openai.NotFoundError) as missing:
        text_server.openai().chat.completions.create(model="no-such-model", messages=USER)
    assert missing.value.status_code == 404
    with pytest.raises(anthropic.NotFoundError):
        text_server.anthropic().messages.create(model="no-such-model", max_tokens=16,
                                                messages=USER)
    with pytest.raises(openai.BadRequestError) as bad:
        text_server.openai().chat.completions.create(model=MODEL, messages=USER,
                                                     temperature=7)
    assert "temperature" in str(bad.value)
    with pytest.raises(anthropic.BadRequestError):
        text_server.anthropic().messages.create(model=MODEL, max_tokens=16, messages=[])
    with pytest.raises(openai.BadRequestError):
        text_server.openai().responses.create(model=MODEL, input=[{"role": "nobody"}])
    # The server keeps serving afterwards.
    r = text_server.openai().chat.completions.create(model=MODEL, messages=USER)
    assert r.choices[0].message.content == TEXT
