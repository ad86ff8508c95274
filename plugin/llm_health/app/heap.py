"""The garbage collector after start-up (docs/design.md §16.4).

CPython's cyclic collector pauses the whole loop, and a full collection walks every
tracked object: the config, the board, the gRPC and protobuf modules, the HTTP stacks.
At 1,000 endpoints those pauses reached 67 ms, read by every probe in flight as TTFT.
Almost all of that heap is made at start-up and lives as long as the process, so once the
first probe round is done it is collected once and frozen (``gc.freeze``: moved to a
generation the collector never walks), and the youngest generation is collected less
often. Garbage cycles made later are still collected; an object frozen at start-up that
dies later is freed by reference counting as usual (only a cycle among frozen objects
would wait, and there are none worth counting).
"""

from __future__ import annotations

import gc

# gen0 collects when allocations minus deallocations exceed this: probes allocate
# hundreds of short-lived objects each; the default 700 collects several times per probe.
GEN0_THRESHOLD = 10_000
_settled = False


def settle_heap() -> None:
    """Collect and freeze what is alive now; raise the gen0 threshold. Once per process
    (a second runtime in the same process, as in tests, changes nothing more)."""
    global _settled
    if _settled:
        return
    _settled = True
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
