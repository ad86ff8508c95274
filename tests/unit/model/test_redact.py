"""The redaction rules (model/redact.py, docs/design.md §10): every secret in any letter
case, and any run of 8 or more characters that begins one, wherever a cut left it."""

from __future__ import annotations

import time

import pytest

from llm_health.model.answer import Answer
from llm_health.model.redact import (
    MAX_MATCHES,
    MIN_PREFIX,
    REDACTED,
    redact_secrets,
    secret_forms,
)
from llm_health.ops.secret_scrubbing import Secrets
from llm_health.probe.answer import AnswerReader

KEY = "Zq8TmV3xRb7NpK2wYc5HdF9jLs4GtE6uAo1iWkXyPv0Mn3Qr"
FORMS = secret_forms([f"Bearer {KEY}", "abcd"])


def shows_key(text: str) -> bool:
    return KEY[:MIN_PREFIX].lower() in text.lower()


@pytest.mark.parametrize("form", [KEY, KEY.lower(), KEY.upper(), KEY.swapcase()])
def test_any_letter_case_is_redacted(form: str) -> None:
    assert redact_secrets(f"invalid key {form}!", FORMS) == f"invalid key {REDACTED}!"


@pytest.mark.parametrize("length", range(MIN_PREFIX, len(KEY) + 1))
def test_every_cut_of_eight_characters_or_more_is_redacted(length: int) -> None:
    for text in (f"x {KEY[:length]}", f"x {KEY[:length]}…", f"{KEY[:length].lower()} y"):
        clean = redact_secrets(text, FORMS)
        assert not shows_key(clean) and REDACTED in clean, (length, clean)


def test_a_shorter_cut_and_ordinary_text_stay() -> None:
    text = f"x {KEY[: MIN_PREFIX - 1]} then Bearer tokens, abc"
    assert redact_secrets(text, FORMS) == text
    assert redact_secrets("id ABCD and abcd", FORMS) == f"id {REDACTED} and {REDACTED}"


def test_whole_values_and_repeats() -> None:
    text = f"Authorization: Bearer {KEY}; X-Key: {KEY}{KEY}"
    assert redact_secrets(text, FORMS) == f"Authorization: {REDACTED}; X-Key: {REDACTED}{REDACTED}"


def test_redacting_then_cutting_leaves_nothing_either() -> None:
    for cut in range(len(KEY) + 20):
        shown = redact_secrets(f"HTTP 500: {KEY} tail", FORMS)[:cut]
        assert not shows_key(shown)


def test_non_ascii_text_is_searched_too() -> None:
    assert redact_secrets(f"é {KEY.lower()[:20]} ü", FORMS) == f"é {REDACTED} ü"


def test_scrub_walks_documents() -> None:
    secrets = Secrets(FORMS)
    document = {"a": [f"x {KEY[:30]}", {"b": KEY.lower()}], "n": 3}
    assert not shows_key(repr(secrets.scrub(document)))
    assert secrets.redact("nothing here") == "nothing here"


def test_clean_text_is_cheap() -> None:
    """The scrub sees every log record and every /status string: text that holds no
    secret costs one fold and a few substring searches (measured: 0.1 s)."""
    texts = [f"cluster-{i}/10.0.0.{i % 250}:8000 healthy, ttft {i} ms" for i in range(20_000)]
    started = time.perf_counter()
    for text in texts:
        redact_secrets(text, FORMS)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    "body",
    [
        "x" * 65_000 + KEY[:30],
        "é" * 65_000 + KEY.lower(),
        (KEY[:MIN_PREFIX] + ".") * 7_000,
        "abcd" * 16_000,
        ("x" * 2_000 + KEY) * MAX_MATCHES,
    ],
    ids=["cut-at-end", "non-ascii", "many-starts", "many-short", "most-matches"],
)
def test_a_hostile_64_kib_body_is_bounded_work(body: str) -> None:
    """A backend knows the key it was sent: a body full of it costs a few scans of the
    text, and keeps nothing of it. Timed in the thread's CPU time: a preempted test
    waits, it does not work."""
    started = time.thread_time()
    clean = redact_secrets(body, FORMS)
    assert time.thread_time() - started < 0.05
    assert not shows_key(clean) and "abcd" not in clean.lower()


def test_more_matches_than_the_bound_redact_the_whole_text() -> None:
    assert redact_secrets(f"{KEY} " * (MAX_MATCHES + 1), FORMS) == REDACTED
    assert redact_secrets(f"{KEY} " * MAX_MATCHES, FORMS) == f"{REDACTED} " * MAX_MATCHES


def test_an_answer_carries_no_secret() -> None:
    """The key split over two tokens, and cut by the reader's character bound."""
    reader = AnswerReader("openai-completions", FORMS)
    for piece in (" " + KEY[:20], KEY[20:]):
        reader.feed({"choices": [{"text": piece, "logprobs": {"tokens": [piece]}}]})
    answer = reader.answer(complete=True)
    assert isinstance(answer, Answer)
    assert answer.text == f" {REDACTED}"
    assert not shows_key(answer.text + "".join(answer.tokens))
    long = AnswerReader("openai-completions", FORMS)
    long.feed({"choices": [{"text": "x" * 1980 + KEY}]})  # cut at 2000 characters
    assert not shows_key(long.answer(complete=False).text)
