"""Admission: when the simulated engine starts a request (its prefill), and what it counts.

An engine with ``FaultSpec.slots`` runs at most that many requests at once; the others
wait in arrival order (probes too: they queue behind users, as in vLLM with
``--max-num-seqs``). Each request admitted adds its prompt tokens to the engine's
prompt-token counter (``vllm:prompt_tokens_total``, …), which ``llm-health`` reads as the
evidence that a busy engine still admits work (docs/design.md §3.5). Under the faults of
:data:`~llm_health.sim.faults.NOT_ADMITTING` ("frozen", "deadlock") nothing is admitted:
a request waits until the fault is lifted, ``hang_max`` passes or its client leaves.
"""

from __future__ import annotations

import time

from llm_health.sim.call import Call, pause
from llm_health.sim.faults import NOT_ADMITTING

__all__ = ["admit", "prompt_tokens"]

#: How often a request waiting for admission looks again (a simulator: a poll is plain
#: and bounded; 20 waiting requests cost 1,000 wake-ups a second at most).
ADMIT_POLL_S = 0.02


def prompt_tokens(call: Call) -> int:
    """The request's prompt in tokens, as the simulator counts them (4 characters each,
    at least 1): what admitting it adds to the prompt-token counter."""
    params = call.params
    text = params.prompt if isinstance(params.prompt, str) else str(params.messages or "")
    return max(1, len(text) // 4)


async def admit(call: Call) -> bool:
    """Wait until the engine admits ``call``: a free slot and its turn, the engine
    admitting at all (the slot is freed by :func:`~llm_health.sim.call.end_call`). False if ``hang_max`` passed first (ClientGone, Stopping as
    :func:`~llm_health.sim.call.pause`)."""
    state = call.state
    if _open(call) and not state.admission_queue:
        _take(call)
        return True
    deadline = time.monotonic() + call.spec.hang_max
    state.admission_queue.append(call)
    try:
        while not (_open(call) and state.admission_queue[0] is call):
            if time.monotonic() >= deadline:
                return False
            await pause(call, ADMIT_POLL_S)
    finally:
        state.admission_queue.remove(call)
    _take(call)
    return True


def _open(call: Call) -> bool:
    """The engine admits now, and has a free slot."""
    spec = call.state.fault
    if spec.fault in NOT_ADMITTING:
        return False
    return spec.slots is None or call.state.admitted < spec.slots


def _take(call: Call) -> None:
    call.admitted = True
    call.state.admitted += 1
    call.state.admissions += 1
    call.state.prompt_tokens += prompt_tokens(call)
