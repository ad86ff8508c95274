"""The served-model check and engine detection as side reads (docs/design.md §14.2,
§14.4): at start and every ``verify.every``, ``GET /v1/models``; a cluster with a
``model`` its endpoint does not list is held UNHEALTHY ("model" signal). For
``engine: auto``, the engines' info endpoints name the engine (``engines.detect``) when
/metrics does not."""

from __future__ import annotations

from collections.abc import Callable

from llm_health.core.control import BoardControl
from llm_health.engines.board_signal import set_signal
from llm_health.engines.book import Book
from llm_health.engines.served_model import wrong_model
from llm_health.engines.side_reads import READ_ERRORS, SideReads, read_error
from llm_health.engines.verdicts import MODEL_SIGNAL
from llm_health.model.causes import Cause
from llm_health.probe.target import ProbeTarget


async def check_model(
    reads: SideReads,
    target: ProbeTarget,
    book: Book,
    control: BoardControl,
    keeps: Callable[[ProbeTarget], bool],
) -> None:
    assert target.model is not None and target.models_path is not None
    state = book.endpoint(target.key)
    book.counters.model_checks_total += 1
    try:
        served = await reads.models(target, target.models_path, keep=keeps(target))
    except READ_ERRORS as exc:
        book.counters.model_failures_total += 1
        state.model_error = read_error(exc, target)
        return  # no verdict: an endpoint that cannot list its models is not judged
    state.models, state.model_error = served, ""
    wrong = wrong_model(served, target.model)
    set_signal(control, target.cluster, MODEL_SIGNAL, {target.address: (wrong, Cause.WRONG_MODEL)})


async def detect(
    reads: SideReads, target: ProbeTarget, book: Book, keeps: Callable[[ProbeTarget], bool]
) -> None:
    engine = await reads.engine(target, keep=keeps(target))
    if engine is not None:
        book.engines[target.key] = engine
