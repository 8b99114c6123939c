"""The official OpenAI and Anthropic Python SDKs, unchanged, against troupe's HTTP entrypoint.

The server is tests/entrypoint/api_server (troupe_test_api_server): the real entrypoint on
127.0.0.1 over a fake generation service that streams a scripted list of token ids (plain text,
reasoning then text, or a DSML tool call whose arguments span many tokens). Each fixture starts
one server on an ephemeral port and stops it at the end; every call has a bounded timeout and
the SDKs' retries are off, so a server bug fails a test instead of hanging it.

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

    def __init__(self, *args):
        binary = os.environ.get("TROUPE_API_SERVER")
        if not binary or not os.path.exists(binary):
            pytest.skip("TROUPE_API_SERVER is not set to the troupe_test_api_server binary")
        self.proc = subprocess.Popen(
            [binary, "--api-key", API_KEY, "--exit-on-stdin-close", *args],
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


def start(*args):
    server = Server(*args)
    try:
        yield server
    finally:
        server.stop()
        assert server.proc.returncode == 0, "the server did not stop cleanly on SIGTERM"


@pytest.fixture(scope="module")
def text_server():
    yield from start("--script", "text")


@pytest.fixture(scope="module")
def reasoning_server():
    yield from start("--script", "reasoning", "--thinking")


@pytest.fixture(scope="module")
def tool_server():
    yield from start("--script", "tool")


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
