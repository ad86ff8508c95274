"""Which Envoy node ids hold an open xDS stream right now (any flavour).

Other features ask ``is_open(node_id)`` through a plain ``Callable[[str], bool]`` that
``app.assemble`` hands them (features never import each other): HDS reports and
access-log entries count only from nodes that also take their endpoints from us
(docs/design.md §7.6, §15.1), so a client that only opens HDS or access-log streams
under made-up node ids cannot eject or degrade anything.

Reference counts per node id (an Envoy may hold several streams: ADS plus a reconnect
that overlaps the old stream, or one standalone EDS stream per cluster); an id leaves
with its last stream, so memory is bounded by the open streams. One event loop.
"""

from __future__ import annotations


class OpenNodes:
    """Node ids with at least one open xDS stream."""

    def __init__(self) -> None:
        self._streams: dict[str, int] = {}

    def add(self, node_id: str) -> None:
        self._streams[node_id] = self._streams.get(node_id, 0) + 1

    def remove(self, node_id: str) -> None:
        left = self._streams.get(node_id, 0) - 1
        if left > 0:
            self._streams[node_id] = left
        else:
            self._streams.pop(node_id, None)

    def is_open(self, node_id: str) -> bool:
        return node_id in self._streams

    def __len__(self) -> int:
        return len(self._streams)
