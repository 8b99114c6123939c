"""troupe.recipe against the recipe's goldens and the troupe CLI's recipe commands (tokenize,
detokenize, encode, parse-stream): the bindings must give what the C++ CLI gives."""

import gzip
import hashlib
import json

import pytest

from conftest import GOLDEN, ROOT, golden_lines
from troupe import recipe
from troupe.recipe import (ChatCompletionRequest, ConversionError, ConversionOptions,
                           DeepseekV41Encoding, DeepseekV4Encoding, InferenceChunk,
                           MessagesRequest, PromptUsage, ResponsesRequest, StreamParser,
                           StreamProcessor, Tokenizer)

PROTOCOLS = {"chat_completions": ChatCompletionRequest, "responses": ResponsesRequest,
             "messages": MessagesRequest}
CLI_PROTOCOL = {"chat_completions": "chat", "responses": "responses", "messages": "messages"}


def corpus():
    with gzip.open(GOLDEN / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def varint_records(name, base=None):
    """ids.<mode>.bin.gz: per record a LEB128 count then the ids; for plain and trusted (base =
    raw's records) a count of 0 means "as raw", else count + 1."""
    data = gzip.decompress((GOLDEN / name).read_bytes())
    i, out = 0, []

    def nxt():
        nonlocal i
        v = shift = 0
        while True:
            b = data[i]
            i += 1
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return v
            shift += 7

    while i < len(data):
        n = nxt()
        if base is not None:
            if n == 0:
                out.append(base[len(out)])
                continue
            n -= 1
        out.append([nxt() for _ in range(n)])
    return out


def test_the_shipped_tokenizer_is_the_repository_s():
    a = hashlib.sha256(recipe.DEFAULT_TOKENIZER.read_bytes()).hexdigest()
    b = hashlib.sha256((ROOT / "recipe/data/deepseek-v4/tokenizer.json.gz").read_bytes()).hexdigest()
    assert a == b


@pytest.mark.parametrize("mode", ["raw", "plain", "trusted"])
def test_encode_batch_equals_the_hf_goldens_on_every_corpus_record(tok, mode):
    raw = varint_records("ids.raw.bin.gz")
    want = raw if mode == "raw" else varint_records(f"ids.{mode}.bin.gz", raw)
    records = corpus()
    got = tok.encode_batch(records, mode=mode, threads=2)
    assert len(got) == len(want) == len(records)
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, f"{len(bad)} records differ, first {bad[0]}: {records[bad[0]][:80]!r}"


def test_encode_and_encode_batch_agree_and_decode_round_trips(tok):
    records = corpus()[::97]
    batch = tok.encode_batch(records, mode="plain", threads=1)
    for text, ids in zip(records, batch):
        assert tok.encode(text, mode="plain") == ids
        assert tok.decode(ids) == text
        assert tok.encode(text.encode("utf-8"), mode="plain") == ids


def test_decode_stream_concatenates_to_decode(tok):
    text = "".join(corpus()[:200])
    ids = tok.encode(text)
    d = tok.decode_stream()
    out = "".join(d.push(ids[i:i + 3]) for i in range(0, len(ids), 3)) + d.flush()
    assert out == tok.decode(ids) == text


def test_invalid_utf8_bytes_encode_as_the_replacement_character(tok):
    assert tok.encode(b"a\xffb") == tok.encode("a\ufffdb")


def test_tokenize_matches_the_cli_in_every_mode(tok, troupe_cli):
    text = "\n".join(corpus()[::40])  # ~340 records of every kind, one text
    for mode, flag in (("plain", []), ("trusted", ["--trusted"]), ("raw", ["--raw"])):
        r = troupe_cli("tokenize", *flag, "--file", "-", input=text)
        assert r.returncode == 0, r.stderr
        assert tok.encode(text, mode=mode) == json.loads(r.stdout), mode


def test_detokenize_matches_the_cli(tok, troupe_cli):
    ids = tok.encode("\n".join(corpus()[5::50]), mode="trusted") + [0, 1, 128803]
    r = troupe_cli("detokenize", input=json.dumps(ids))
    assert r.returncode == 0, r.stderr
    assert tok.decode(ids) == r.stdout
    r = troupe_cli("detokenize", "--skip-special", input=json.dumps(ids))
    assert tok.decode(ids, skip_special_tokens=True) == r.stdout


def protocol_goldens():
    for protocol in PROTOCOLS:
        for g in golden_lines(f"{protocol}.v4.jsonl.gz"):
            yield protocol, g


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_every_protocol_golden_converts_and_encodes_as_the_reference(tok, protocol):
    v4 = DeepseekV4Encoding().with_tokenizer(tok)
    v41 = DeepseekV41Encoding()
    # The reference knows these two models only (err.unknown_model).
    options = ConversionOptions(models=("DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash"))
    accepted = rejected = 0
    for g in golden_lines(f"{protocol}.v4.jsonl.gz"):
        req = PROTOCOLS[protocol](g["request"])
        if "error" in g:
            # Ours accepts n > 1 and the developer role on purpose (docs/recipe.md).
            if protocol == "chat_completions" and g["name"] in ("err.n_2", "err.developer_role"):
                continue
            with pytest.raises(ConversionError) as e:
                req.convert(options)
            assert e.value.status_code == 400
            rejected += 1
            continue
        conv = req.convert(options).conversation
        p = v4.encode_prompt(conv)
        assert (p.prompt, p.ids) == (g["prompt"], g["ids"]), g["name"]
        r41 = v41.render_conversation(conv)
        assert r41.prompt == g["prompt_v41"], g["name"]
        assert [r41.prompt[a:b] for a, b in r41.special_ranges] == g["control_v41"], g["name"]
        accepted += 1
    assert accepted > 30 and rejected > 20


def test_v41_models_are_converted_for_v41(tok):
    for protocol, g in protocol_goldens():
        if "prompt_v41_model" not in g:
            continue
        body = json.loads(g["request"]) if isinstance(g["request"], str) else dict(g["request"])
        body["model"] = "DeepSeek-V4.1-Flash"
        req = PROTOCOLS[protocol](body).convert()
        assert req.model_version == "v41"
        assert DeepseekV41Encoding().render_conversation(req.conversation).prompt == g["prompt_v41_model"], g["name"]
    with pytest.raises(RuntimeError):  # the shipped V4 vocabulary has no <｜System｜>
        DeepseekV41Encoding(tok).encode(req.conversation)


def sample(protocol, n, accepted=True):
    gs = [g for g in golden_lines(f"{protocol}.v4.jsonl.gz") if ("error" not in g) == accepted]
    return gs[:: max(1, len(gs) // n)][:n]


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_encode_matches_the_cli(tok, troupe_cli, tmp_path, protocol):
    for g in sample(protocol, 3):
        body = g["request"] if isinstance(g["request"], str) else json.dumps(g["request"], ensure_ascii=False)
        r = troupe_cli("encode", "--protocol", CLI_PROTOCOL[protocol], "-", input=body)
        assert r.returncode == 0, r.stderr
        want = json.loads(r.stdout)
        _, p = recipe.encode_request(body, protocol, tok)
        assert {"prompt": p.prompt, "ids": p.ids} == want, g["name"]
    for g in sample(protocol, 1, accepted=False):
        body = g["request"] if isinstance(g["request"], str) else json.dumps(g["request"], ensure_ascii=False)
        r = troupe_cli("encode", "--protocol", CLI_PROTOCOL[protocol], "-", input=body)
        assert r.returncode == 1
        with pytest.raises(ConversionError) as e:
            PROTOCOLS[protocol](body).convert()
        assert r.stderr.strip() == f"error: {e.value.status_code} {e.value.body}", g["name"]


def stream_goldens():
    chat = [dict(g, protocol="chat_completions") for g in golden_lines("stream.v4.jsonl.gz")]
    events = golden_lines("stream_events.v4.jsonl.gz")
    return chat[::9] + [g for g in events if g["protocol"] == "responses"][::12] + \
        [g for g in events if g["protocol"] == "messages"][::12]


def test_stream_processor_matches_parse_stream(tok, troupe_cli, tmp_path):
    cases = stream_goldens()
    assert len(cases) >= 9
    for g in cases:
        protocol = g["protocol"]
        body = g["request"] if isinstance(g["request"], str) else json.dumps(g["request"], ensure_ascii=False)
        (tmp_path / "req.json").write_text(body, encoding="utf-8")
        r = troupe_cli("parse-stream", "--protocol", CLI_PROTOCOL[protocol], "--request",
                       tmp_path / "req.json", "--finish", g["finish"], "--id", "resp_1",
                       input=json.dumps(g["ids"]))
        assert r.returncode == 0, r.stderr
        want = [json.loads(line) for line in r.stdout.splitlines()]

        req, prompt = recipe.encode_request(body, protocol, tok)
        gen = PROTOCOLS[protocol].chunk_generator(req, "resp_1", req.model)
        sp = StreamProcessor(gen, req.parsing_options, tok)
        got = sp.push(InferenceChunk.ready(prompt_usage=PromptUsage(prompt_tokens=len(prompt.ids))))
        for i in g["ids"]:  # one id at a time, as the CLI feeds them
            got += sp.push(InferenceChunk.tokens([i]))
        got += sp.push(InferenceChunk.finish(g["finish"]))
        assert sp.finish() == [] and sp.finished
        assert [e.to_dict() for e in got] == want, g["name"]


def test_stream_parser_matches_parse_stream_neutral(tok, troupe_cli, tmp_path):
    for g in [dict(g) for g in golden_lines("stream.v4.jsonl.gz")][1::8]:
        body = g["request"] if isinstance(g["request"], str) else json.dumps(g["request"], ensure_ascii=False)
        (tmp_path / "req.json").write_text(body, encoding="utf-8")
        r = troupe_cli("parse-stream", "--neutral", "--request", tmp_path / "req.json",
                       "--finish", g["finish"], input=json.dumps(g["ids"]))
        assert r.returncode == 0, r.stderr
        want = [json.loads(line) for line in r.stdout.splitlines()]
        req, prompt = recipe.encode_request(body, "chat_completions", tok)
        p = StreamParser.for_request(tok, req, prompt_tokens=len(prompt.ids))
        got = []
        for i in g["ids"]:
            got += p.push(i)
        got += p.finish(g["finish"])
        for e in got:  # the CLI prints neither the text's ids nor a stop sequence
            e.pop("tokens", None)
            e.pop("stop_sequence", None)
        assert got == want, g["name"]
        assert p.finished


def test_text_tokens_name_each_answer_id_once_however_ids_are_chunked(tok):
    ids = tok.encode("Hmm</think>Hello, world! How are you?", mode="trusted")
    whole = StreamParser(tok, start="reasoning")
    events = whole.push(ids) + whole.finish()
    one = StreamParser(tok, start="reasoning")
    chunked = [e for i in ids for e in one.push(i)] + one.finish()
    def text(es): return "".join(e["text"] for e in es if e["type"] == "text")
    def toks(es): return [t for e in es if e["type"] == "text" for t in e["tokens"]]
    assert text(events) == text(chunked) == "Hello, world! How are you?"
    assert toks(events) == toks(chunked) == list(range(ids.index(tok.token_to_id("</think>")) + 1, len(ids)))
    assert events[-1]["type"] == "usage" and events[-1]["reasoning_tokens"] == 2


def test_conversion_errors_carry_the_status_param_and_body():
    with pytest.raises(ConversionError) as e:
        ChatCompletionRequest({"model": "x", "messages": [{"role": "wizard"}]}).convert()
    assert e.value.status_code == 400 and e.value.param == "messages[0].role"
    assert json.loads(e.value.body)["error"]["param"] == "messages[0].role"
    with pytest.raises(ConversionError) as e:
        MessagesRequest({"model": "x", "max_tokens": 1}).convert()
    assert json.loads(e.value.body)["type"] == "error"
    with pytest.raises(ConversionError) as e:
        ChatCompletionRequest({"model": "x", "messages": [{"role": "user", "content": "hi"}]}).convert(
            ConversionOptions(models=("DeepSeek-V4-Pro",)))
    assert e.value.code == "model_not_found"


def test_converted_request_reports_its_options():
    req = ChatCompletionRequest({
        "model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": "json please"}],
        "temperature": 0.5, "max_tokens": 10, "stop": ["END"], "stream": True,
        "response_format": {"type": "json_object"},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    }).convert(ConversionOptions(default_thinking_mode=False))
    assert req.model == req.params["model"] == "DeepSeek-V4-Pro" and req.model_version == "v4"
    assert req.stream and req.inference_options.max_tokens == 10
    assert req.inference_options.temperature == 0.5 and req.inference_options.stop == ["END"]
    assert req.parsing_options.parse_tool_calls and req.parsing_options.thinking_initial_stage is None
    assert req.parsing_options.stop_sequences == ["END"]
    c = req.conversation
    assert not c.thinking_mode and c.response_format == "json_object" and c.tools[0]["name"] == "f"
    assert c.messages[0]["role"] == "user" and c.messages[0]["content"] == "json please"


def test_a_stop_sequence_ends_the_text_and_the_finish_reason_is_stop(tok):
    p = StreamParser(tok, stop=["END"])
    events = p.push(tok.encode("Hello END and more")) + p.finish("length")
    assert "".join(e["text"] for e in events if e["type"] == "text") == "Hello "
    assert {"type": "finish", "reason": "stop", "stop_sequence": "END"} in events
    assert p.stopped_by_sequence and p.ended and p.finished
