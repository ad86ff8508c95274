"""The YAML composer: the parser's event stream turned into Python values, bounded.

The file is hostile input until validated. Its YAML is turned into values here, in one
loop with an explicit stack (PyYAML's own composer and constructor recurse, so a deep or
self-referencing file would end in RecursionError, or in a C stack overflow with libyaml).
That loop also bounds the nesting depth and the values aliases expand to (a "billion
laughs" file fails at once, in small memory), refuses recursive aliases and duplicate
keys, expands ``${ENV}`` and refuses control characters in every string. Nothing here is
global or mutable: reloads call it from a worker thread, which the loop lets go of the
GIL every few milliseconds. Problems past the first MAX_MESSAGES are only counted
(docs/design.md §6.3).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from llm_health.config.messages import (
    MAX_MESSAGES,
    NO_SECRETS,
    ConfigPath,
    Redactor,
)
from llm_health.errors import ConfigError

MAX_DEPTH = 64  # nested mappings/lists
MAX_VALUES = 500_000  # values in the file (keys included), aliases expanded
MAX_ALIAS_VALUES = 100_000  # values the aliases (*name) add, in all
MAX_STRING_CHARS = 65_536  # one string, ${ENV} expanded
MAX_KEY_CHARS = 1_024
MAX_NUMBER_CHARS = 100  # a YAML number/date: longer ones cost quadratic time (1:2:3:...)

# libyaml's parser when PyYAML has it (about 20x faster on a big file); events only, so
# both behave the same here.
_LOADER: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# C0 but tab, DEL, C1, line/paragraph separators, bidi embeddings/overrides/isolates:
# none may reach a header, a URL, a log line or a terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_IN_PROMPT = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_MULTILINE_KEYS: frozenset[Any] = frozenset(
    {"prompt"}
)  # probe.prompt (top level or per cluster): \n is fine

_Y = "tag:yaml.org,2002:"
_STR, _MAP, _SEQ, _MERGE_TAG = f"{_Y}str", f"{_Y}map", f"{_Y}seq", f"{_Y}merge"
_SCALAR_TAGS = frozenset(f"{_Y}{t}" for t in ("str", "int", "float", "bool", "null", "timestamp"))
# First characters of every implicitly typed plain scalar (int, float, bool, null, ...):
# any other plain scalar is a string without asking the resolver.
_RESOLVED_FIRST = frozenset(k for k in yaml.resolver.Resolver.yaml_implicit_resolvers if k)
assert None not in yaml.resolver.Resolver.yaml_implicit_resolvers
_PLAIN_NUMBER = re.compile(r"[-+]?(?:0|[1-9][0-9]{0,17})|[-+]?[0-9]{1,18}\.[0-9]{0,18}")
_WORDS: Mapping[str, bool | None] = {
    **{w: True for w in ("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")},
    **{w: False for w in ("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")},
    **{w: None for w in ("~", "null", "Null", "NULL")},
}
_EXPLICIT_SCALAR_TAGS = frozenset(f"{_Y}{t}" for t in ("str", "int", "float", "bool", "null"))


class _Frame:
    """An open mapping or list while the event stream is read."""

    __slots__ = ("anchor", "is_map", "key", "key_line", "keys", "merges", "path", "size", "value")

    def __init__(self, path: ConfigPath, anchor: str | None, is_map: bool) -> None:
        self.path = path
        self.anchor = anchor
        self.is_map = is_map
        self.value: Any = {} if is_map else []
        self.size = 1  # values in this collection, itself included, aliases expanded
        self.key: Any = _NO_KEY  # a mapping waiting for its next value: that value's key
        self.key_line = 0
        self.keys: dict[Any, int] = {}  # key -> line, for duplicate keys
        self.merges: list[tuple[Any, int]] = []  # YAML merge keys ("<<: *defaults")


_NO_KEY = object()  # the mapping waits for a key
_BAD_KEY = object()  # the key was refused: drop the value that follows
_MERGE = object()  # the key "<<": merge the mapping(s) that follow


class Document:
    """One parse: the values built from the YAML events, each path's line, the problems
    found, and the ${ENV} values substituted (to keep them out of every message)."""

    def __init__(self, source: str, environ: Mapping[str, str]) -> None:
        self.source = source
        self.environ = environ
        self.lines: dict[ConfigPath, int] = {}
        self.problems: list[tuple[ConfigPath, str]] = []  # the first MAX_MESSAGES
        self.unlisted = 0  # problems past those
        self.substituted: dict[str, str] = {}  # env value -> "${NAME}"
        self.anchors: dict[str, tuple[Any, int]] = {}  # name -> (value, size)
        self.values = 0  # every value, aliases expanded
        self.alias_values = 0  # what the aliases added
        self.constructor = yaml.constructor.SafeConstructor()
        self.resolver: Any = yaml.resolver.Resolver()

    def redactor(self) -> Callable[[str], str]:
        return Redactor(self.substituted) if self.substituted else NO_SECRETS

    def fail(self, line: int, message: str) -> ConfigError:
        return ConfigError([f"{self.source}:{line} {message}"])

    # --- the event loop -------------------------------------------------------------------

    def build(self, text: str) -> Any:
        stack: list[_Frame] = []
        root: Any = None
        documents = 0
        events: Any = yaml.parse(text, Loader=_LOADER)  # a generator: closed below
        try:
            for event in events:
                kind = type(event)
                if kind is yaml.DocumentStartEvent:
                    documents += 1
                    if documents > 1:
                        line = _line(event)
                        raise self.fail(line, "invalid YAML: more than one document in the file")
                    continue
                line = _line(event)
                if kind is yaml.ScalarEvent:
                    value, size, is_collection = self._scalar(event, stack, line), 1, False
                elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                    stack.append(self._open(event, stack, line))
                    continue
                elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                    frame = stack.pop()
                    value, size = self._close(frame)
                    if frame.anchor is not None:
                        self.anchors[frame.anchor] = (value, size)
                    is_collection = True
                elif kind is yaml.AliasEvent:
                    value, size = self._alias(event, stack, line)
                    is_collection = isinstance(value, dict | list)
                else:
                    continue  # stream and document ends
                if stack:
                    self._add(stack[-1], value, size, line, is_collection)
                else:
                    root = value
        except yaml.YAMLError as exc:
            raise ConfigError([self._yaml_problem(exc, text)]) from None
        except (UnicodeError, ValueError) as exc:  # e.g. lone surrogates in ``text``
            raise ConfigError([f"{self.source}:1 invalid YAML: {type(exc).__name__}"]) from None
        finally:
            events.close()
        return root

    def _yaml_problem(self, exc: yaml.YAMLError, text: str) -> str:
        mark: Any = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or type(exc).__name__
        if isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
            position = max(0, int(exc.position))
            line = text.count("\n", 0, position) + 1
            char = exc.character if isinstance(exc.character, int) else ord(exc.character)
            problem = f"{exc.reason} (U+{char:04X})"
        return f"{self.source}:{line} invalid YAML: {problem}"

    def _open(self, event: Any, stack: list[_Frame], line: int) -> _Frame:
        if len(stack) >= MAX_DEPTH:
            raise self.fail(line, f"the file nests more than {MAX_DEPTH} levels deep")
        self._count(1, line)
        is_map = isinstance(event, yaml.MappingStartEvent)
        self._check_anchor(event.anchor, stack, line)
        tag = event.tag
        if tag not in (None, "!", _MAP if is_map else _SEQ):
            self._problem(stack, line, f"the YAML tag {tag} is not supported")
        path = self._child_path(stack, line)
        return _Frame(path, event.anchor, is_map)

    def _close(self, frame: _Frame) -> tuple[Any, int]:
        value = frame.value
        for merged, line in frame.merges:
            items = merged if isinstance(merged, list) else [merged]
            if not all(isinstance(item, dict) for item in items):
                where = (*frame.path, "<<")
                self._note(where, "<< (merge) needs a mapping or a list of mappings", line)
                continue
            for item in items:
                for key, item_value in item.items():
                    if key not in value:
                        value[key] = item_value
        return value, frame.size

    def _alias(self, event: Any, stack: list[_Frame], line: int) -> tuple[Any, int]:
        name = event.anchor
        if any(frame.anchor == name for frame in stack):
            raise self.fail(line, f"invalid YAML: the alias *{name} refers to itself")
        if name not in self.anchors:
            raise self.fail(line, f"invalid YAML: the alias *{name} has no anchor &{name}")
        value, size = self.anchors[name]
        self.alias_values += size
        if self.alias_values > MAX_ALIAS_VALUES:
            raise self.fail(line, f"aliases expand to more than {MAX_ALIAS_VALUES} values")
        self._count(size, line)
        self._child_path(stack, line)
        return value, size

    def _scalar(self, event: Any, stack: list[_Frame], line: int) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            self._count(0, line)
        frame = stack[-1] if stack else None
        is_key = frame is not None and frame.is_map and frame.key is _NO_KEY
        if event.anchor is not None:
            self._check_anchor(event.anchor, stack, line)
        if frame is None:
            self.lines.setdefault((), line)
        elif not frame.is_map:
            self.lines.setdefault((*frame.path, len(frame.value)), line)
        value = self._scalar_value(event, stack, line, is_key)
        if event.anchor is not None:
            self.anchors[event.anchor] = (value, 1)
        return value

    def _scalar_value(self, event: Any, stack: list[_Frame], line: int, is_key: bool) -> Any:
        text: str = event.value
        if event.tag is None or event.tag == "!":
            if not event.implicit[0] or (text and text[0] not in _RESOLVED_FIRST):
                tag = _STR  # quoted, or no implicit type starts with this character
            elif not is_key and _PLAIN_NUMBER.fullmatch(text):
                # What YAML's int/float resolvers and constructors make of "80" or "0.5",
                # without their cost per value (a file may hold a million of them).
                return float(text) if "." in text else int(text)
            elif not is_key and text in _WORDS:
                return _WORDS[text]
            else:
                tag = self.resolver.resolve(yaml.ScalarNode, text, event.implicit)
        else:
            tag = event.tag
            if tag not in _EXPLICIT_SCALAR_TAGS:
                self._problem(stack, line, f"the YAML tag {tag} is not supported")
                return text
        if is_key:
            if len(text) > MAX_KEY_CHARS:
                self._problem(stack, line, f"a key longer than {MAX_KEY_CHARS} characters")
                return _BAD_KEY
            if tag == _MERGE_TAG:
                return _MERGE
        elif tag == _MERGE_TAG:
            tag = _STR
        if tag == _STR:
            return text if is_key else self._string(text, stack, line)
        if tag not in _SCALAR_TAGS:
            self._problem(stack, line, f"{text[:20]!r} is not a value this file can hold")
            return text
        if len(text) > MAX_NUMBER_CHARS:
            self._problem(stack, line, f"a number longer than {MAX_NUMBER_CHARS} characters")
            return None
        node = yaml.ScalarNode(tag, text, event.start_mark, event.end_mark, event.style)
        try:
            return self.constructor.yaml_constructors[tag](self.constructor, node)
        except (ValueError, ArithmeticError, yaml.YAMLError):
            self._problem(stack, line, f"{text[:20]!r} is not a valid {tag.rsplit(':', 1)[-1]}")
            return text

    def _string(self, text: str, stack: list[_Frame], line: int) -> str:
        """A string value: ${ENV} expanded, then length and control characters checked."""
        if "${" in text:
            text = self._expand(text, self._path_of_next(stack), line)
        if len(text) > MAX_STRING_CHARS:
            self._problem(stack, line, f"a string longer than {MAX_STRING_CHARS} characters")
            return ""
        multiline = bool(stack) and stack[-1].is_map and stack[-1].key in _MULTILINE_KEYS
        bad = (_CONTROL_IN_PROMPT if multiline else _CONTROL).search(text)
        if bad is not None:
            char = ord(bad.group())
            self._problem(stack, line, f"control character U+{char:04X} is not allowed here")
        return text

    def _expand(self, text: str, path: ConfigPath, line: int) -> str:
        """Replace ${VAR} and ${VAR:-default}; report unset variables. Stops (and returns
        an over-long string) as soon as the result exceeds MAX_STRING_CHARS."""
        parts: list[str] = []
        length, last = 0, 0
        for match in _ENV.finditer(text):
            name, default = match.group(1), match.group(2)
            if name in self.environ:
                value = self.environ[name]
                self.substituted[value] = "${" + name + "}"
            elif default is not None:
                value = default
            else:
                self._note(path, f"environment variable {name} is not set", line)
                value = ""
            parts += (text[last : match.start()], value)
            length += match.start() - last + len(value)
            last = match.end()
            if length > MAX_STRING_CHARS:
                return "x" * (MAX_STRING_CHARS + 1)
        parts.append(text[last:])
        return "".join(parts)

    def _add(self, frame: _Frame, value: Any, size: int, line: int, is_collection: bool) -> None:
        frame.size += size
        if not frame.is_map:
            frame.value.append(value)
            return
        if frame.key is _NO_KEY:
            if is_collection:
                self._note(frame.path, "a mapping key must be a plain value", line)
                value = _BAD_KEY
            elif value is not _BAD_KEY and value is not _MERGE:
                first = frame.keys.get(value)
                where = (*frame.path, str(value))
                if first is not None:
                    self.lines[where] = line
                    self._note(where, f"duplicate key (first on line {first})", line)
                    value = _BAD_KEY
                else:
                    frame.keys[value] = line
                    self.lines.setdefault(where, line)
            frame.key, frame.key_line = value, line
            return
        key, frame.key = frame.key, _NO_KEY
        if key is _MERGE:
            frame.merges.append((value, frame.key_line))
        elif key is not _BAD_KEY:
            frame.value[key] = value

    # --- paths, counts, problems ----------------------------------------------------------

    def _path_of_next(self, stack: list[_Frame]) -> ConfigPath:
        """The path of the value about to be added to the innermost open collection."""
        if not stack:
            return ()
        frame = stack[-1]
        if not frame.is_map:
            return (*frame.path, len(frame.value))
        if frame.key is _NO_KEY or frame.key is _BAD_KEY or frame.key is _MERGE:
            return frame.path
        return (*frame.path, str(frame.key))

    def _child_path(self, stack: list[_Frame], line: int) -> ConfigPath:
        """The next value's path; a list item's line is its own (a mapping entry's line,
        its key's, is recorded with the key)."""
        path = self._path_of_next(stack)
        if not stack or not stack[-1].is_map:
            self.lines.setdefault(path, line)
        return path

    def _check_anchor(self, name: str | None, stack: list[_Frame], line: int) -> None:
        if name is not None and (name in self.anchors or any(f.anchor == name for f in stack)):
            raise self.fail(line, f"invalid YAML: the anchor &{name} is defined twice")

    def _count(self, size: int, line: int) -> None:
        self.values += size
        if self.values > MAX_VALUES:
            raise self.fail(line, f"the file holds more than {MAX_VALUES} values")

    def _problem(self, stack: list[_Frame], line: int, message: str) -> None:
        self._note(self._path_of_next(stack), message, line)

    def _note(self, path: ConfigPath, message: str, line: int) -> None:
        """A problem; past the first MAX_MESSAGES only counted, since none of those is
        shown (config/messages.py)."""
        if len(self.problems) < MAX_MESSAGES:
            self.problems.append((path, message))
        else:
            self.unlisted += 1
        self.lines.setdefault(path, line)


def _line(event: yaml.Event) -> int:
    mark: Any = event.start_mark
    return int(mark.line) + 1
