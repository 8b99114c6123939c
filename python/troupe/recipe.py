"""troupe's recipe from Python: API requests <-> DeepSeek-V4 / V4.1 tokens.

The tokenizer (exact id parity with Hugging Face ``tokenizers``), the conversion of Chat
Completions, Responses and Anthropic Messages request bodies, the V4 and V4.1 prompt encoders,
and the streaming output parser, shaped like ``deepseek_recipe`` so that switching is a small
diff (docs/python.md has the mapping)::

    from troupe.recipe import ChatCompletionRequest, ConversionOptions, DeepseekV4Encoding, Tokenizer

    tok = Tokenizer.default()                      # the shipped DeepSeek-V4 tokenizer
    req = ChatCompletionRequest({"model": "DeepSeek-V4-Pro",
                                 "messages": [{"role": "user", "content": "Hi"}]})
    converted = req.convert(ConversionOptions())
    ids = DeepseekV4Encoding().with_tokenizer(tok).encode(converted.conversation)

The GIL is released while text is tokenized, prompts are encoded and ids are parsed.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Sequence, Union

from . import _core

__all__ = [
    "DEFAULT_TOKENIZER",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChunkGenerator",
    "Conversation",
    "ConversationRequest",
    "ConversionError",
    "ConversionOptions",
    "DeepseekV41Encoding",
    "DeepseekV4Encoding",
    "Detokenizer",
    "EncodedPrompt",
    "InferenceChunk",
    "InferenceFinishReason",
    "InferenceOptions",
    "MessagesRequest",
    "MessagesStreamEvent",
    "ParsingOptions",
    "PromptUsage",
    "RenderedPrompt",
    "ResponsesRequest",
    "ResponsesStreamEvent",
    "StreamEvent",
    "StreamParser",
    "StreamProcessor",
    "Tokenizer",
    "encode_request",
]

#: The DeepSeek-V4 tokenizer.json.gz shipped in the package.
DEFAULT_TOKENIZER = pathlib.Path(__file__).resolve().parent / "data" / "deepseek-v4" / "tokenizer.json.gz"

EncodeMode = Literal["plain", "trusted", "raw"]
Protocol = Literal["chat_completions", "responses", "messages"]
ModelVersion = Literal["v4", "v41"]
FinishReason = Literal["stop", "length", "content_filter"]
RequestBody = Union[bytes, str, "dict[str, Any]"]
#: A protocol-neutral stream event, as ``troupe parse-stream --neutral`` prints it: ``type`` is
#: ``text`` / ``reasoning`` (``text``; a text event also lists in ``tokens`` the positions of the
#: ids whose first answer byte it carries), ``tool_call`` (``index``, ``name``), ``arguments``
#: (``index``, ``text``), ``finish`` (``reason``, ``stop_sequence`` when one ended the text) or
#: ``usage`` (``prompt_tokens``, ``completion_tokens``, ``reasoning_tokens`` in thinking mode).
StreamEvent = dict


def _ids(ids: int | Iterable[int]) -> list[int]:
    return [ids] if isinstance(ids, int) else list(ids)


class Tokenizer:
    """A byte-level BPE tokenizer read from a Hugging Face ``tokenizer.json`` (or ``.json.gz``).

    Modes (``mode=``): ``"trusted"`` matches every added token written in the text (HF's
    ``encode``, deepseek_recipe's ``Tokenizer.encode``); ``"plain"`` splits the added tokens marked
    special as text (HF ``split_special_tokens=True``); ``"raw"`` matches none, every string is
    text (how the prompt encoders tokenize conversation text).
    """

    __slots__ = ("_native",)

    def __init__(self, native: _core.Tokenizer) -> None:
        self._native = native

    @staticmethod
    def from_file(path: str | pathlib.Path) -> Tokenizer:
        """Loads a ``tokenizer.json``, or a gzip-compressed one when the name ends in ``.gz``.

        Raises ``RuntimeError`` for a missing file or a feature the tokenizer does not implement.
        """
        return Tokenizer(_core.Tokenizer.from_file(str(path)))

    @staticmethod
    def from_str(text: str) -> Tokenizer:
        """Loads a tokenizer from the text of a ``tokenizer.json``."""
        return Tokenizer(_core.Tokenizer.from_str(text))

    @staticmethod
    def default() -> Tokenizer:
        """The DeepSeek-V4 tokenizer shipped in the package (:data:`DEFAULT_TOKENIZER`)."""
        return Tokenizer.from_file(DEFAULT_TOKENIZER)

    def encode(self, text: str | bytes, mode: EncodeMode = "trusted") -> list[int]:
        """The ids of ``text``; no BOS is added. Invalid UTF-8 in ``bytes`` becomes U+FFFD."""
        return self._native.encode(text, mode)

    def encode_batch(self, texts: Iterable[str | bytes], mode: EncodeMode = "trusted",
                     threads: int = 0) -> list[list[int]]:
        """The ids of each text, tokenized on ``threads`` threads (0: one per CPU) without the GIL."""
        return self._native.encode_batch(texts, mode, threads)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (HF ``decode``: invalid UTF-8 becomes U+FFFD; unknown ids are skipped)."""
        return self._native.decode(_ids(ids), skip_special_tokens)

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        """The raw bytes ``ids`` stand for (a token may end in the middle of a UTF-8 sequence)."""
        return self._native.decode_bytes(_ids(ids), skip_special_tokens)

    def decode_stream(self, skip_special_tokens: bool = False) -> Detokenizer:
        """An incremental decoder for ids as they are generated."""
        return Detokenizer(self, skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """The largest id + 1."""
        return self._native.vocab_size

    def get_vocab_size(self) -> int:
        """The largest id + 1 (HF ``tokenizers``' spelling)."""
        return self._native.vocab_size

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary string (byte-level form) or an added token's content."""
        return self._native.token_to_id(token)

    def is_special(self, id: int) -> bool:
        """Whether ``id`` is an added token marked special."""
        return self._native.is_special(id)


class Detokenizer:
    """Decodes ids as they are generated: ``push`` returns the text that is complete, holding back
    an unfinished UTF-8 sequence; ``flush`` returns what is held. The concatenation of every push
    and the flush equals ``Tokenizer.decode`` of all the ids."""

    __slots__ = ("_native",)

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._native = _core.Detokenizer(tokenizer._native, skip_special_tokens)

    def push(self, ids: int | Iterable[int]) -> str:
        return self._native.push(_ids(ids))

    def flush(self) -> str:
        return self._native.flush()


class ConversionError(Exception):
    """A request that conversion rejects: the HTTP status and the protocol's error body.

    ``status_code`` and ``body`` as deepseek_recipe's ``ConversionError``; ``message``, ``param``
    (the JSON path of the offending field), ``type`` and ``code`` as in the body.
    """

    def __init__(self, status_code: int, body: str, message: str, type: str,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.body = body
        self.message = message
        self.type = type
        self.param = param
        self.code = code


@dataclass(frozen=True)
class ConversionOptions:
    """How requests are converted (one setting for the three protocols).

    ``default_thinking_mode``: thinking mode for a request that does not say; ``models``: the
    accepted model names (empty: any); ``v41_models``: the models converted for DeepSeek-V4.1;
    ``max_tokens_limit``, ``max_n``: limits of the request's fields; ``reject_images``: refuse
    image parts instead of V4's ``[Unsupported Image]`` placeholder.
    """

    default_thinking_mode: bool = True
    models: tuple[str, ...] = ()
    v41_models: tuple[str, ...] = ("DeepSeek-V4.1-Flash",)
    max_tokens_limit: int = 393216
    max_n: int = 128
    reject_images: bool = False

    def with_default_thinking_mode(self, default_thinking_mode: bool) -> ConversionOptions:
        return _replace(self, default_thinking_mode=default_thinking_mode)

    def with_models(self, models: Sequence[str]) -> ConversionOptions:
        return _replace(self, models=tuple(models))

    def with_v41_models(self, models: Sequence[str]) -> ConversionOptions:
        return _replace(self, v41_models=tuple(models))


def _replace(o: ConversionOptions, **kw: Any) -> ConversionOptions:
    from dataclasses import replace
    return replace(o, **kw)


def _body_text(body: RequestBody) -> str | bytes:
    if isinstance(body, dict):
        return json.dumps(body, ensure_ascii=False)
    if isinstance(body, (str, bytes)):
        return body
    raise TypeError("a request body is a dict, str or bytes")


class Conversation:
    """A converted conversation (read-only): what the prompt encoders render."""

    __slots__ = ("_native", "_d")

    def __init__(self, native: _core.Request) -> None:
        self._native = native
        self._d = native.conversation

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Each message as a dict: role, content, reasoning_content, tool_calls, tool_call_id,
        prefix, images (byte offsets of V4.1 image placeholders in the content)."""
        return self._d["messages"]

    @property
    def thinking_mode(self) -> bool:
        return self._d["thinking"]

    @property
    def tools(self) -> list[dict[str, Any]]:
        """Each tool: name, description, parameters (JSON Schema text, key order kept)."""
        return self._d["tools"]

    @property
    def tool_choice(self) -> Literal["auto", "none", "required"]:
        return self._d["tool_choice"]

    @property
    def reasoning_effort(self) -> Literal["low", "high", "xhigh", "max"] | None:
        return self._d["reasoning_effort"]

    @property
    def effort_level(self) -> int | None:
        """V4.1's continuous reasoning effort (1-100) when the request gave a number."""
        return self._d["effort_level"]

    @property
    def response_format(self) -> Literal["text", "json_object", "json_schema", "regex", "grammar"]:
        return self._d["response_format"]["type"]

    @property
    def response_schema(self) -> Any | None:
        s = self._d["response_format"].get("schema")
        return None if s is None else json.loads(s)

    @property
    def response_regex(self) -> str | None:
        return self._d["response_format"].get("regex")

    @property
    def response_grammar(self) -> str | None:
        """The EBNF (GBNF) grammar of a `grammar` response format."""
        return self._d["response_format"].get("grammar")

    def __repr__(self) -> str:
        return f"Conversation({len(self.messages)} messages, thinking_mode={self.thinking_mode})"


@dataclass(frozen=True)
class InferenceOptions:
    """The request's sampling and serving fields, as sent (None: not in the request)."""

    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    n: int
    stop: list[str]
    logprobs: bool
    top_logprobs: int | None
    top_k: int | None
    seed: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    response_format: str
    response_format_json: str | None
    reasoning_effort: str | None
    tool_choice_function: str | None
    image_parts: int
    include_usage: bool


@dataclass
class ParsingOptions:
    """Where the stream parser starts and what it parses (deepseek_recipe's ``ParsingOptions``).

    ``thinking_initial_stage``: None (thinking mode off), ``"reasoning"``,
    ``"reasoning_continuation"`` or ``"content_continuation"``; ``starts_in_tool_calls``: inside
    the tool-call block the prompt opened (``tool_choice`` required), wins over the stage.
    """

    parse_tool_calls: bool = True
    starts_in_tool_calls: bool = False
    thinking_initial_stage: Literal["reasoning", "reasoning_continuation", "content_continuation"] | None = None
    stop_sequences: list[str] = field(default_factory=list)

    def _start(self) -> str:
        if self.starts_in_tool_calls:
            return "tool_calls"
        return self.thinking_initial_stage or "content"


class ConversationRequest:
    """A converted request: the conversation, the inference and parsing options, the model version."""

    __slots__ = ("_native", "conversation", "inference_options", "parsing_options")

    def __init__(self, native: _core.Request) -> None:
        self._native = native
        self.conversation = Conversation(native)
        p = native.params
        self.inference_options = InferenceOptions(
            **{k: p[k] for k in InferenceOptions.__dataclass_fields__})
        start = native.stream_start
        self.parsing_options = ParsingOptions(
            parse_tool_calls=native.parse_tool_calls,
            starts_in_tool_calls=start == "tool_calls",
            thinking_initial_stage=None if start in ("content", "tool_calls") else start,
            stop_sequences=list(native.stop))

    @property
    def protocol(self) -> Protocol:
        return self._native.protocol

    @property
    def model(self) -> str:
        return self._native.model

    @property
    def model_version(self) -> ModelVersion:
        """``"v41"`` for the models of ``ConversionOptions.v41_models``, else ``"v4"``: which of
        :class:`DeepseekV4Encoding` / :class:`DeepseekV41Encoding` renders it."""
        return self._native.format

    @property
    def stream(self) -> bool:
        return self._native.params["stream"]

    @property
    def params(self) -> dict[str, Any]:
        """Every serving field of the request as a dict (``model``, ``stream`` and the rest)."""
        return self._native.params


class _ProtocolRequest:
    _protocol: Protocol

    def __init__(self, body: RequestBody) -> None:
        self._body = _body_text(body)

    @property
    def model(self) -> str:
        """The requested model name ("" when the body names none or is not JSON)."""
        try:
            m = json.loads(self._body).get("model")
        except (ValueError, AttributeError):
            return ""
        return m if isinstance(m, str) else ""

    def convert(self, options: ConversionOptions | None = None) -> ConversationRequest:
        """Validates and converts the request; raises :class:`ConversionError` when it is invalid."""
        o = options or ConversionOptions()
        r = _core.convert(self._protocol, self._body, o.default_thinking_mode, list(o.models),
                          list(o.v41_models), o.max_tokens_limit, o.max_n, o.reject_images)
        if isinstance(r, _core.ApiError):
            raise ConversionError(r.status, r.body, r.message, r.type, r.param, r.code)
        return ConversationRequest(r)

    @classmethod
    def chunk_generator(cls, request: ConversationRequest, id: str, model: str) -> ChunkGenerator:
        """What a :class:`StreamProcessor` renders ``request``'s output with: this protocol's events."""
        return ChunkGenerator(request, id, model)


class ChatCompletionRequest(_ProtocolRequest):
    """An OpenAI Chat Completions request body (dict, JSON str or bytes)."""

    _protocol = "chat_completions"


class ResponsesRequest(_ProtocolRequest):
    """An OpenAI Responses request body (dict, JSON str or bytes)."""

    _protocol = "responses"


class MessagesRequest(_ProtocolRequest):
    """An Anthropic Messages request body (dict, JSON str or bytes)."""

    _protocol = "messages"


@dataclass(frozen=True)
class RenderedPrompt:
    """The prompt text and the ``(start, end)`` code point ranges (Python ``str`` indices) of its
    control tokens, ascending: ``prompt[start:end]`` spells one control token."""

    prompt: str
    special_ranges: list[tuple[int, int]]


@dataclass(frozen=True)
class EncodedPrompt:
    """The prompt text, its ids, and the positions in ``ids`` of the encoder's control ids."""

    prompt: str
    ids: list[int]
    control: list[int]


class DeepseekV4Encoding:
    """The DeepSeek-V4 prompt encoder: renders a conversation and, with a tokenizer, encodes it.

    Conversation text is tokenized in raw mode and the control tokens are added as ids, so no
    text of the conversation can become a control token. ``threads`` > 1 (0: one per CPU)
    tokenizes long prompts in parallel (the same ids).
    """

    _format: ModelVersion = "v4"

    def __init__(self, tokenizer: Tokenizer | None = None, *, threads: int = 1) -> None:
        self._tokenizer = tokenizer
        self._threads = threads

    def with_tokenizer(self, tokenizer: Tokenizer) -> DeepseekV4Encoding:
        """A new encoder that uses ``tokenizer`` for ``encode``."""
        return type(self)(tokenizer, threads=self._threads)

    def render_conversation(self, conversation: Conversation) -> RenderedPrompt:
        text, ranges = _core.render_prompt(conversation._native, self._format)
        return RenderedPrompt(text, ranges)

    def encode(self, conversation: Conversation) -> list[int]:
        """The prompt's ids. Raises ``RuntimeError`` without a tokenizer, or when the tokenizer
        lacks a control token of this format (the shipped V4 vocabulary has no V4.1 ``<｜System｜>``)."""
        return self.encode_prompt(conversation).ids

    def encode_prompt(self, conversation: Conversation) -> EncodedPrompt:
        """The prompt's text, ids and control positions."""
        if self._tokenizer is None:
            raise RuntimeError("no tokenizer attached: use with_tokenizer")
        text, ids, control = _core.encode_prompt(conversation._native, self._tokenizer._native,
                                                 self._format, self._threads)
        return EncodedPrompt(text, ids, control)


class DeepseekV41Encoding(DeepseekV4Encoding):
    """The DeepSeek-V4.1 prompt encoder (``<｜System｜>`` turns, the 1-100 effort line, V4.1 DSML)."""

    _format: ModelVersion = "v41"


def encode_request(body: RequestBody, protocol: Protocol = "chat_completions",
                   tokenizer: Tokenizer | None = None,
                   options: ConversionOptions | None = None) -> tuple[ConversationRequest, EncodedPrompt]:
    """A request body -> the converted request and its prompt, encoded for the request's model
    version (``troupe encode``). Raises :class:`ConversionError` for an invalid request."""
    cls = {"chat_completions": ChatCompletionRequest, "chat": ChatCompletionRequest,
           "responses": ResponsesRequest, "messages": MessagesRequest}.get(protocol)
    if cls is None:
        raise ValueError("protocol must be 'chat_completions', 'responses' or 'messages'")
    req = cls(body).convert(options)
    enc = DeepseekV41Encoding if req.model_version == "v41" else DeepseekV4Encoding
    return req, enc(tokenizer or Tokenizer.default()).encode_prompt(req.conversation)


class StreamParser:
    """Generated ids -> protocol-neutral events (:data:`StreamEvent` dicts).

    ``push`` returns the events the ids confirm (text is returned as soon as it cannot change:
    only a possible DSML tag start, trailing newlines, a possible stop sequence and an incomplete
    UTF-8 sequence are held back); ``finish`` the rest, the finish reason and the usage. Control
    tokens are recognised by id only: text that spells ``</think>`` or a DSML tag is text.
    """

    __slots__ = ("_native",)

    def __init__(self, tokenizer: Tokenizer, *,
                 start: Literal["content", "content_continuation", "reasoning",
                                "reasoning_continuation", "tool_calls"] = "content",
                 parse_tool_calls: bool = False, stop: Sequence[str] = (),
                 prompt_tokens: int = 0, cached_prompt_tokens: int = 0) -> None:
        self._native = _core.StreamParser.create(tokenizer._native, start, parse_tool_calls,
                                                 list(stop), prompt_tokens, cached_prompt_tokens)

    @classmethod
    def for_request(cls, tokenizer: Tokenizer, request: ConversationRequest,
                    prompt_tokens: int = 0, cached_prompt_tokens: int = 0) -> StreamParser:
        """The parser for what the model generates after ``request``'s prompt (its thinking mode,
        tools, ``tool_choice``, assistant prefix and ``stop``)."""
        self = cls.__new__(cls)
        self._native = _core.StreamParser.for_request(tokenizer._native, request._native,
                                                      prompt_tokens, cached_prompt_tokens)
        return self

    def push(self, ids: int | Iterable[int]) -> list[StreamEvent]:
        return self._native.push(_ids(ids))

    def finish(self, finish_reason: FinishReason = "stop") -> list[StreamEvent]:
        """The backend stopped (``finish_reason``): what is held, the finish and the usage event."""
        return self._native.finish(finish_reason)

    @property
    def finished(self) -> bool:
        return self._native.finished

    @property
    def ended(self) -> bool:
        """The end-of-sentence id or a stop sequence was seen: later ids are ignored."""
        return self._native.ended

    @property
    def stopped_by_sequence(self) -> bool:
        """The output ended at one of the ``stop`` sequences (the text before it was emitted)."""
        return self._native.stopped_by_sequence

    @property
    def usage(self) -> dict[str, int | None]:
        """The token counts so far: prompt, cached prompt, completion and reasoning tokens."""
        return self._native.usage


# --- deepseek_recipe's streaming shape: chunk generators, inference chunks, a stream processor ---

class InferenceFinishReason:
    """Why the backend stopped (deepseek_recipe's names)."""

    Stop: FinishReason = "stop"
    Length: FinishReason = "length"
    ContentFilter: FinishReason = "content_filter"


@dataclass(frozen=True)
class PromptUsage:
    prompt_tokens: int = 0
    prompt_cache_hit_tokens: int = 0


@dataclass(frozen=True)
class InferenceChunk:
    """One backend update: ``ready`` (prompt usage), ``tokens`` (generated ids) or ``finish``.
    Text chunks of deepseek_recipe are not supported: troupe's parser reads ids."""

    kind: Literal["ready", "tokens", "finish"]
    token_ids: list[int] | None = None
    finish_reason: FinishReason | None = None
    prompt_usage: PromptUsage | None = None

    @staticmethod
    def ready(*, prompt_usage: PromptUsage | None = None) -> InferenceChunk:
        return InferenceChunk("ready", prompt_usage=prompt_usage or PromptUsage())

    @staticmethod
    def tokens(token_ids: Sequence[int]) -> InferenceChunk:
        return InferenceChunk("tokens", token_ids=list(token_ids))

    @staticmethod
    def finish(finish_reason: FinishReason) -> InferenceChunk:
        return InferenceChunk("finish", finish_reason=finish_reason)


class _JsonEvent:
    """One stream event of a protocol: ``to_json()`` is the SSE data, ``to_dict()`` the object."""

    __slots__ = ("_json",)

    def __init__(self, text: str) -> None:
        self._json = text

    def to_json(self) -> str:
        return self._json

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self._json)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._json})"


class ChatCompletionChunk(_JsonEvent):
    """A ``chat.completion.chunk`` object."""


class ResponsesStreamEvent(_JsonEvent):
    """A Responses stream event (``response.created`` ... ``response.completed``)."""


class MessagesStreamEvent(_JsonEvent):
    """An Anthropic Messages stream event (``message_start`` ... ``message_stop``)."""


_EVENT_TYPES = {"chat_completions": ChatCompletionChunk, "responses": ResponsesStreamEvent,
                "messages": MessagesStreamEvent}


@dataclass(frozen=True)
class ChunkGenerator:
    """The request, response id and model a :class:`StreamProcessor` renders events for."""

    request: ConversationRequest
    id: str
    model: str


class StreamProcessor:
    """Turns backend chunks into the request protocol's stream events, as deepseek_recipe's
    ``StreamProcessor``: push ``InferenceChunk.ready(prompt_usage=...)`` first (the prompt's
    token counts), then ``InferenceChunk.tokens(ids)``, then ``InferenceChunk.finish(reason)``."""

    def __init__(self, generator: ChunkGenerator, options: ParsingOptions | None = None,
                 tokenizer: Tokenizer | None = None, *, created: int = 0) -> None:
        if tokenizer is None:
            raise RuntimeError("troupe's stream processor reads ids: pass a tokenizer")
        self._gen = generator
        self._options = options or generator.request.parsing_options
        self._tokenizer = tokenizer
        self._created = created
        self._native: _core.EventStream | None = None
        self._event = _EVENT_TYPES[generator.request.protocol]
        self._closed = False

    def _open(self, usage: PromptUsage) -> list[_JsonEvent]:
        o = self._options
        self._native = _core.EventStream(
            self._tokenizer._native, self._gen.request._native, self._gen.id, self._gen.model,
            self._created, usage.prompt_tokens, usage.prompt_cache_hit_tokens, o._start(),
            o.parse_tool_calls, list(o.stop_sequences))
        return [self._event(s) for s in self._native.start()]

    @property
    def finished(self) -> bool:
        return self._native is not None and self._native.finished and not self._closed

    def push(self, chunk: InferenceChunk) -> list[_JsonEvent]:
        """The events that ``chunk`` confirms. Raises ``RuntimeError`` after finish or close."""
        if self._closed or (self._native is not None and self._native.finished):
            raise RuntimeError("the stream processor has finished")
        out: list[_JsonEvent] = []
        if self._native is None:
            out += self._open(chunk.prompt_usage or PromptUsage())
        if chunk.kind == "tokens":
            out += [self._event(s) for s in self._native.push(chunk.token_ids or [])]
        elif chunk.kind == "finish":
            out += [self._event(s) for s in self._native.finish(chunk.finish_reason or "stop")]
        return out

    def finish(self) -> list[_JsonEvent]:
        """Ends the stream (as a ``stop``) unless a finish chunk did; then yields nothing more."""
        if self._closed:
            raise RuntimeError("the stream processor is closed")
        if self._native is not None and self._native.finished:
            return []
        return self.push(InferenceChunk.finish("stop"))

    def close(self) -> None:
        self._closed = True
