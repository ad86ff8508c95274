"""Secret values and terminal tricks out of every text a peer, a log or a page may see.

Configured secrets (probe headers, tokens, webhook headers, credentials in URLs) are
known; a backend can still echo them back (an error body quoting the request headers), and
a config value can end up in a message. ``redact_secrets`` replaces every occurrence of
every known secret. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

REDACTED = "<redacted>"
MIN_SECRET = 4  # shorter values would redact ordinary text ("1", "on") and protect nothing


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
    """``text`` with every secret replaced by ``<redacted>`` (longest first, so a secret
    that contains another is removed whole)."""
    if not text:
        return text
    for secret in sorted(secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


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
