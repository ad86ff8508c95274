"""The prober's wiring that ``serve`` (``app.runtime``) and ``llm-health agent``
(``app.agent``) share: the scheduler probing through the per-endpoint probe slots
(``probe.inflight``) and folding into the keeper's board."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llm_health.app.keeper import BoardKeeper
from llm_health.core.control import ProberLag
from llm_health.model.outcome import ProbeResult
from llm_health.probe.inflight import ProbeSlots
from llm_health.probe.scheduler import ResultFn, Scheduler, SilenceFn
from llm_health.probe.signals import ProbeReceiver, Started
from llm_health.probe.target import ProbeTarget


def probe_scheduler(
    control: BoardKeeper,
    targets: Sequence[ProbeTarget],
    slots: ProbeSlots,
    *,
    on_result: ResultFn | None = None,
    on_silence: SilenceFn | None = None,
    skip: Callable[[ProbeTarget], bool] | None = None,
) -> Scheduler:
    """A scheduler probing through ``slots`` whose results and in-flight silences fold
    into the keeper's board (unless ``on_result`` / ``on_silence`` say otherwise), with
    the confirming probe beside a silent one (docs/design.md §2.7)."""

    def fold(target: ProbeTarget, result: ProbeResult) -> None:
        control.fold_result(target.cluster, target.address, result)

    async def silence(target: ProbeTarget, silent_ms: float) -> bool:
        return await control.fold_silence(target.cluster, target.address, silent_ms)

    def confirm(target: ProbeTarget, receiver: ProbeReceiver) -> Started:
        control.stats.overlapping_confirms += 1
        return slots.confirm(target, receiver)

    return Scheduler(
        targets,
        slots.start,
        on_result or fold,
        on_silence=on_silence or silence,
        confirm=confirm,
        lag=ProberLag(control.stats),
        skip=skip,
    )
