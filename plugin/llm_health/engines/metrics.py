"""An engine's own load, read from its Prometheus metrics (pure; docs/design.md §14.3).

Only the lines of the series read here are parsed, by a small parser of Prometheus text
samples (``_samples``: linear in the line, bounded by ``MAX_DOCUMENT``), into
``model.engine_load.EngineLoad``. prometheus-client's own parser costs more than a
probe for the few lines read, every second per endpoint (docs/benchmarks.md). The
engine is recognised by its metric names (``engines.detect``; docs/engines.md):

| engine    | waiting requests             | KV cache used (fraction)                     |
|-----------|------------------------------|----------------------------------------------|
| vLLM      | ``vllm:num_requests_waiting`` | ``vllm:kv_cache_usage_perc`` (older: ``vllm:gpu_cache_usage_perc``) |
| SGLang    | ``sglang:num_queue_reqs``     | ``sglang:token_usage``                        |
| TGI       | ``tgi_queue_size``            | (none)                                        |
| llama.cpp | ``llamacpp:requests_deferred`` | ``llamacpp:kv_cache_usage_ratio`` (when the build has it) |

Several series of one name (data-parallel ranks, models) add up for the queue; the KV
figure is the fullest one. A document with none of these names is a failed read (MetricsError): no verdict.

Two more figures tell whether the engine makes progress and whether it is the same
process (``llm-health agent``'s restart rule and engine-restart detection, docs/agent.md):
requests finished, a counter (vLLM ``vllm:request_success_total`` without the
``finished_reason="abort"`` series, SGLang ``sglang:num_requests_total``, TGI
``tgi_request_success``, llama.cpp ``llamacpp:tokens_predicted_total``: it has no request
counter, tokens generated grow only while it serves), and ``process_start_time_seconds``
(prometheus-client's process collector: vLLM, SGLang).

One more tells whether the engine admits new requests, the evidence of the overload rule
(docs/design.md §3.5): prompt tokens prefilled, a counter (vLLM
``vllm:prompt_tokens_total``, SGLang ``sglang:prompt_tokens_total``, llama.cpp
``llamacpp:prompt_tokens_total``; TGI ``tgi_batch_inference_count{method="prefill"}``,
prefill batches).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from llm_health.engines.detect import METRIC_PREFIXES
from llm_health.model.engine_load import EngineLoad, Histogram

# The bounds of one read (docs/engines.md, "Bounds of a /metrics read"): what a read may
# cost the prober's event loop, however hostile the document. A real engine's document
# is inside them (vLLM 0.32 with 64 data-parallel engines: 3.5 MB, 2,113 lines of the
# series read examined, 5,760 labels, lines of about 120 characters); a document past
# one is refused whole (MetricsOverrun), never read in part.
MAX_DOCUMENT = 4 * 1024 * 1024  # bytes of /metrics read at most
MAX_LINES = 4 * 1024  # lines of the read series examined (longer names included)
MAX_LINE = 4 * 1024  # characters of one such line
MAX_LABELS = 4 * MAX_LINES  # labels and escapes in their values, in those lines
MAX_ASIDE = 64  # an engine's prefix found not beginning a name, before its first name
_WAITING = {
    "vllm": ("vllm:num_requests_waiting",),
    "sglang": ("sglang:num_queue_reqs",),
    "tgi": ("tgi_queue_size",),
    "llamacpp": ("llamacpp:requests_deferred",),
}
_RUNNING = {
    "vllm": ("vllm:num_requests_running",),
    "sglang": ("sglang:num_running_reqs",),
    "tgi": ("tgi_batch_current_size",),
    "llamacpp": ("llamacpp:requests_processing",),
}
_TTFT = {  # histograms of real traffic's time to first token (docs/design.md §15.2)
    "vllm": "vllm:time_to_first_token_seconds",
    "sglang": "sglang:time_to_first_token_seconds",
}
_COMPLETED = {  # a counter that grows while the engine finishes requests
    "vllm": ("vllm:request_success_total",),
    "sglang": ("sglang:num_requests_total",),
    # TGI writes no _total (prometheus-client's parser added it to a counter's samples;
    # ``_samples`` keeps names as written): either name is read.
    "tgi": ("tgi_request_success_total", "tgi_request_success"),
    "llamacpp": ("llamacpp:tokens_predicted_total",),
}
# Admission (docs/design.md §3.5, docs/engines.md): a counter that grows only when the
# engine prefills a new request. Decode and completion counters grow in a scheduler
# deadlock too (running requests go on), and gauges freeze at their busy values in a
# hung engine: neither is read for it. TGI counts prefill batches, a series of a counter
# whose other series (``method="decode"``) is not read.
_ADMITTED = {
    "vllm": ("vllm:prompt_tokens_total",),
    "sglang": ("sglang:prompt_tokens_total",),
    "tgi": ("tgi_batch_inference_count_total", "tgi_batch_inference_count"),
    "llamacpp": ("llamacpp:prompt_tokens_total",),
}
_ADMITTED_ONLY = {name: ("method", "prefill") for name in _ADMITTED["tgi"]}
_STARTED = "process_start_time_seconds"
# Requests the client gave up on are no progress: each probe a hung engine never answers
# may be counted finished that way once the prober gives up (vLLM's finished_reason label).
_NOT_PROGRESS = ("finished_reason", "abort")
_KV_CACHE = {
    "vllm": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "sglang": ("sglang:token_usage",),
    "llamacpp": ("llamacpp:kv_cache_usage_ratio",),
}


class MetricsError(ValueError):
    """The document could not be read as Prometheus text (the message says why)."""


class MetricsOverrun(MetricsError):
    """The document is past a bound of one read (``MAX_DOCUMENT``, ``MAX_LINES``,
    ``MAX_LINE``, ``MAX_LABELS``, ``MAX_ASIDE``): ignored for that read, that endpoint's
    problem alone."""


def _names_read(engine: str, *, ttft: bool) -> tuple[str, ...]:
    """The series an ``engine``'s document is read for (``ttft``: with its TTFT buckets)."""
    names = [
        n
        for table in (_WAITING, _RUNNING, _KV_CACHE, _COMPLETED, _ADMITTED)
        for n in table.get(engine, ())
    ]
    if ttft and engine in _TTFT:
        names.append(f"{_TTFT[engine]}_bucket")
    return tuple(dict.fromkeys([*names, _STARTED]))


_READ = {
    (engine, ttft): _names_read(engine, ttft=ttft)
    for _, engine in METRIC_PREFIXES
    for ttft in (True, False)
}
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:")


def parse_load(text: str, *, ttft: bool = True) -> EngineLoad:
    """The engine's load from a /metrics document; MetricsError if the lines it reads are
    not valid Prometheus text exposition. Only the lines of the series read here are
    parsed (an engine's document is mostly histograms nobody here reads: parsing all of it
    every second per endpoint would cost more than the probes). ``ttft`` False: the TTFT
    histogram (most of the lines that are read) is left out, ``EngineLoad.ttft`` None.
    MetricsOverrun for a document past a bound of one read (``MAX_DOCUMENT`` and the
    others above): ignored whole, never read in part."""
    if len(text) > MAX_DOCUMENT:  # read as at most MAX_DOCUMENT bytes, so as many characters
        raise MetricsOverrun(f"document over {MAX_DOCUMENT} characters")
    engine, lines = _select(text, ttft=ttft)
    if engine is None:
        raise MetricsError("no metric of a known engine (vLLM, SGLang, TGI, llama.cpp)")
    values: dict[str, list[float]] = {}
    buckets: dict[float, float] = {}
    ttft_name = f"{_TTFT.get(engine, '')}_bucket"
    try:
        for name, labels, value in _samples(lines):
            if not math.isfinite(value) and name != ttft_name:
                continue
            if name == ttft_name:
                bound = float(labels.get("le", "nan"))
                buckets[bound] = buckets.get(bound, 0.0) + value
            elif labels.get(_NOT_PROGRESS[0]) == _NOT_PROGRESS[1] or _not_admission(name, labels):
                continue
            else:
                values.setdefault(name, []).append(value)
    except MetricsOverrun:
        raise
    except ValueError as exc:
        raise MetricsError(f"not Prometheus text: {str(exc)[:120]}") from None
    waiting = _first(values, _WAITING.get(engine, ()), sum)
    running = _first(values, _RUNNING.get(engine, ()), sum)
    kv_cache = _first(values, _KV_CACHE.get(engine, ()), max)
    completed = _first(values, _COMPLETED.get(engine, ()), sum)
    started = _first(values, (_STARTED,), max)
    admitted = _first(values, _ADMITTED.get(engine, ()), sum)
    return EngineLoad(
        engine,
        waiting,
        running,
        kv_cache,
        _histogram(buckets),
        completed=completed,
        process_started=started,
        admitted=admitted,
    )


def admission_counter(engine: str | None) -> str:
    """The name of ``engine``'s admission counter (reasons quote it; docs/engines.md)."""
    return _ADMITTED.get(engine or "", ("admission counter",))[0]


def _not_admission(name: str, labels: dict[str, str]) -> bool:
    """A series of an admission counter that counts something else (TGI's decode batches)."""
    only = _ADMITTED_ONLY.get(name)
    return only is not None and labels.get(only[0]) != only[1]


def _select(text: str, *, ttft: bool = True) -> tuple[str | None, list[str]]:
    """The engine the names say, and the lines of the series its load is read from.

    Each series' lines are found by ``str.find`` on the line break before its name
    (lines are separated by ``\\n``: the text exposition format), not by a Python loop
    over every line: an engine's document is mostly histograms nobody here reads, and
    the loop cost about half a microsecond a line on every read (docs/design.md §16.5,
    ``bench/side_read_cost.py``). The engine's own names are searched for from its
    first name on (none can come before it). MetricsOverrun past ``MAX_LINES`` or
    ``MAX_LINE``."""
    engine, first = _engine_in(text)
    if engine is None:
        return None, []
    lines: list[str] = []
    examined = 0
    prefix = _PREFIX[engine]
    for name in _READ[(engine, ttft)]:
        since = first if name.startswith(prefix) else 0
        examined = _lines_of(text, name, lines, examined, since)
    return engine, lines


_PREFIX = {engine: prefix for prefix, engine in METRIC_PREFIXES}


def _engine_in(text: str) -> tuple[str | None, int]:
    """``detect.engine_of_names`` over the document's names in order (a sample's, or a
    ``# TYPE`` / ``# HELP`` line's): the engine of the first line that begins with one
    of an engine's names, and where that name begins (or None, -1). Found by
    ``str.find`` of each engine's prefix (one search of the document each at most), not
    line by line: a document of millions of short lines costs no more than one of a
    few. MetricsOverrun when a prefix is found more than ``MAX_ASIDE`` times elsewhere
    than a name's start before the first name (no engine writes that)."""
    first, found = len(text), None
    for prefix, engine in METRIC_PREFIXES:
        at = _name_start(text, prefix, first)
        if at >= 0:
            first, found = at, engine
    return found, first if found is not None else -1


def _name_start(text: str, prefix: str, before: int) -> int:
    """Where ``prefix`` first begins a line's name (after ``# TYPE `` or ``# HELP ``
    in a comment) before ``before``, or -1."""
    at = text.find(prefix, 0, before + len(prefix) - 1)
    for _ in range(MAX_ASIDE):
        if at < 0 or _begins_name(text, at):
            return at
        at = text.find(prefix, at + 1, before + len(prefix) - 1)
    if at < 0:
        return at
    raise MetricsOverrun(f"{prefix} found over {MAX_ASIDE} times not beginning a name")


def _begins_name(text: str, at: int) -> bool:
    """Whether the name at ``at`` begins its line, or a ``# TYPE`` / ``# HELP`` line's
    name."""
    if at == 0 or text[at - 1] == "\n":
        return True
    lead = at - 7
    return (
        lead >= 0
        and text.startswith(("# TYPE ", "# HELP "), lead, at)
        and (lead == 0 or text[lead - 1] == "\n")
    )


def _lines_of(text: str, name: str, lines: list[str], examined: int, since: int = 0) -> int:
    """Append the sample lines of series ``name`` (the name whole, not a longer name it
    begins) that begin at ``since`` or later, in document order; the lines examined so
    far (``examined`` and these: a longer name's count too). MetricsOverrun past
    ``MAX_LINES`` or ``MAX_LINE``."""
    needle, size, end = "\n" + name, len(name), len(text)
    if since == 0 and text.startswith(name):
        start = 0
    else:
        start = _after_break(text, needle, max(since - 1, 0))
    while start >= 0:
        examined += 1
        if examined > MAX_LINES:
            raise MetricsOverrun(f"over {MAX_LINES} lines of the series read")
        stop = text.find("\n", start + size, start + MAX_LINE + 1)
        if stop < 0:
            if end - start > MAX_LINE:
                raise MetricsOverrun(f"a line of {name} over {MAX_LINE} characters")
            stop = end
        if start + size == end or text[start + size] not in _NAME_CHARS:
            lines.append(text[start:stop])
        start = _after_break(text, needle, stop)
    return examined


def _after_break(text: str, needle: str, at: int) -> int:
    """Where the next line that ``needle`` (a line break and a name) begins, or -1."""
    found = text.find(needle, at)
    return found + 1 if found >= 0 else -1


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# A label value: runs of plain characters between escapes, the matcher taking a run at
# once (not one alternative per character); the escapes it may step through are
# bounded by MAX_LABELS.
_LABEL = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*(,|\})'
)


# The common line in one match: labels with no escapes and no blanks around them, one
# blank, a value of no whitespace at all, nothing after it. What it matches, the general
# reading below reads the same (an oracle test holds the two together); anything else
# (escapes, blanks, a timestamp, a broken line) is read, or refused, by that one.
_PLAIN_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
_PLAIN = re.compile(
    rf"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{((?:{_PLAIN_LABEL}(?:,{_PLAIN_LABEL})*,?)?)\}})?"
    r"[ \t]([0-9A-Za-z.+\-_]+)"
)
_PLAIN_LABELS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def _samples(lines: list[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line (comments and blank lines skipped), as
    the text exposition format writes them: ``name{label="value",...} value [timestamp]``.
    ValueError for a line that is not one. Each line is read left to right once, most in
    a single match (``_PLAIN``, cheaper than the general reading, which handles the rest).
    MetricsOverrun past ``MAX_LABELS`` labels and
    escapes, each a step of the matchers, counted by ``str.count`` before a line is read
    (escapes only where they are read: ``_PLAIN`` takes none)."""
    labels = 0
    for line in lines:
        if not line or line.startswith("#"):
            continue
        labels += line.count("=")
        if labels > MAX_LABELS:
            raise _too_many_labels()
        plain = _PLAIN.fullmatch(line)
        if plain is not None:
            name, block, value = plain.groups()
            found = dict(_PLAIN_LABELS.findall(block)) if block else {}
            yield name, found, float(value)
            continue
        labels += line.count("\\")
        if labels > MAX_LABELS:
            raise _too_many_labels()
        yield _sample(line)


def _too_many_labels() -> MetricsOverrun:
    return MetricsOverrun(f"over {MAX_LABELS} labels and escapes in the series read")


def _sample(line: str) -> tuple[str, dict[str, str], float]:
    """One sample line by the general rules (``_samples``)."""
    name = _NAME.match(line)
    if name is None:
        raise ValueError(f"no metric name: {line[:60]!r}")
    labels: dict[str, str] = {}
    at = name.end()
    if at < len(line) and line[at] == "{":
        at = _labels(line, at + 1, labels)
    rest = line[at:].split()
    if not rest or len(rest) > 2 or (at < len(line) and line[at] not in " \t"):
        raise ValueError(f"no value: {line[:60]!r}")
    return name.group(), labels, float(rest[0])


def _labels(line: str, at: int, labels: dict[str, str]) -> int:
    """Read ``label="value",...}`` from ``at``; the index after the closing brace."""
    if line.startswith("}", at):
        return at + 1
    while True:
        label = _LABEL.match(line, at)
        if label is None:
            raise ValueError(f"bad labels: {line[:60]!r}")
        value = label.group(2)
        if "\\" in value:
            value = _unescaped(value)
        labels[label.group(1)] = value
        at = label.end()
        if label.group(3) == "}":
            return at
        if line.startswith("}", at):
            return at + 1  # a trailing comma


def _unescaped(value: str) -> str:
    """A label value's escapes read (``\\\\``, ``\\"``, ``\\n``; any other kept as
    written), left to right as the value was matched: split at the escaped backslashes
    first, so what is left has no backslash pair to misread (str methods, not a Python
    callback per escape)."""
    parts = value.split("\\\\")
    return "\\".join(p.replace('\\"', '"').replace("\\n", "\n") for p in parts)


def _histogram(buckets: dict[float, float]) -> Histogram | None:
    """Bounds ascending ending in +Inf, counts cumulative and finite; else None."""
    if not buckets or math.nan in buckets or any(b != b for b in buckets):
        return None
    bounds = tuple(sorted(buckets))
    counts = tuple(buckets[b] for b in bounds)
    if not math.isinf(bounds[-1]) or any(not math.isfinite(c) or c < 0 for c in counts):
        return None
    if any(later < earlier for earlier, later in itertools.pairwise(counts)):
        return None
    return Histogram(bounds, counts)


def _first(values: dict[str, list[float]], names: tuple[str, ...], fold: object) -> float | None:
    for name in names:
        found = values.get(name)
        if found:
            return float(fold(found))  # type: ignore[operator]
    return None


def saturation(load: EngineLoad, queue_threshold: float, kv_cache_threshold: float) -> str | None:
    """Why the engine counts as saturated (the reason text), or None."""
    if load.waiting is not None and load.waiting >= queue_threshold:
        return f"{load.waiting:g} waiting ≥ {queue_threshold:g}"
    if load.kv_cache is not None and load.kv_cache >= kv_cache_threshold:
        return f"KV cache {load.kv_cache:.0%} used ≥ {kv_cache_threshold:.0%}"
    return None


STALE_AFTER = 3  # failed reads in a row after which the last figures are dropped


@dataclass(frozen=True, slots=True)
class Reading:
    """An endpoint's metrics as the checker knows them: the last good load, how many reads
    have failed since, and the last failure's text. Figures older than STALE_AFTER failed
    reads are not used (a missing /metrics is not a dead engine: no verdict)."""

    load: EngineLoad | None = None
    failures: int = 0
    error: str = ""

    def read(self, load: EngineLoad) -> Reading:
        return Reading(load)

    def failed(self, error: str) -> Reading:
        return Reading(self.load, self.failures + 1, error)

    @property
    def usable(self) -> EngineLoad | None:
        return self.load if self.load is not None and self.failures < STALE_AFTER else None
