"""Secret values and terminal tricks out of every text a peer, a log or a page may see.

Configured secrets (probe headers, tokens, webhook headers, credentials in URLs) are
known; a backend can still echo them back (an error body quoting the request headers, its
model id, its answer), and a config value can end up in a message. ``redact_secrets``
replaces every occurrence of every known secret, in any letter case, and any run of
MIN_PREFIX or more characters that begins one: what a cut leaves of a secret (a read
limit, a clipped message) is redacted as surely as the whole (docs/design.md §10). Pure,
no I/O.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Iterable, Iterator

REDACTED = "<redacted>"
MIN_SECRET = 4  # shorter values would redact ordinary text ("1", "on") and protect nothing
MIN_PREFIX = 8  # a run this long that begins a secret is redacted too (a cut one)
MAX_MATCHES = 32  # a text with more is redacted whole: the work per text stays bounded


def secret_forms(values: Iterable[str]) -> frozenset[str]:
    """The strings to look for: each value and, for "Scheme credentials" values
    ("Bearer abc…", "Basic …"), the credentials alone, which a backend may echo."""
    forms: set[str] = set()
    for value in values:
        for form in (value, value.rpartition(" ")[2]):
            if len(form) >= MIN_SECRET:
                forms.add(form)
    return frozenset(forms)


def redact_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``<redacted>``, whatever its letter case;
    also any run of MIN_PREFIX or more characters that begins a secret without blanks (a
    "Scheme credentials" value's credentials are such a secret: ``secret_forms``), so
    that a cut, before or after this, never shows the start of one. Overlapping matches
    are redacted as one (a secret that contains another goes whole); a text with more
    than MAX_MATCHES matches is nothing but ``<redacted>``."""
    if not text:
        return text
    return _matcher(frozenset(secrets)).redact(text)


class _Matcher:
    """One secret set, folded (lower-cased) for plain substring searches on the folded
    text: each secret with blanks or shorter than MIN_PREFIX is found whole; each other
    one by its first MIN_PREFIX characters, its run then followed as far as the text goes
    on with it. A few scans of the text per secret, and at most MAX_MATCHES runs followed
    (a hostile backend knows the key it was sent, and its body may be 64 KiB)."""

    def __init__(self, secrets: frozenset[str]) -> None:
        folded = {_fold(s) for s in secrets}
        by_start = {s for s in folded if len(s) >= MIN_PREFIX and not _has_blank(s)}
        self._whole = tuple(folded - by_start)
        starts: dict[str, list[str]] = {}
        for secret in by_start:
            starts.setdefault(secret[:MIN_PREFIX], []).append(secret)
        self._starts = {head: tuple(found) for head, found in starts.items()}
        self._needles = (*self._whole, *self._starts)

    def redact(self, text: str) -> str:
        folded = _fold(text)  # the same length as ``text``: positions carry over
        for needle in self._needles:  # a plain loop: most texts hold none (logs, /status)
            if needle in folded:
                return self._redacted(text, folded)
        return text

    def _redacted(self, text: str, folded: str) -> str:
        if sum(folded.count(needle) for needle in self._needles) > MAX_MATCHES:
            return REDACTED
        kept: list[str] = []
        at = 0
        for start, end in _merged(sorted(self._spans(folded))):
            kept += (text[at:start], REDACTED)
            at = end
        kept.append(text[at:])
        return "".join(kept)

    def _spans(self, folded: str) -> Iterator[tuple[int, int]]:
        for secret in self._whole:
            for start in _occurrences(folded, secret):
                yield start, start + len(secret)
        for head, secrets in self._starts.items():
            for start in _occurrences(folded, head):
                yield start, max(_reach(folded, start, s) for s in secrets)


@functools.lru_cache(maxsize=16)
def _matcher(secrets: frozenset[str]) -> _Matcher:
    return _Matcher(secrets)


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _fold(text: str) -> str:
    """``text`` lower-cased, of the same length (positions in it are those of ``text``):
    where lower-casing would lengthen it ("İ"), only its ASCII letters are."""
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.translate(_ASCII_LOWER)


def _occurrences(text: str, needle: str) -> Iterator[int]:
    at = text.find(needle)
    while at >= 0:
        yield at
        at = text.find(needle, at + 1)


def _reach(folded: str, start: int, secret: str) -> int:
    """Where the run of ``secret`` that starts at ``start`` (its first MIN_PREFIX
    characters are there) ends: the longest prefix of it found there (a binary search:
    a prefix that is there makes every shorter one be there)."""
    low, high = MIN_PREFIX, len(secret)
    while low < high:
        middle = (low + high + 1) // 2
        if folded.startswith(secret[:middle], start):
            low = middle
        else:
            high = middle - 1
    return start + low


def _merged(spans: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Sorted spans with the overlapping ones joined (adjacent ones stay apart)."""
    if not spans:
        return
    first, last = spans[0]
    for start, end in spans[1:]:
        if start < last:
            last = max(last, end)
        else:
            yield first, last
            first, last = start, end
    yield first, last


def _has_blank(text: str) -> bool:
    return any(c.isspace() for c in text)


def printable_line(text: str, limit: int) -> str:
    """Peer or operator text made safe for one log line, a terminal and a page: control
    and format characters (ANSI escapes, bidi overrides, NUL) dropped, whitespace runs
    folded to one space, at most ``limit`` characters."""
    kept = "".join(c if c.isprintable() else " " for c in text)
    return " ".join(kept.split())[:limit]


def escape(text: str) -> str:
    """Non-printable characters (control, format such as bidi overrides, line and
    paragraph separators) as repr-style escapes; everything else unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def printable(text: str, limit: int) -> str:
    """Peer-supplied ``text`` for one log line: cut to ``limit`` characters ("..." marks
    a cut), non-printable characters escaped (newlines, ANSI escapes, bidi controls)."""
    return escape(text[:limit]) + ("..." if len(text) > limit else "")


def _escaped(char: str) -> str:
    code = ord(char)
    if char in "\t\n\r":
        return {"\t": "\\t", "\n": "\\n", "\r": "\\r"}[char]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
