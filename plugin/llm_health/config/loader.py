"""Loading the YAML configuration: read, parse, expand ``${ENV}``, validate.

Errors name the file line and the field path, one line per problem:
    llm-health.yaml:14 clusters[0].probe.timeout: "80x" is not a duration
``load_config`` and ``parse_config`` return a Config or raise ConfigError carrying every
message; nothing else escapes them, whatever the file holds (docs/design.md §7.11).
``load_file`` and ``parse_file`` do the same for any file model (a ``FileModel``: its root
model and the checks before and after validation): ``serve``'s is ``SERVE_FILE``,
``llm-health agent``'s is ``config.agent.AGENT_FILE``.

The file is hostile input until validated. It is read only if it is a regular file (a
FIFO, a device or a directory is refused before any read), with a size limit, and the
YAML is turned into Python values here, from the parser's event stream, in one loop with
an explicit stack (PyYAML's own composer and constructor recurse, so a deep or
self-referencing file would end in RecursionError, or in a C stack overflow with libyaml).
That loop also bounds the nesting depth and the values aliases expand to (a "billion
laughs" file fails at once, in small memory), refuses recursive aliases and duplicate
keys, expands ``${ENV}`` and refuses control characters in every string. Nothing here is
global or mutable: reloads call it from a worker thread, which the loop lets go of the
GIL every few milliseconds. Work after reading follows what is reported: problems past
the first MAX_MESSAGES are only counted, and unknown keys past the first MAX_MESSAGES of
a mapping are counted and never handed to pydantic (docs/design.md §6.3).
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, BinaryIO, Generic, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from llm_health.config.messages import (
    MAX_MESSAGES,
    NO_SECRETS,
    ConfigPath,
    Redactor,
    describe,
    dotted,
    finish,
    first_written,
    format_errors,
    line_of,
)
from llm_health.config.schema import MAX_CLUSTERS, MAX_ENDPOINTS, Config
from llm_health.errors import ConfigError

MAX_FILE_BYTES = 4 * 1024 * 1024  # 4 MiB
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


M = TypeVar("M", bound=BaseModel)
Problem = tuple[ConfigPath, str]  # where in the file, what is wrong
Redact = Callable[[str], str]


def _no_problems(*_args: Any) -> Iterable[Problem]:
    return ()


@dataclass(frozen=True, slots=True)
class FileModel(Generic[M]):
    """What one kind of file holds. ``model``: its root model; ``shape``: what the file
    must be, said when it is not a mapping; ``before``: problems found in the raw mapping
    before the model sees it (e.g. limits that keep a huge file from pydantic); ``after``:
    rules across the validated model. ``empty``: an empty file is ``{}`` (all defaults)."""

    model: type[M]
    shape: str
    before: Callable[[dict[Any, Any]], Iterable[Problem]] = _no_problems
    after: Callable[[M, Redact], Iterable[Problem]] = _no_problems
    empty: bool = False


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read, expand ``${ENV}`` and validate ``path``. Raises ConfigError with every problem."""
    return load_file(path, SERVE_FILE, environ)


def load_file(path: str | Path, kind: FileModel[M], environ: Mapping[str, str] | None = None) -> M:
    """``load_config`` for a file of ``kind``."""
    file = Path(path)
    try:
        text = _read(file)
    except ConfigError as exc:
        raise ConfigError(finish(exc.messages)) from None
    except Exception as exc:
        raise ConfigError(finish([f"{file}: cannot read: {type(exc).__name__}"])) from None
    return parse_file(text, file.name, os.environ if environ is None else environ, kind)


def _read(file: Path) -> str:
    """The file's text; its size is checked before it is read, and the read is bounded
    (a file that grows meanwhile is still never read past the limit)."""
    try:
        with open_regular(file) as handle:
            size = os.fstat(handle.fileno()).st_size
            data = b"" if size > MAX_FILE_BYTES else handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"{file}: cannot read: {exc}"]) from None
    if size > MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
        raise ConfigError([f"{file}: {_too_big(max(size, len(data)))}"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{file}: cannot read: not UTF-8 text (byte {exc.start})"]) from None


def open_regular(file: Path) -> BinaryIO:
    """``file`` opened for reading, if it is a regular file; ConfigError if it is not
    (OSError if it cannot be opened). A FIFO's open would wait for a writer, forever, and
    a device's data never ends: the path is checked before the open (opening a device may
    act on it), and the open descriptor again (the path may be replaced in between), with
    O_NONBLOCK so that not even a FIFO swapped in meanwhile can hold the open."""
    _refuse_irregular(file, os.stat(file).st_mode)
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _refuse_irregular(file, os.fstat(fd).st_mode)
    except ConfigError:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


_NOT_REGULAR = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse_irregular(file: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _NOT_REGULAR if test(mode)), "an unknown kind of file")
    raise ConfigError([f"{file}: cannot read: it is {kind}, not a regular file"])


def _too_big(size: int) -> str:
    return f"the file is larger than the limit of {MAX_FILE_BYTES} bytes (4 MiB): {size} bytes"


def parse_config(text: str, source: str, environ: Mapping[str, str]) -> Config:
    """Validate the YAML ``text`` (named ``source`` in messages). Raises ConfigError."""
    return parse_file(text, source, environ, SERVE_FILE)


def parse_file(text: str, source: str, environ: Mapping[str, str], kind: FileModel[M]) -> M:
    """``parse_config`` for a file of ``kind``."""
    document = _Document(source, environ)
    try:
        return _parse(text, document, kind)
    except ConfigError as exc:
        messages = finish(exc.messages, document.redactor())
    except Exception as exc:
        # RecursionError, MemoryError, or a bug: no traceback, no value from the file.
        messages = [f"{source}: cannot be loaded ({type(exc).__name__}); please report this"]
    # Raised here, with nothing of the parse left (no traceback, no document): all the
    # file built is freed now, on this thread, not wherever the error is caught.
    del document
    raise ConfigError(messages)


def _parse(text: str, document: _Document, kind: FileModel[M]) -> M:
    source = document.source
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError([f"{source}: {_too_big(len(text))}"])
    raw = document.build(text)
    lines = document.lines
    if document.problems:
        raise ConfigError(_located(source, lines, document.problems, document.unlisted))
    if raw is None and kind.empty:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError([f"{source}:1 {kind.shape}"])
    early = list(kind.before(raw))
    if early:
        raise ConfigError(_located(source, lines, early))
    redact = document.redactor()
    raw, unlisted = _unknown_keys_cut(raw, kind.model)
    try:
        validated = kind.model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, lines, source, redact, unlisted)) from None
    problems = list(kind.after(validated, redact))
    if problems:
        raise ConfigError(_located(source, lines, problems))
    return validated


def _located(
    source: str,
    lines: dict[ConfigPath, int],
    problems: list[Problem],
    unlisted: int = 0,
) -> list[str]:
    def write(problem: Problem) -> str:
        path, text = problem
        return f"{source}:{line_of(lines, path)} {dotted(path)}: {text}"

    return first_written(problems, write, unlisted)


def _unknown_keys_cut(value: Any, annotation: Any) -> tuple[Any, int]:
    """``value`` without the unknown keys past the first MAX_MESSAGES of each mapping of a
    settings model, and how many were cut. Pydantic reports a model's unknown keys after
    its fields' errors, so the problems shown are the same; it no longer builds an error
    for each of a hundred thousand keys. A mapping that loses keys is copied, never
    changed (an alias may share it)."""
    annotation = _one_type(annotation)
    if (
        isinstance(value, dict)
        and isinstance(annotation, type)
        and issubclass(annotation, BaseModel)
    ):
        return _model_keys_cut(value, annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    items = origin is list or (origin is tuple and len(args) == 2 and args[1] is ...)
    if isinstance(value, list) and items:
        cut = [_unknown_keys_cut(item, args[0]) for item in value]
        if not any(count for _, count in cut):
            return value, 0
        return [item for item, _ in cut], sum(count for _, count in cut)
    return value, 0


def _model_keys_cut(value: dict[Any, Any], model: type[BaseModel]) -> tuple[Any, int]:
    fields = model.model_fields
    kept: dict[Any, Any] = {}
    unknown = 0
    for key, item in value.items():  # in Python, not in one C call: other threads run
        # Only text keys: a model may take others ("on", read as true: alerts/settings.py).
        if isinstance(key, str) and key not in fields:
            unknown += 1
            if unknown > MAX_MESSAGES:
                continue
        kept[key] = item
    cut = max(0, unknown - MAX_MESSAGES)
    out = kept if cut else value
    for name, info in fields.items():
        if name in out:
            item, count = _unknown_keys_cut(out[name], info.annotation)
            if count:
                if out is value:
                    out = dict(value)
                out[name] = item
                cut += count
    return out, cut


def _one_type(annotation: Any) -> Any:
    """The type a value is validated as: Annotated[...] unwrapped, and the one arm of an
    optional type (``X | None``); a union of several types stays what it is."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, UnionType):
        arms = [arm for arm in get_args(annotation) if arm is not type(None)]
        if len(arms) == 1:
            return _one_type(arms[0])
    return annotation


def _counts(raw: dict[Any, Any]) -> Iterator[Problem]:
    """The cluster and endpoint limits, checked before pydantic sees a huge file."""
    clusters = raw.get("clusters")
    if not isinstance(clusters, list):
        return
    if len(clusters) > MAX_CLUSTERS:
        yield ("clusters",), f"{len(clusters)} clusters; at most {MAX_CLUSTERS} are allowed"
        return
    total = sum(
        len(c["endpoints"])
        for c in clusters
        if isinstance(c, dict) and isinstance(c.get("endpoints"), list)
    )
    if total > MAX_ENDPOINTS:
        yield ("clusters",), f"{total} endpoints in all; at most {MAX_ENDPOINTS} are allowed"


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


class _Document:
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


def _serve_rules(config: Config, redact: Redact) -> Iterator[Problem]:
    yield from _duplicates(config)
    yield from _override_problems(config, redact)


def _override_problems(config: Config, redact: Redact) -> Iterator[Problem]:
    """Cross-field rules on each cluster's merged probe settings (e.g. ttft < timeout)."""
    for index, cluster in enumerate(config.clusters):
        try:
            config.probe_for(cluster)
        except ValidationError as exc:
            for error in exc.errors():
                yield ("clusters", index, "probe", *error["loc"]), describe(error, redact)


def _duplicates(config: Config) -> Iterator[Problem]:
    """Duplicate cluster names, and endpoints that are the same host:port however written
    ("[::1]:80" and "[0::1]:80" are one endpoint)."""
    names: set[str] = set()
    for i, cluster in enumerate(config.clusters):
        if cluster.name in names:
            yield ("clusters", i, "name"), f'duplicate cluster name "{cluster.name}"'
        names.add(cluster.name)
        seen: set[tuple[str, int]] = set()
        for j, endpoint in enumerate(cluster.endpoints):
            key = _canonical(endpoint.address)
            if key in seen:
                where: ConfigPath = ("clusters", i, "endpoints", j, "address")
                yield where, f'duplicate endpoint "{endpoint.address}"'
            seen.add(key)


def _canonical(address: str) -> tuple[str, int]:
    """A validated address in one spelling. An IPv4 literal has one already (leading
    zeros are refused); only IPv6 needs parsing ("[0::1]" is "[::1]")."""
    host, _, port = address.rpartition(":")
    if host.startswith("["):
        return str(ipaddress.IPv6Address(host[1:-1])), int(port)
    return host.lower().rstrip("."), int(port)


SERVE_FILE = FileModel(
    Config,
    "the file must be a YAML mapping with a 'clusters' key",
    before=_counts,
    after=_serve_rules,
)
