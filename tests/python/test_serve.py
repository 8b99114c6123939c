"""The official OpenAI and Anthropic Python SDKs, unchanged, against `troupe serve`.

The server is the real thing: `troupe serve examples/topologies/local-cpu.toml` on a random
DeepSeek-V4.1-shaped model (`troupe model init --preset small`, the full 129,280-id vocabulary,
107 M parameters) — the CPU engine computes every token, through separate prefill and decode
instances and the KV hand-off between them. The model is random, so its text is gibberish; the
tests check what the server must get right whatever the model says: that the served greedy
tokens are exactly `troupe generate`'s, alone and among 64 concurrent streams, that streams
and usage agree, that max_tokens, stop sequences, seeds and API keys are honoured, that a
client that leaves frees its request, and that structured output (response_format, text.format,
output_config.format, strict tools) gives answers and calls that parse against their schema, and
that a decode instance whose EP group has ranks in a process of their own (local-cpu-ep-processes.toml)
keeps every stream's tokens when that process is killed. Every call has a bounded timeout and retries are off.

Run: TROUPE=build/troupe build/python-venv/bin/python -m pytest tests/python/test_serve.py
(ctest -L sdk does both steps).
"""

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from typing import Literal, Optional

import anthropic
import openai
import pydantic
import pytest

API_KEY = "sk-troupe-serve-test"
MODEL = "deepseek-v4.1-flash"
TIMEOUT_S = 300
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def troupe():
    binary = os.environ.get("TROUPE")
    if not binary or not os.path.exists(binary):
        pytest.skip("TROUPE is not set to the troupe binary")
    return binary


class Server:
    def __init__(self, model_dir, keys_file, kv_dir, extra=(), topology="local-cpu.toml"):
        self.proc = subprocess.Popen(
            [troupe(), "serve", os.path.join(ROOT, "examples/topologies", topology),
             "--model", model_dir, "--engram-map", "identity", "--listen", "127.0.0.1:0",
             "--api-keys", keys_file, "--max-in-flight", "80", "--grace", "10",
             "--kv-dir", kv_dir, "--check-history", *extra],
            stderr=subprocess.PIPE, text=True)
        self.log = []
        found = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                if " on http://" in line:
                    found.set()
        threading.Thread(target=read, daemon=True).start()
        if not found.wait(timeout=240):
            self.stop()
            raise RuntimeError("troupe serve did not start:\n" + "".join(self.log))
        line = next(l for l in self.log if " on http://" in l)
        self.port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def openai(self, api_key=API_KEY):
        return openai.OpenAI(api_key=api_key, base_url=f"http://127.0.0.1:{self.port}/v1",
                             max_retries=0, timeout=TIMEOUT_S)

    def anthropic(self):
        return anthropic.Anthropic(api_key=API_KEY, base_url=f"http://127.0.0.1:{self.port}",
                                   max_retries=0, timeout=TIMEOUT_S)

    def metric(self, name):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return None


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "small"
    subprocess.run([troupe(), "model", "init", "--preset", "small", "--seed", "1",
                    "--out", str(out)], check=True, capture_output=True, timeout=600)
    return str(out)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# test keys\n" + API_KEY + "\n")
    s = Server(model_dir, str(keys), str(tmp_path_factory.mktemp("kv")))
    yield s
    s.stop()
    assert s.proc.returncode == 0, "troupe serve did not stop cleanly on SIGTERM:\n" + "".join(s.log)
    # --check-history: everything this module's tests made the server do, checked at the stop
    # (tokens by position, each request ending once, KV TTLs, decode bookings).
    assert any("facts: no violations" in line for line in s.log), "".join(s.log)


def chat_body(content, **extra):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def generated_text(model_dir, body, n):
    """What `troupe generate --greedy` produces for the request's prompt, as text."""
    encoded = subprocess.run([troupe(), "encode", "--protocol", "chat", "-"], input=json.dumps(body),
                             check=True, capture_output=True, text=True, timeout=120)
    ids = json.loads(encoded.stdout)["ids"]
    out = subprocess.run([troupe(), "generate", "--model", model_dir, "--tokens",
                          ",".join(map(str, ids)), "--greedy", "--batch-invariant",
                          "--ignore-eos", "--max-new", str(n), "--engram-map", "identity"],
                         check=True, capture_output=True, text=True, timeout=600)
    tokens = [int(t) for t in out.stdout.strip().split(",")]
    text = subprocess.run([troupe(), "detokenize", "--ids", json.dumps(tokens)],
                          check=True, capture_output=True, text=True, timeout=120)
    return text.stdout.rstrip("\n"), tokens


def served_text(message):
    return (getattr(message, "reasoning_content", None) or "") + (message.content or "")


# -- the engine behind the API -----------------------------------------------------------------

def test_served_greedy_tokens_equal_troupe_generate(server, model_dir):
    body = chat_body("Tell me about actors.", max_tokens=12, temperature=0)
    want, tokens = generated_text(model_dir, body, 12)
    r = server.openai().chat.completions.create(**body)
    assert r.usage.completion_tokens == len(tokens) == 12
    assert served_text(r.choices[0].message) == want
    assert r.choices[0].finish_reason == "length"


def test_64_concurrent_streams_all_complete_and_one_equals_it_alone(server, model_dir):
    body = chat_body("Actors and messages.", max_tokens=6, temperature=0)
    want, _ = generated_text(model_dir, body, 6)
    client = server.openai()

    def one(i):
        b = body if i == 0 else chat_body(f"Stream number {i}, say something.", max_tokens=6,
                                          temperature=0)
        text, usage = "", None
        for chunk in client.chat.completions.create(**b, stream=True,
                                                     stream_options={"include_usage": True}):
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += (getattr(c.delta, "reasoning_content", None) or "") + (c.delta.content or "")
        return text, usage

    # 64 prompts of ~90 tokens each go through one CPU prefill device: allow them time.
    client = openai.OpenAI(api_key=API_KEY, base_url=f"http://127.0.0.1:{server.port}/v1",
                           max_retries=0, timeout=900)
    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(one, range(64)))
    assert len(results) == 64
    assert all(u is not None and u.completion_tokens == 6 for _, u in results)
    assert results[0][0] == want


def test_kv_tokens_make_requests_wait_for_decode_room_and_all_complete(model_dir, tmp_path):
    """--kv-tokens 512: the decode instance books each request's prompt (~90 tokens) and its
    100-token budget, so two of four concurrent requests decode at once and the others wait
    for a booking to end; every one completes, and the history check at the stop holds every
    booking to the 512 tokens."""
    keys = tmp_path / "keys.txt"
    keys.write_text(API_KEY + "\n")
    s = Server(model_dir, str(keys), str(tmp_path / "kv"),
               extra=("--max-context", "512", "--kv-tokens", "512"))
    try:
        client = s.openai()

        def one(i):
            times = []  # when each content chunk arrived
            for chunk in client.chat.completions.create(
                    **chat_body(f"Request {i} of four, say something.", max_tokens=100,
                                temperature=0), stream=True):
                if any((getattr(c.delta, "reasoning_content", None) or c.delta.content)
                       for c in chunk.choices):
                    times.append(time.monotonic())
            return times

        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            runs = list(pool.map(one, range(4)))
        assert all(len(t) >= 90 for t in runs), [len(t) for t in runs]
        # A request decodes once booked: its second token comes after its decode booking.
        # Had all four been booked at once, every second token would come ~90 decode steps
        # before any request's tenth-to-last token; with room for two, the last to start
        # decoding starts after one of the first two ended, ten steps after that token.
        assert max(t[1] for t in runs) > min(t[-10] for t in runs)
    finally:
        s.stop()
    assert s.proc.returncode == 0, "".join(s.log)
    assert any("facts: no violations" in line for line in s.log), "".join(s.log)


# -- the three APIs ----------------------------------------------------------------------------

def test_chat_stream_equals_the_non_streamed_reply_and_counts_usage(server):
    body = chat_body("Hello!", max_tokens=8, temperature=0)
    whole = server.openai().chat.completions.create(**body)
    text, usage, finish = "", None, None
    for chunk in server.openai().chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += (getattr(c.delta, "reasoning_content", None) or "") + (c.delta.content or "")
            finish = c.finish_reason or finish
    assert text == served_text(whole.choices[0].message)
    assert usage.completion_tokens == whole.usage.completion_tokens == 8
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 0
    assert finish == "length"


def test_responses_stream_and_not(server):
    client = server.openai()
    r = client.responses.create(model=MODEL, input="Hello!", max_output_tokens=6, temperature=0)
    assert r.status == "incomplete"  # max_output_tokens reached
    assert r.usage.output_tokens == 6
    events = list(client.responses.create(model=MODEL, input="Hello!", max_output_tokens=6,
                                          temperature=0, stream=True))
    assert events[0].type == "response.created"
    done = [e for e in events if e.type in ("response.completed", "response.incomplete")]
    assert len(done) == 1 and done[0].response.usage.output_tokens == 6


def test_messages_stream_and_not(server):
    client = server.anthropic()
    m = client.messages.create(model=MODEL, max_tokens=6,
                               messages=[{"role": "user", "content": "Hello!"}])
    assert m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == 6
    with client.messages.stream(model=MODEL, max_tokens=6,
                                messages=[{"role": "user", "content": "Hello!"}]) as s:
        final = s.get_final_message()
    assert final.usage.output_tokens == 6
    assert final.stop_reason == "max_tokens"


# -- sampling and limits -----------------------------------------------------------------------

def test_seeds_are_reproducible(server):
    client = server.openai()
    body = chat_body("Pick words.", max_tokens=10, temperature=1.0, seed=7)
    a = served_text(client.chat.completions.create(**body).choices[0].message)
    b = served_text(client.chat.completions.create(**body).choices[0].message)
    c = served_text(client.chat.completions.create(**{**body, "seed": 8}).choices[0].message)
    assert a == b
    assert a != c


def test_a_stop_sequence_cuts_the_reply(server):
    client = server.openai()
    # Chat mode (no reasoning): stop sequences apply to the reply's content.
    body = chat_body("Tell me about actors.", max_tokens=12, temperature=0,
                     extra_body={"thinking": {"type": "disabled"}})
    full = served_text(client.chat.completions.create(**body).choices[0].message)
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), "the greedy reply is too short to cut"
    r = client.chat.completions.create(**body, stop=[stop])
    text = served_text(r.choices[0].message)
    assert r.choices[0].finish_reason == "stop"
    assert text == full[:full.index(stop)]


def test_a_wrong_api_key_is_refused(server):
    with pytest.raises(openai.AuthenticationError):
        server.openai(api_key="sk-wrong").chat.completions.create(**chat_body("Hi", max_tokens=2))


def test_a_client_that_leaves_mid_stream_frees_its_request(server):
    client = server.openai()
    stream = client.chat.completions.create(**chat_body("Talk for a long time.", max_tokens=4000),
                                            stream=True)
    for i, _ in enumerate(stream):
        if i >= 3:
            break
    stream.close()
    def idle():
        return (server.metric("troupe_http_requests_in_flight") == 0
                and server.metric('troupe_device_sequences{device="decode/0"}') == 0
                and server.metric('troupe_device_sequences{device="prefill/0"}') == 0)
    for _ in range(300):
        if idle():
            break
        time.sleep(0.1)
    # The request is gone, and so is its KV on both devices.
    assert idle()


def test_a_repeated_long_prompt_computes_only_its_uncached_tail(server, model_dir):
    body = chat_body(" ".join(f"item{i}" for i in range(200)), max_tokens=6, temperature=0)
    want, _ = generated_text(model_dir, body, 6)
    client = server.openai()
    hits_before = server.metric("troupe_http_prefix_hit_tokens_total")
    computed_before = server.metric('troupe_device_tokens_total{device="prefill/0",phase="prefill"}')
    first = client.chat.completions.create(**body)
    prompt = first.usage.prompt_tokens
    blocks = (prompt - 1) // 128
    assert blocks >= 2, prompt
    # The prompt's blocks are written after its hand-off to decode: wait until they are in.
    for _ in range(300):
        if server.metric("troupe_store_blocks") >= blocks:
            break
        time.sleep(0.1)
    second = client.chat.completions.create(**body)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == 128 * blocks
    # The same greedy text as computing everything (the window state was kept: exact restore).
    assert served_text(first.choices[0].message) == want
    assert served_text(second.choices[0].message) == want
    assert server.metric("troupe_http_prefix_hit_tokens_total") - hits_before == cached
    computed = (server.metric('troupe_device_tokens_total{device="prefill/0",phase="prefill"}')
                - computed_before)
    assert computed == prompt + (prompt - cached)


def test_a_restarted_server_serves_a_prefix_from_the_blocks_it_wrote(model_dir, tmp_path):
    """The store outlives the process: SIGTERM, start again on the same directory, and the same
    prompt's blocks are hits (their window state, kept in memory, is gone: bounded replay).
    The first server keeps no window state at all (--window-memory 0): its own repeat of the
    prompt replays too."""
    keys = tmp_path / "keys.txt"
    keys.write_text(API_KEY + "\n")
    kv_dir = str(tmp_path / "kv")
    body = chat_body(" ".join(f"entry{i}" for i in range(200)), max_tokens=3, temperature=0)
    first = Server(model_dir, str(keys), kv_dir, ("--window-memory", "0"))
    try:
        r = first.openai().chat.completions.create(**body)
        blocks = (r.usage.prompt_tokens - 1) // 128
        assert blocks >= 2
        for _ in range(300):
            if first.metric("troupe_store_blocks") >= blocks:
                break
            time.sleep(0.1)
        repeat = first.openai().chat.completions.create(**body)
        assert repeat.usage.prompt_tokens_details.cached_tokens == 128 * blocks
        assert first.metric('troupe_kv_restores_total{device="prefill/0",outcome="replayed"}') == 1
        assert first.metric('troupe_device_kept_states{device="prefill/0"}') == 0
        assert first.metric('troupe_device_kept_states{device="decode/0"}') == 0
    finally:
        first.stop()
    assert first.proc.returncode == 0, "".join(first.log)
    second = Server(model_dir, str(keys), kv_dir)
    try:
        again = second.openai().chat.completions.create(**body)
        assert again.usage.prompt_tokens_details.cached_tokens == 128 * blocks
        assert again.usage.completion_tokens == 3
        assert second.metric('troupe_kv_restores_total{device="prefill/0",outcome="replayed"}') == 1
    finally:
        second.stop()
    assert second.proc.returncode == 0, "".join(second.log)


# -- logprobs ----------------------------------------------------------------------------------

CHAT_MODE = {"thinking": {"type": "disabled"}}  # no reasoning: every token is answer text


def check_greedy_entries(entries, top):
    """Greedy logprob entries: each a log-probability, its bytes its text, the chosen token the
    most likely of `top` sorted alternatives."""
    for entry in entries:
        assert entry.logprob <= 0
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        assert len(entry.top_logprobs) == top
        if top:
            assert entry.top_logprobs[0].token == entry.token
            assert entry.top_logprobs[0].logprob == entry.logprob
        lps = [t.logprob for t in entry.top_logprobs]
        assert lps == sorted(lps, reverse=True)


def spelled(entries):
    return b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace")


def as_tuples(entries):
    return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in entries]


def test_chat_logprobs_describe_the_greedy_tokens(server):
    r = server.openai().chat.completions.create(
        **chat_body("Hello!", max_tokens=5, temperature=0, extra_body=CHAT_MODE),
        logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 5
    check_greedy_entries(content, 3)
    # The tokens' bytes spell the reply.
    assert spelled(content) == r.choices[0].message.content


def test_chat_logprobs_cover_the_answer_not_the_reasoning(server):
    # Thinking mode: the random model reasons for all its tokens, and reasoning has no logprobs.
    r = server.openai().chat.completions.create(**chat_body("Hello!", max_tokens=5, temperature=0),
                                                logprobs=True)
    content = r.choices[0].logprobs.content
    assert len(content) <= r.usage.completion_tokens
    check_greedy_entries(content, 0)
    assert spelled(content) == (r.choices[0].message.content or "")


def test_chat_stream_logprobs_equal_the_non_streamed_ones(server):
    body = chat_body("Tell me about actors.", max_tokens=8, temperature=0, extra_body=CHAT_MODE,
                     logprobs=True, top_logprobs=2)
    whole = server.openai().chat.completions.create(**body)
    entries, text, usage = [], "", None
    for chunk in server.openai().chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            if c.delta.content:
                # each content chunk carries the entries of its tokens
                assert c.logprobs is not None and c.logprobs.content is not None
                entries += c.logprobs.content
    assert text == whole.choices[0].message.content
    assert len(entries) == usage.completion_tokens == whole.usage.completion_tokens == 8
    assert as_tuples(entries) == as_tuples(whole.choices[0].logprobs.content)
    assert [bytes(e.bytes) for e in entries] == [bytes(e.bytes) for e in whole.choices[0].logprobs.content]
    check_greedy_entries(entries, 2)
    assert spelled(entries) == text


def test_responses_logprobs_stream_and_not(server):
    client = server.openai()
    body = dict(model=MODEL, input="Tell me about actors.", max_output_tokens=6, temperature=0,
                reasoning={"effort": "none"}, top_logprobs=2,
                include=["message.output_text.logprobs"])
    r = client.responses.create(**body)
    (message,) = [item for item in r.output if item.type == "message"]
    part = message.content[0]
    assert part.type == "output_text"
    assert len(part.logprobs) == r.usage.output_tokens == 6
    check_greedy_entries(part.logprobs, 2)
    assert spelled(part.logprobs) == part.text == r.output_text

    deltas, text, done, part_done, final = [], "", None, None, None
    for event in client.responses.create(**body, stream=True):
        if event.type == "response.output_text.delta":
            deltas += event.logprobs
            text += event.delta
        elif event.type == "response.output_text.done":
            done = event
        elif event.type == "response.content_part.done":
            part_done = event.part
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert text == part.text
    assert as_tuples(deltas) == as_tuples(done.logprobs) == as_tuples(part.logprobs)
    assert as_tuples(part_done.logprobs) == as_tuples(part.logprobs)
    (streamed,) = [item for item in final.output if item.type == "message"]
    assert as_tuples(streamed.content[0].logprobs) == as_tuples(part.logprobs)

    # Without `include` there are none.
    plain = client.responses.create(**{k: v for k, v in body.items() if k != "include"})
    (message,) = [item for item in plain.output if item.type == "message"]
    assert message.content[0].logprobs == []


# -- structured output (docs/structured-output.md) ---------------------------------------------
# The random model's logits are masked by the grammar, so whatever it would say, the answer is a
# valid instance; chat mode, since a random model never ends its reasoning with </think>.

class Reading(pydantic.BaseModel):
    sensor: Literal["north", "south", "east"]
    ok: bool
    level: int = pydantic.Field(ge=0, le=9)
    note: Optional[Literal["calm", "storm"]]


def test_chat_parse_with_a_pydantic_model_gives_a_valid_instance(server):
    for seed in (1, 2, 3):
        r = server.openai().chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "Report the sensor."}],
            response_format=Reading, max_tokens=100, temperature=1.0, seed=seed, extra_body=CHAT_MODE)
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Reading)
        assert choice.message.content == json.dumps(json.loads(choice.message.content), ensure_ascii=False)


class Verdict(pydantic.BaseModel):
    sensor: Literal["north", "south", "east"]
    ok: bool
    note: Optional[Literal["calm", "storm"]]


def test_messages_parse_with_a_pydantic_model_gives_a_valid_instance(server):
    # The anthropic SDK sends the model's schema as output_config.format (structured outputs).
    client = server.anthropic()
    for _ in range(3):
        m = client.messages.parse(
            model=MODEL, max_tokens=100, output_format=Verdict,
            messages=[{"role": "user", "content": "Report the sensor."}],
            thinking={"type": "disabled"})
        assert m.stop_reason == "end_turn", m.content
        assert isinstance(m.parsed_output, Verdict)


def test_messages_output_config_format_is_checked(server):
    client = server.anthropic()
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}],
            output_config={"format": {"type": "json_schema", "schema": {
                "type": "object", "properties": {"a": {"not": {"type": "string"}}}}}})
    assert "'not'" in str(e.value) and "#/properties/a" in str(e.value)


def test_a_refused_schema_is_a_400_even_streamed_after_the_request_went_on(server):
    # The schema compiles while the request goes on to prefill; the refusal cancels it, and a
    # streamed request gets the 400, not a stream.
    name = 'troupe_http_cancellations_total{reason="constraint_refused"}'
    before = server.metric(name) or 0
    for seed, thinking in ((1, CHAT_MODE), (2, {})):
        schema = {"type": "object", "properties": {"a": {"not": {"type": "string"}}, "seed": {"const": seed}}}
        with pytest.raises(openai.BadRequestError) as e:
            server.openai().chat.completions.create(**chat_body(
                "Hi", max_tokens=5, stream=True, extra_body=thinking,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}))
        assert e.value.body["param"] == "response_format" and "'not'" in e.value.body["message"]
    assert server.metric(name) == before + 2


def test_responses_text_format_json_schema_gives_a_valid_instance(server):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                               "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
              "required": ["city", "days", "tags"], "additionalProperties": False}
    r = server.openai().responses.create(
        model=MODEL, input="Plan a trip.", max_output_tokens=100, temperature=1.0,
        text={"format": {"type": "json_schema", "name": "trip", "schema": schema, "strict": True}},
        reasoning={"effort": "none"})  # Responses' chat mode
    assert r.status == "completed"
    value = json.loads(r.output_text)
    assert set(value) == {"city", "days", "tags"}
    assert value["city"] in ("Paris", "Oslo") and 1 <= value["days"] <= 7
    assert len(value["tags"]) <= 3 and all(isinstance(t, bool) for t in value["tags"])


def test_a_regex_response_format_is_matched_exactly(server):
    r = server.openai().chat.completions.create(
        **chat_body("A code, please.", max_tokens=40, temperature=1.0, seed=5, extra_body=CHAT_MODE,
                    response_format={"type": "regex", "regex": "[A-Z]{3}-[0-9]{2}(x|yz)?"}))
    assert r.choices[0].finish_reason == "stop"
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}(x|yz)?", r.choices[0].message.content)


def test_a_grammar_response_format_is_matched_exactly(server):
    # Our extension, through the SDK's extra_body: an EBNF grammar of several rules.
    grammar = 'root ::= "<" pair ">"\npair ::= item "," item\nitem ::= [0-9] | "(" [a-c]{1,2} ")"'
    r = server.openai().chat.completions.create(
        **chat_body("A pair, please.", max_tokens=40, temperature=1.0, seed=7,
                    extra_body={**CHAT_MODE, "response_format": {"type": "grammar", "grammar": grammar}}))
    assert r.choices[0].finish_reason == "stop"
    assert re.fullmatch(r"<([0-9]|\([a-c]{1,2}\)),([0-9]|\([a-c]{1,2}\))>", r.choices[0].message.content)


def test_a_lark_grammar_response_format_is_matched_exactly(server):
    # A Lark grammar (as vLLM and llguidance take it), detected without "syntax": a repeated
    # group, an inlined rule, a regex terminal and a common import.
    grammar = ('start: "[" item ("," item)~1..2 "]"\n?item: LCASE_LETTER~1..3 | NUM\n'
               'NUM: /[0-9]{1,2}/\n%import common.LCASE_LETTER\n')
    for seed, syntax in ((7, None), (8, "lark")):
        fmt = {"type": "grammar", "grammar": grammar, **({"syntax": syntax} if syntax else {})}
        r = server.openai().chat.completions.create(
            **chat_body("A list, please.", max_tokens=60, temperature=1.0, seed=seed,
                        extra_body={**CHAT_MODE, "response_format": fmt}))
        assert r.choices[0].finish_reason == "stop"
        text = r.choices[0].message.content
        assert re.fullmatch(r"\[([a-z]{1,3}|[0-9]{1,2})(,([a-z]{1,3}|[0-9]{1,2})){1,2}\]", text), text
    with pytest.raises(openai.BadRequestError) as e:
        server.openai().chat.completions.create(**chat_body(
            "Hi", max_tokens=5, extra_body={"response_format": {"type": "grammar", "grammar": grammar,
                                                                "syntax": "peg"}}))
    assert e.value.body["param"] == "response_format.syntax"
    with pytest.raises(openai.BadRequestError) as e:  # the same text read as GBNF
        server.openai().chat.completions.create(**chat_body(
            "Hi", max_tokens=5, extra_body={"response_format": {"type": "grammar", "grammar": grammar,
                                                                "syntax": "gbnf"}}))
    assert e.value.body["param"] == "response_format" and "line 1" in e.value.body["message"]


def test_vllm_and_sglang_constraint_fields_are_honoured(server):
    # Clients written for vLLM (`structured_outputs`, and its older `guided_*`) or SGLang
    # (`ebnf`, `regex`) work unchanged: the field constrains the output, the prompt stays as is.
    client = server.openai()
    choices = ["sunny", "rain (light)", "snow|sleet"]
    for seed in (1, 2, 3):
        r = client.chat.completions.create(**chat_body(
            "The weather?", max_tokens=20, temperature=1.0, seed=seed,
            extra_body={**CHAT_MODE, "structured_outputs": {"choice": choices}}))
        assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content in choices
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    r = client.chat.completions.create(**chat_body(
        "A number.", max_tokens=30, temperature=1.0, seed=4,
        extra_body={**CHAT_MODE, "guided_json": json.dumps(schema)}))
    assert 0 <= json.loads(r.choices[0].message.content)["n"] <= 9
    # vLLM's disable_any_whitespace: compact JSON, with the schema's or response_format's.
    record = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                        "minItems": 2, "maxItems": 2}},
              "required": ["n", "tags"], "additionalProperties": False}
    for extra in ({"structured_outputs": {"json": record, "disable_any_whitespace": True}},
                  {"structured_outputs": {"disable_any_whitespace": True},
                   "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "record", "schema": record}}}):
        r = client.chat.completions.create(**chat_body(
            "A record, json.", max_tokens=40, temperature=1.0, seed=6, extra_body={**CHAT_MODE, **extra}))
        text = r.choices[0].message.content
        value = json.loads(text)
        assert text == json.dumps(value, separators=(",", ":")), text
    # vLLM's whitespace_pattern: one text of the pattern around each of { } [ ] , : and nowhere else
    # (the record's strings hold no whitespace).
    spaced = []
    for seed in (7, 8, 9):
        r = client.chat.completions.create(**chat_body(
            "A record, json.", max_tokens=60, temperature=1.0, seed=seed,
            extra_body={**CHAT_MODE, "structured_outputs": {"json": record, "whitespace_pattern": "[\n ]?"}}))
        text = r.choices[0].message.content
        value = json.loads(text)
        assert re.sub(r"[\n ]", "", text) == json.dumps(value, separators=(",", ":")), text
        assert not re.search(r"[\n ]{2}|^\s|\s$", text), text
        spaced.append(re.search(r"[\n ]", text) is not None)
    assert any(spaced)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**chat_body(
            "Hi, json", max_tokens=5, response_format={"type": "json_object"},
            extra_body={"guided_whitespace_pattern": "\\s*"}))
    assert e.value.body["param"] == "guided_whitespace_pattern"
    r = client.chat.completions.create(**chat_body(
        "Letters.", max_tokens=30, temperature=1.0, seed=5,
        extra_body={**CHAT_MODE, "ebnf": 'root ::= "[" [a-c]+ "]"'}))
    assert re.fullmatch(r"\[[a-c]+\]", r.choices[0].message.content)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**chat_body(
            "Hi", max_tokens=5, extra_body={"structured_outputs": {"regex": "a(b"}}))
    assert e.value.body["param"] == "structured_outputs.regex"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**chat_body(
            "Hi, json", max_tokens=5, response_format={"type": "json_object"},
            extra_body={"structured_outputs": {"choice": ["a"]}}))
    assert "cannot be combined with 'response_format'" in e.value.body["message"]


def test_structural_tag_response_format(server):
    # vLLM's and SGLang's structural tags: free text in which a trigger starts a tagged region whose
    # content follows a schema (XGrammar's format and the original structures/triggers form).
    client = server.openai()
    weather = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                                "days": {"type": "integer", "minimum": 1, "maximum": 3}},
               "required": ["city", "days"], "additionalProperties": False}
    one_call = {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<function="], "at_least_one": True, "stop_after_first": True,
        "tags": [{"type": "tag", "begin": "<function=get_weather>",
                  "content": {"type": "json_schema", "json_schema": weather}, "end": "</function>"}]}}

    def forced_calls(fmt, begin, end, seeds):
        """The one call `fmt` forces, between `begin` and `end`, parses and follows `weather`."""
        for seed in seeds:
            r = client.chat.completions.create(**chat_body(
                "Weather?", max_tokens=40, temperature=1.0, seed=seed, logprobs=True,
                extra_body={**CHAT_MODE, "response_format": fmt}))
            text = r.choices[0].message.content
            m = re.fullmatch(re.escape(begin) + "(.*)" + re.escape(end), text, re.S)
            assert m and r.choices[0].finish_reason == "stop", text
            call = json.loads(m.group(1))
            assert call["city"] in ("Paris", "Oslo") and 1 <= call["days"] <= 3
            yield [t.token for t in r.choices[0].logprobs.content]

    list(forced_calls(one_call, "<function=get_weather>", "</function>", (1, 2)))
    # The original form through structured_outputs (a JSON string, as vLLM's type is): free text,
    # and every trigger in it starts a whole call.
    legacy = {"type": "structural_tag", "triggers": ["<f"],
              "structures": [{"begin": "<f>", "schema": weather, "end": "</f>"}]}
    r = client.chat.completions.create(**chat_body(
        "Weather?", max_tokens=30, temperature=1.0, seed=3,
        extra_body={**CHAT_MODE, "structured_outputs": {"structural_tag": json.dumps(legacy)}}))
    text = r.choices[0].message.content
    for call in re.finditer(r"<f", text):
        rest = text[call.start():]
        assert rest.startswith("<f>") and ("</f>" in rest or r.choices[0].finish_reason == "length"), text
    # Token-level formats: the call begins and ends with DeepSeek's control tokens, which appear
    # in the content as their text; a token the tokenizer lacks is a 400 naming its pointer.
    token_call = {"type": "structural_tag", "format": {
        "type": "token_triggered_tags", "trigger_tokens": ["<｜tool▁call▁begin｜>"],
        "at_least_one": True, "stop_after_first": True,
        "tags": [{"type": "tag", "begin": {"type": "token", "token": "<｜tool▁call▁begin｜>"},
                  "content": {"type": "json_schema", "json_schema": weather},
                  "end": {"type": "token", "token": "<｜tool▁call▁end｜>"}}]}}
    for tokens in forced_calls(token_call, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", (4, 5)):
        assert tokens[0] == "<｜tool▁call▁begin｜>" and tokens[-1] == "<｜tool▁call▁end｜>", tokens
    # Budgets: at most 12 characters and 4 tokens of text between the brackets (a token counts
    # when it holds a byte of the text), then the rest of the format.
    budgeted = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "tag", "begin": "[", "end": "]",
         "content": {"type": "any_text", "max_chars": 12, "max_tokens": 4}},
        {"type": "const_string", "value": " ok"}]}}
    for seed in (6, 7):
        r = client.chat.completions.create(**chat_body(
            "Short thought?", max_tokens=30, temperature=1.0, seed=seed, logprobs=True,
            extra_body={**CHAT_MODE, "response_format": budgeted}))
        text = r.choices[0].message.content
        m = re.fullmatch(r"\[(.*)\] ok", text, re.S)
        assert m and r.choices[0].finish_reason == "stop", text
        assert len(m.group(1)) <= 12, text
        inside, at, touching = (1, 1 + len(m.group(1).encode())), 0, 0
        for t in r.choices[0].logprobs.content:
            end = at + len(bytes(t.bytes))
            touching += at < inside[1] and end > inside[0]
            at = end
        assert touching <= 4, (text, [t.token for t in r.choices[0].logprobs.content])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**chat_body(
            "Hi", max_tokens=5, extra_body={"response_format": {
                "type": "structural_tag", "format": {"type": "tag", "begin": "<a>", "end": "</a>",
                                                     "content": {"type": "token", "token": "<｜nope｜>"}}}}))
    assert e.value.body["param"] == "response_format"
    assert "unknown token '<｜nope｜>'" in e.value.body["message"]
    assert "#/format/content/token" in e.value.body["message"]


# Strict tools: the grammar is the DSML block of calls with each strict tool's parameters by its
# schema (recipe/grammar/tool_calls.hpp); tool_choice required (or a named tool) makes the random
# model call, and every call it makes parses against the tool's schema.

class Forecast(pydantic.BaseModel):
    city: Literal["Paris", "Oslo", "Lima"]
    days: int = pydantic.Field(ge=1, le=7)
    unit: Optional[Literal["celsius", "fahrenheit"]]


class Lookup(pydantic.BaseModel):
    topic: Literal["tides", "winds"]


def test_chat_strict_tool_calls_parse_against_their_pydantic_models(server):
    # openai.pydantic_function_tool sends the model's schema with strict: true; parse() checks
    # every call's arguments against it.
    client = server.openai()
    tools = [openai.pydantic_function_tool(Forecast, name="get_forecast"),
             openai.pydantic_function_tool(Lookup, name="lookup")]
    for seed, choice in ((1, "required"), (2, "required"),
                         (3, {"type": "function", "function": {"name": "get_forecast"}})):
        r = client.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "The forecast?"}], tools=tools,
            tool_choice=choice, max_tokens=800, temperature=1.0, seed=seed, extra_body=CHAT_MODE)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c.message
        assert c.message.tool_calls
        for call in c.message.tool_calls:
            assert call.function.name in ("get_forecast", "lookup")
            model = Forecast if call.function.name == "get_forecast" else Lookup
            assert isinstance(call.function.parsed_arguments, model)


def test_messages_strict_tool_input_follows_its_schema(server):
    client = server.anthropic()
    tool = {"name": "get_forecast", "description": "The weather.", "strict": True,
            "input_schema": Forecast.model_json_schema()}
    for choice in ({"type": "tool", "name": "get_forecast"}, {"type": "any"}):
        m = client.messages.create(
            model=MODEL, max_tokens=800, tools=[tool], tool_choice=choice,
            messages=[{"role": "user", "content": "The forecast?"}], thinking={"type": "disabled"})
        assert m.stop_reason == "tool_use", m.content
        uses = [b for b in m.content if b.type == "tool_use"]
        assert uses
        for u in uses:
            assert u.name == "get_forecast"
            Forecast.model_validate(u.input)


def test_responses_strict_function_arguments_follow_its_schema(server):
    schema = openai.pydantic_function_tool(Forecast)["function"]["parameters"]
    r = server.openai().responses.create(
        model=MODEL, input="The forecast?", max_output_tokens=800, temperature=1.0,
        tools=[{"type": "function", "name": "get_forecast", "parameters": schema, "strict": True}],
        tool_choice="required", reasoning={"effort": "none"})
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls
    for call in calls:
        assert call.name == "get_forecast"
        Forecast.model_validate_json(call.arguments)


def test_parallel_tool_calls_off_makes_one_call_at_most(server):
    # The random model at temperature 2 writes a second call after the first for about one seed
    # in six; with parallel calls off, the same seeds (the same draws up to the first call's
    # end) end the block after one call.
    client = server.openai()
    tools = [openai.pydantic_function_tool(Forecast, name="get_forecast"),
             openai.pydantic_function_tool(Lookup, name="lookup")]

    def calls(seed, parallel):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "The forecast?"}], tools=tools,
            tool_choice="required", parallel_tool_calls=parallel, max_tokens=800, temperature=2.0,
            seed=seed, extra_body=CHAT_MODE)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0].message
        return len(r.choices[0].message.tool_calls)

    several = []
    for seed in range(1, 41):  # bounded: stops at the second seed with several calls
        if calls(seed, True) > 1:
            several.append(seed)
            if len(several) == 2:
                break
    assert several, "no seed of 40 made parallel calls"
    for seed in several + [1]:
        assert calls(seed, False) == 1, seed
    m = server.anthropic().messages.create(
        model=MODEL, max_tokens=800, messages=[{"role": "user", "content": "The forecast?"}],
        tools=[{"name": "lookup", "strict": True, "input_schema": Lookup.model_json_schema()}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True}, thinking={"type": "disabled"})
    assert m.stop_reason == "tool_use", m.content
    assert [b.type for b in m.content if b.type == "tool_use"] == ["tool_use"]


def test_a_strict_tool_schema_the_engine_cannot_enforce_is_refused_naming_the_tool(server):
    schema = {"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}},
              "required": ["a"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}]
    with pytest.raises(openai.BadRequestError) as e:
        server.openai().chat.completions.create(**chat_body("Hi", max_tokens=5, tools=tools))
    assert e.value.body["param"] == "tools[1].function.parameters"
    assert "'not'" in e.value.body["message"] and "#/properties/a" in e.value.body["message"]


def test_a_grammar_that_does_not_compile_is_refused_naming_its_position(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.openai().chat.completions.create(**chat_body(
            "Hi", max_tokens=5, extra_body={"response_format": {"type": "grammar", "grammar": 'root ::= "a" b'}}))
    assert e.value.body["param"] == "response_format"
    assert "line 1, column 14: undefined rule 'b'" in e.value.body["message"]


def test_an_unsupported_schema_is_refused_naming_its_keyword(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.openai().chat.completions.create(**chat_body(
            "Hi", max_tokens=5, response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}))
    assert "'not'" in str(e.value) and "#/properties/a" in str(e.value)


@pytest.mark.parametrize("flag,value,message", [
    ("--spec", "fixed9", "--spec fixed9: expected off, fixed1 .. fixed5 or dspark"),
    ("--overlap", "maybe", "--overlap maybe: expected on or off"),
    ("--eplb", "1", "--eplb 1: expected 2 .. 16 ranks"),
    ("--eplb-interval", "soon", "--eplb-interval soon: expected a duration > 0"),
    ("--window-memory", "lots", "--window-memory: 'lots' is not a size"),
    ("--kv-tokens", "100", "--kv-tokens 100: below the longest context ("),
])
def test_an_unknown_spec_or_overlap_mode_is_refused_before_anything_starts(
        model_dir, tmp_path, flag, value, message):
    run = subprocess.run(
        [troupe(), "serve", os.path.join(ROOT, "examples/topologies/local-cpu.toml"),
         "--model", model_dir, "--engram-map", "identity", "--listen", "127.0.0.1:0",
         "--kv-dir", str(tmp_path / "kv"), flag, value],
        capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 1
    assert message in run.stderr
    assert "loading" not in run.stderr


def test_a_stop_signal_while_the_models_load_stops_the_server_at_once(model_dir, tmp_path):
    # Sent as soon as the server says it is loading (its devices still loading the model, the
    # warm-up request waiting for them): it stops within seconds, status 0, nothing left behind.
    proc = subprocess.Popen(
        [troupe(), "serve", os.path.join(ROOT, "examples/topologies/local-cpu-ep-processes.toml"),
         "--model", model_dir, "--engram-map", "identity", "--listen", "127.0.0.1:0",
         "--kv-dir", str(tmp_path / "kv")], stderr=subprocess.PIPE, text=True)
    log = []
    for line in proc.stderr:
        log.append(line)
        if "loading" in line:
            break
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    log += proc.stderr.readlines()
    assert proc.wait(timeout=60) == 0, "".join(log)
    assert time.monotonic() - started < 30, "".join(log)
    assert log[-1].startswith("troupe serve: SIGTERM while loading: stopped") or \
        log[-1] == "troupe serve: stopped\n", "".join(log)
    time.sleep(1)  # (they exit once their sockets close)
    assert rank_processes(model_dir=model_dir) == []


@pytest.fixture(scope="module")
def spec_server(model_dir, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys-spec") / "keys.txt"
    keys.write_text(API_KEY + "\n")
    s = Server(model_dir, str(keys), str(tmp_path_factory.mktemp("kv-spec")), ("--spec", "fixed3"))
    yield s
    s.stop()
    assert s.proc.returncode == 0, "troupe serve did not stop cleanly on SIGTERM:\n" + "".join(s.log)


def test_speculative_decoding_answers_what_it_answers_without_greedy_seeded_and_structured(
        server, spec_server):
    # (Both schedule overlapped, the default: the speculating server's steps built ahead verify
    # the drafts the step in flight proposes.)
    messages = [{"role": "user", "content": "Describe a supervision tree."}]
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 7}):
        off = server.openai().chat.completions.create(model=MODEL, messages=messages,
                                                      max_tokens=24, **sampling)
        on = spec_server.openai().chat.completions.create(model=MODEL, messages=messages,
                                                          max_tokens=24, **sampling)
        assert served_text(on.choices[0].message) == served_text(off.choices[0].message)
        assert on.usage.completion_tokens == off.usage.completion_tokens
    # Structured output: every verified position is drawn under the grammar's mask.
    for seed in (1, 2):
        args = dict(model=MODEL, messages=[{"role": "user", "content": "Report the sensor."}],
                    response_format=Reading, max_tokens=100, temperature=1.0, seed=seed,
                    extra_body=CHAT_MODE)
        off = server.openai().chat.completions.parse(**args)
        on = spec_server.openai().chat.completions.parse(**args)
        assert isinstance(on.choices[0].message.parsed, Reading)
        assert on.choices[0].message.content == off.choices[0].message.content
    verified = 'troupe_device_drafts_total{device="decode/0",outcome="verified"}'
    assert spec_server.metric(verified) > 0


@pytest.fixture(scope="module")
def eplb_server(model_dir, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys-eplb") / "keys.txt"
    keys.write_text(API_KEY + "\n")
    s = Server(model_dir, str(keys), str(tmp_path_factory.mktemp("kv-eplb")),
               ("--eplb", "4", "--eplb-interval", "1s"))
    yield s
    s.stop()
    assert s.proc.returncode == 0, "troupe serve did not stop cleanly on SIGTERM:\n" + "".join(s.log)


def test_expert_placements_switched_while_serving_change_no_answer(server, eplb_server):
    # The devices run their MoEs as EP groups of 4 ranks, re-placed every second by the
    # router's counts; each switch happens between two steps. Load them until both devices have
    # switched to two of the balancer's placements after the starting one (bounded), then ask
    # what the plain server answers.
    assert any("experts re-placed over 4 EP ranks every 1s" in l for l in eplb_server.log)
    applied = 'troupe_device_expert_placements_total{{device="{}",outcome="applied"}}'
    client = eplb_server.openai()
    for i in range(30):
        if all((eplb_server.metric(applied.format(d)) or 0) >= 3 for d in ("prefill/0", "decode/0")):
            break
        client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
            {"role": "user", "content": f"Warm the experts, round {i}."}])
        time.sleep(0.5)
    for d in ("prefill/0", "decode/0"):
        assert eplb_server.metric(applied.format(d)) >= 3
        assert eplb_server.metric(f'troupe_device_expert_placements_total{{device="{d}",outcome="refused"}}') == 0
        for placement in ("previous", "new"):
            b = eplb_server.metric(f'troupe_eplb_balancedness{{device="{d}",placement="{placement}"}}')
            assert 0 < b <= 1
    messages = [{"role": "user", "content": "Which expert answers this?"}]
    for sampling in ({"temperature": 0, "logprobs": True, "top_logprobs": 2},
                     {"temperature": 1.0, "seed": 11}):
        off = server.openai().chat.completions.create(model=MODEL, messages=messages,
                                                      max_tokens=24, **sampling)
        on = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                            **sampling)
        assert served_text(on.choices[0].message) == served_text(off.choices[0].message)
        if off.choices[0].logprobs is not None:
            assert on.choices[0].logprobs == off.choices[0].logprobs


def rank_processes(pid=None, model_dir=None):
    """The `troupe ep-rank` processes (an EP group's ranks) that process `pid` started, or,
    without a pid, those of any process on `model_dir`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if len(args) > 1 and args[1] == b"ep-rank" and (
                ppid == pid if pid is not None else model_dir.encode() in args):
            found.append(int(entry))
    return found


def test_a_rank_process_killed_mid_stream_re_forms_its_instance_on_the_ranks_left(
        server, model_dir, tmp_path):
    # local-cpu-ep-processes.toml: decode/0 is an EP group of 4 ranks, 2 of them in a process
    # of their own. Four greedy streams run; that process is killed once each has begun. Every
    # stream completes with the plain server's text, and the instance re-forms on the 2 ranks
    # left in its own process (EP 4 -> 2), which answers as the plain server does.
    keys = tmp_path / "keys.txt"
    keys.write_text(API_KEY + "\n")
    s = Server(model_dir, str(keys), str(tmp_path / "kv"), topology="local-cpu-ep-processes.toml")
    try:
        peers = rank_processes(s.proc.pid)
        assert len(peers) == 1, "".join(s.log)
        prompts = [f"Count the ranks of group {i}." for i in range(4)]
        want = [served_text(server.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=32,
            temperature=0).choices[0].message) for p in prompts]
        begun = threading.Barrier(len(prompts) + 1, timeout=TIMEOUT_S)

        def stream(p):
            text, waited = "", False
            for chunk in s.openai().chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=32,
                    temperature=0, stream=True):
                if chunk.choices:
                    text += served_text(chunk.choices[0].delta)
                    if text and not waited:
                        waited = True
                        begun.wait()
            return text, time.monotonic()

        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            futures = [pool.submit(stream, p) for p in prompts]
            begun.wait()
            os.kill(peers[0], signal.SIGKILL)
            killed = time.monotonic()
            got = [f.result(timeout=TIMEOUT_S) for f in futures]
        assert [text for text, _ in got] == want
        assert any(ended > killed for _, ended in got)  # streams were in flight
        assert any("decode/0: 2 rank(s) lost with their processes; it forms on 2 rank(s) (EP 4 -> 2)"
                   in line for line in s.log), "".join(s.log)
        assert rank_processes(s.proc.pid) == []
        after = s.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompts[0]}], max_tokens=32,
            temperature=0)
        assert served_text(after.choices[0].message) == want[0]
    finally:
        s.stop()
    assert s.proc.returncode == 0, "".join(s.log)
    assert any("facts: no violations" in line for line in s.log), "".join(s.log)
