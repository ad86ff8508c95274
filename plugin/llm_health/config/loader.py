"""Loading the YAML configuration: read, parse, expand ``${ENV}``, validate.

Errors name the file line and the field path, one line per problem:
    llm-health.yaml:14 clusters[0].probe.timeout: "80x" is not a duration
``load_config`` and ``parse_config`` return a Config or raise ConfigError carrying every
message; nothing else escapes them, whatever the file holds (docs/design.md §7.11).
``load_file`` and ``parse_file`` do the same for any file model (a ``FileModel``: its root
model and the checks before and after validation): ``serve``'s is ``SERVE_FILE``,
``llm-health agent``'s is ``config.agent.AGENT_FILE``.

Reading (``config.reading``: regular files only, bounded), composing the YAML
(``config.composer``: bounded, ``${ENV}`` expanded), cutting unknown keys past those shown
(``config.pruning``), validating (``config.schema``), then the rules across fields and
sections (``config.rules``). This module only runs those steps in order and words their
problems.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from llm_health.config import rules
from llm_health.config.composer import Document
from llm_health.config.messages import (
    ConfigPath,
    describe,
    dotted,
    finish,
    first_written,
    format_errors,
    line_of,
)
from llm_health.config.pruning import unknown_keys_cut
from llm_health.config.reading import MAX_FILE_BYTES, read_text, too_big
from llm_health.config.rules import Problem
from llm_health.config.schema import Config
from llm_health.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
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
        text = read_text(file)
    except ConfigError as exc:
        raise ConfigError(finish(exc.messages)) from None
    except Exception as exc:
        raise ConfigError(finish([f"{file}: cannot read: {type(exc).__name__}"])) from None
    return parse_file(text, file.name, os.environ if environ is None else environ, kind)


def parse_config(text: str, source: str, environ: Mapping[str, str]) -> Config:
    """Validate the YAML ``text`` (named ``source`` in messages). Raises ConfigError."""
    return parse_file(text, source, environ, SERVE_FILE)


def parse_file(text: str, source: str, environ: Mapping[str, str], kind: FileModel[M]) -> M:
    """``parse_config`` for a file of ``kind``."""
    document = Document(source, environ)
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


def _parse(text: str, document: Document, kind: FileModel[M]) -> M:
    source = document.source
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError([f"{source}: {too_big(len(text))}"])
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
    raw, unlisted = unknown_keys_cut(raw, kind.model)
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


def _serve_rules(config: Config, redact: Redact) -> Iterator[Problem]:
    """``config.rules`` over the validated serve file."""
    yield from rules.duplicates((c.name, [e.address for e in c.endpoints]) for c in config.clusters)
    merges = [partial(config.probe_for, cluster) for cluster in config.clusters]
    yield from rules.merged_probes(merges, lambda error: describe(error, redact))


SERVE_FILE = FileModel(
    Config,
    "the file must be a YAML mapping with a 'clusters' key",
    before=rules.counts,
    after=_serve_rules,
)
