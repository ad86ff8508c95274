"""SSE decoding and stream-event interpretation (docs/design.md §2: what counts as a first token)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.errors import ProtocolError
from llm_health.probe.events import EventKind, error_message_from_body, interpret
from llm_health.probe.sse import SseDecoder, simple_event

# A realistic vLLM chat stream: keep-alive comment, role-only delta, content, finish, DONE.
CHAT_EVENTS = [
    '{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    '"delta":{"role":"assistant"},"finish_reason":null}]}',
    '{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    '"delta":{"content":"Hé"},"finish_reason":null}]}',
    '{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    '"delta":{},"finish_reason":"length"}]}',
    "[DONE]",
]
STREAM = (
    b": keep-alive\n\n"
    + b"".join(f"data: {e}\n\n".encode() for e in CHAT_EVENTS[:2])
    + b"event: message\nid: 7\nretry: 1000\n"
    + f"data: {CHAT_EVENTS[2]}\n\n".encode()
    + b": ping\n"
    + f"data:{CHAT_EVENTS[3]}\n\n".encode()  # no space after the colon is valid SSE
)


def decode_all(chunks: list[bytes], max_line: int | None = None) -> list[str]:
    decoder = SseDecoder() if max_line is None else SseDecoder(max_line=max_line)
    events: list[str] = []
    for chunk in chunks:
        events.extend(decoder.feed(chunk))
    tail = decoder.close()
    if tail is not None:
        events.append(tail)
    return events


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, *cuts, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


# --- SseDecoder ---------------------------------------------------------------------------


def test_whole_stream_in_one_chunk() -> None:
    assert decode_all([STREAM]) == CHAT_EVENTS


def test_byte_by_byte() -> None:
    assert decode_all([STREAM[i : i + 1] for i in range(len(STREAM))]) == CHAT_EVENTS


@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
@settings(max_examples=200, deadline=None)
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    assert decode_all(split_at(STREAM, cuts)) == CHAT_EVENTS


@given(
    payloads=st.lists(
        st.text(
            alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
            min_size=1,
            max_size=30,
        ),
        min_size=1,
        max_size=8,
    ),
    crlf=st.booleans(),
    data=st.data(),
)
@settings(max_examples=200, deadline=None)
def test_random_payloads_random_chunks(
    payloads: list[str], crlf: bool, data: st.DataObject
) -> None:
    """Any single-line UTF-8 payloads survive any chunking, multi-byte chars split too."""
    eol = b"\r\n" if crlf else b"\n"
    stream = b"".join(b"data: " + p.encode() + eol + eol for p in payloads)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    # "data: " strips exactly one leading space; payloads starting with a space keep the rest.
    assert decode_all(split_at(stream, cuts)) == payloads


def test_crlf_line_endings() -> None:
    stream = b'data: {"a":1}\r\n\r\n: c\r\ndata: x\r\n\r\n'
    assert decode_all([stream]) == ['{"a":1}', "x"]


def test_crlf_split_between_cr_and_lf() -> None:
    assert decode_all([b"data: x\r", b"\n\r", b"\n"]) == ["x"]


def test_comments_only_give_no_events() -> None:
    assert decode_all([b": keep-alive\n\n: another\n\n"]) == []


def test_multi_line_data_joined_with_newline() -> None:
    assert decode_all([b"data: a\ndata: b\n\n"]) == ["a\nb"]


def test_other_fields_ignored() -> None:
    assert decode_all([b"event: x\nid: 1\nretry: 5\ndata: y\nfoo: z\n\n"]) == ["y"]


def test_blank_lines_without_data_give_no_events() -> None:
    assert decode_all([b"\n\n\n"]) == []


def test_close_flushes_an_open_event() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: last") == []  # no newline yet: nothing complete
    assert decoder.feed(b"\n") == []  # line complete, event not yet ended
    assert decoder.close() == "last"


def test_close_with_nothing_open() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\n\n") == ["a"]
    assert decoder.close() is None


def test_oversized_line_raises() -> None:
    decoder = SseDecoder(max_line=100)
    with pytest.raises(ProtocolError):
        decoder.feed(b"data: " + b"x" * 200)


def test_oversized_line_raises_when_fed_in_pieces() -> None:
    decoder = SseDecoder(max_line=100)
    with pytest.raises(ProtocolError):
        for _ in range(30):
            decoder.feed(b"x" * 10)


def test_line_at_the_limit_is_fine() -> None:
    payload = "y" * 94
    assert decode_all([f"data: {payload}\n\n".encode()], max_line=100) == [payload]


def test_default_limit_is_bounded() -> None:
    decoder = SseDecoder()
    with pytest.raises(ProtocolError):
        decoder.feed(b"z" * (1024 * 1024))


def test_invalid_utf8_does_not_crash() -> None:
    (event,) = decode_all([b"data: \xff\xfe ok\n\n"])
    assert event.endswith(" ok")


# --- interpret ----------------------------------------------------------------------------


def chunk(**fields: object) -> str:
    return json.dumps(fields)


CASES = [
    # (id, payload, api, expected kind)
    (
        "completions-text",
        chunk(
            object="text_completion", choices=[{"index": 0, "text": "Hi", "finish_reason": None}]
        ),
        "openai-completions",
        EventKind.TOKEN,
    ),
    (
        "completions-empty-text",
        chunk(choices=[{"index": 0, "text": "", "finish_reason": None}]),
        "openai-completions",
        EventKind.NO_TOKEN,
    ),
    (
        "completions-finish-only",
        chunk(choices=[{"index": 0, "text": "", "finish_reason": "length"}]),
        "openai-completions",
        EventKind.TOKEN,
    ),
    (
        "chat-role-only",
        chunk(choices=[{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]),
        "openai-chat",
        EventKind.NO_TOKEN,
    ),
    (
        "chat-role-and-empty-content",
        chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]),
        "openai-chat",
        EventKind.NO_TOKEN,
    ),
    (
        "chat-content",
        chunk(choices=[{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]),
        "openai-chat",
        EventKind.TOKEN,
    ),
    (
        "chat-reasoning",
        chunk(choices=[{"index": 0, "delta": {"reasoning_content": "hmm"}}]),
        "openai-chat",
        EventKind.TOKEN,
    ),
    (
        "chat-tool-call",
        chunk(choices=[{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t"}]}}]),
        "openai-chat",
        EventKind.TOKEN,
    ),
    (
        "chat-finish-with-empty-delta",
        chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "length"}]),
        "openai-chat",
        EventKind.TOKEN,
    ),
    (
        "chat-text-field-is-not-a-chat-token",
        chunk(choices=[{"index": 0, "text": "x"}]),
        "openai-chat",
        EventKind.NO_TOKEN,
    ),
    (
        "chat-delta-not-an-object",
        chunk(choices=[{"index": 0, "delta": "x"}]),
        "openai-chat",
        EventKind.NO_TOKEN,
    ),
    (
        "second-choice-carries-token",
        chunk(choices=[{"index": 0, "text": ""}, {"index": 1, "text": "a"}]),
        "openai-completions",
        EventKind.TOKEN,
    ),
    (
        "choice-not-an-object",
        chunk(choices=["x", 3]),
        "openai-completions",
        EventKind.NO_TOKEN,
    ),
    (
        "empty-choices",
        chunk(choices=[]),
        "openai-chat",
        EventKind.NO_TOKEN,
    ),
    (
        "usage-only",
        chunk(choices=[], usage={"prompt_tokens": 2, "completion_tokens": 1}),
        "openai-chat",
        EventKind.NO_TOKEN,
    ),
    (
        "usage-only-no-choices-key",
        chunk(usage={"prompt_tokens": 2, "completion_tokens": 1}),
        "openai-completions",
        EventKind.NO_TOKEN,
    ),
    ("done", "[DONE]", "openai-chat", EventKind.DONE),
    ("done-with-spaces", "  [DONE] ", "openai-completions", EventKind.DONE),
    ("garbage", "this is not json", "openai-chat", EventKind.MALFORMED),
    ("truncated-json", '{"choices": [', "openai-chat", EventKind.MALFORMED),
    ("empty-payload", "", "openai-chat", EventKind.MALFORMED),
    ("json-array", "[1, 2]", "openai-chat", EventKind.MALFORMED),
    ("json-number", "42", "openai-completions", EventKind.MALFORMED),
    ("json-string", '"hello"', "openai-completions", EventKind.MALFORMED),
    ("json-null", "null", "openai-completions", EventKind.MALFORMED),
]


@pytest.mark.parametrize(
    ("payload", "api", "kind"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_interpret(payload: str, api: str, kind: EventKind) -> None:
    assert interpret(payload, api).kind is kind


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"error": {"message": "CUDA error: out of memory", "code": 500}}', "CUDA error"),
        ('{"error": "model overloaded"}', "model overloaded"),
        (
            '{"object": "error", "message": "EngineDeadError: engine loop died", '
            '"type": "InternalServerError", "code": 500}',
            "EngineDeadError",
        ),
    ],
    ids=["openai-error-object", "error-string", "vllm-object-error"],
)
def test_interpret_error_events(payload: str, message: str) -> None:
    for api in ("openai-chat", "openai-completions"):
        event = interpret(payload, api)
        assert event.kind is EventKind.ERROR
        assert message in event.message


def test_error_object_without_message_still_explains() -> None:
    event = interpret('{"error": {"code": 503, "type": "overloaded"}}', "openai-chat")
    assert event.kind is EventKind.ERROR
    assert "overloaded" in event.message


def test_malformed_message_is_clipped() -> None:
    event = interpret("x" * 10_000, "openai-chat")
    assert event.kind is EventKind.MALFORMED
    assert len(event.message) < 300


@given(st.text(max_size=200))
@settings(max_examples=200, deadline=None)
def test_interpret_never_raises(payload: str) -> None:
    for api in ("openai-chat", "openai-completions"):
        assert isinstance(interpret(payload, api).kind, EventKind)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=12,
    )
)
@settings(max_examples=200, deadline=None)
def test_interpret_never_raises_on_odd_json(value: object) -> None:
    payload = json.dumps({"choices": value, "error": None})
    for api in ("openai-chat", "openai-completions"):
        assert isinstance(interpret(payload, api).kind, EventKind)


# --- error_message_from_body --------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"error": {"message": "Rate limit exceeded", "type": "x"}}', "Rate limit exceeded"),
        ('{"object": "error", "message": "The server is overloaded"}', "The server is overloaded"),
        ('{"error": "Service Unavailable"}', "Service Unavailable"),
        (
            "upstream connect error or disconnect/reset",
            "upstream connect error or disconnect/reset",
        ),
        ('{"detail": "Not Found"}', '{"detail": "Not Found"}'),
        ("[1, 2, 3]", "[1, 2, 3]"),
        ("", ""),
        ("  multi\n  line\n\tbody ", "multi line body"),
    ],
    ids=[
        "openai",
        "vllm",
        "error-string",
        "plain-text",
        "json-without-error",
        "json-array",
        "empty",
        "whitespace-collapsed",
    ],
)
def test_error_message_from_body(body: str, expected: str) -> None:
    assert error_message_from_body(body) == expected


def test_error_message_from_long_body_is_clipped() -> None:
    body = "<html>" + "x" * 5000 + "</html>"
    message = error_message_from_body(body)
    assert message.startswith("<html>")
    assert len(message) < 300


# --- simple_event: the common shape read without a decoder ----------------------------------

LINE_PIECES = [
    b"data: ",
    b"data:",
    b"data:  ",
    b"event: x",
    b": ping",
    b"id: 1",
    b"\r",
    b"\n",
    b"\r\n",
    b'{"choices":[{"text":"a"}]}',
    b"[DONE]",
    b"\xff\xfe",
    b"x",
    b"",
]


@given(pieces=st.lists(st.sampled_from(LINE_PIECES), max_size=30), start_events=st.integers(0, 3))
@settings(max_examples=500, deadline=None)
def test_a_simple_event_is_what_the_decoder_reads_and_the_rest_reads_on_alike(
    pieces: list[bytes], start_events: int
) -> None:
    """Events taken one by one with ``simple_event`` while they have the common shape, and
    whatever is left fed to a fresh decoder, give exactly the decoder's events for the
    whole chunk, in order (the prober's skim: ``_exchange.Exchange._skim``)."""
    chunk = b"".join(pieces)
    whole = SseDecoder()
    expected = whole.feed(chunk)
    skimmed: list[str] = []
    start = 0
    while (event := simple_event(chunk, start)) is not None:
        payload, start = event
        skimmed.append(payload)
    rest = SseDecoder()
    got = skimmed + rest.feed(chunk[start:])
    assert got == expected
    assert rest.close() == whole.close()


def test_the_common_shape_is_read_and_anything_else_is_left() -> None:
    chunk = b'data: {"a":1}\n\ndata:[DONE]\r\n\r\n: ping\n\ndata: x\n'
    assert simple_event(chunk, 0) == ('{"a":1}', 15)
    assert simple_event(chunk, 15) == ("[DONE]", 30)
    assert simple_event(chunk, 30) is None  # a comment: the decoder's
    assert simple_event(b"data: x\nid: 2\n\n", 0) is None  # another field in the event
    assert simple_event(b"data: x\n", 0) is None  # not ended yet
    assert simple_event(b"data: a\ndata: b\n\n", 0) is None  # two lines


JSON_PIECES = [
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    '"a"',
    '"\\ud800"',
    '"é"',
    "1",
    "-0",
    "1.5e3",
    "1e400",
    "NaN",
    "Infinity",
    "-Infinity",
    "true",
    "null",
    " ",
    "\n",
    '"\\u0000"',
    "\x01",
]


@given(pieces=st.lists(st.sampled_from(JSON_PIECES), max_size=12))
@settings(max_examples=800, deadline=None)
def test_the_fast_json_reads_what_the_stdlib_reads(pieces: list[str]) -> None:
    """``events.loads`` (orjson, the stdlib for what orjson refuses) gives what
    ``json.loads`` gives, or refuses what it refuses (integers here stay within 64 bits,
    the one documented difference)."""
    from llm_health.probe.events import loads

    text = "".join(pieces)
    try:
        expected = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            loads(text)
        return
    got = loads(text)
    assert repr(got) == repr(expected)  # nan != nan: compare as written
