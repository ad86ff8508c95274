"""What the demo shows: the table redrawn every second, and what it reads from ``serve``'s
``/status`` and Envoy's admin ``/clusters`` to fill it. Pure: no process, no network."""

from __future__ import annotations

import shutil
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

SHARE_WINDOW_S = 5
HEADER = [
    "backend",
    "fault",
    "state",
    "weight",
    "Envoy sees",
    "TTFT",
    "last probe",
    "traffic",
    "reason",
]
COLUMN_GAP = "  "
REASON_INDENT = "    "  # a reason too long for its column: on the lines below its row
MIN_REASON_WIDTH = 40
EVENTS_SHOWN = 6


@dataclass
class Timeline:
    """What happens when, in seconds after traffic starts."""

    break_at: float = 25.0
    heal_at: float = 50.0
    end_at: float = 78.0


@dataclass
class Frame:
    """One redraw: the title line, the table (header first), the events so far, and the
    user requests sent through Envoy (sent, ok, failed)."""

    title: str
    rows: list[list[str]]
    events: list[str]
    counts: tuple[int, int, int]


def draw(elapsed: float, frame: Frame) -> None:
    """On a terminal: the screen redrawn every call. Otherwise (a pipe, a log): the frame
    appended every 5 seconds."""
    tty = sys.stdout.isatty()
    lines = render(frame, shutil.get_terminal_size().columns if tty else None)
    if tty:
        print("\033[2J\033[H" + "\n".join(lines), flush=True)
    elif int(elapsed) % 5 == 0:
        print("\n".join(lines) + "\n", flush=True)


def render(frame: Frame, width: int | None) -> list[str]:
    sent, ok, failed = frame.counts
    return [
        frame.title,
        "",
        *table(frame.rows, width),
        "",
        f"user requests through Envoy: {sent} sent, {ok} ok, {failed} failed "
        f"(traffic: share of the last {SHARE_WINDOW_S} s)",
        "",
        *frame.events[-EVENTS_SHOWN:],
    ]


def table(rows: list[list[str]], width: int | None) -> list[str]:
    """``rows`` (the header first) as aligned columns. The last column (the reason) is never
    cut: a reason that does not fit the rest of the line (``width``: the terminal's; None =
    no limit) goes whole onto the lines below its row, wrapped at spaces to ``width`` and
    indented by REASON_INDENT, so an engine's long error stays readable."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lead = sum(w + len(COLUMN_GAP) for w in widths[:-1])
    lines = []
    for row in rows:
        cells = "".join(c.ljust(w) + COLUMN_GAP for c, w in zip(row[:-1], widths[:-1], strict=True))
        reason = row[-1]
        if width is None or lead + len(reason) <= width:
            lines.append((cells + reason).rstrip())
            continue
        lines.append(cells.rstrip())
        lines += textwrap.wrap(
            reason,
            max(width, len(REASON_INDENT) + MIN_REASON_WIDTH),
            initial_indent=REASON_INDENT,
            subsequent_indent=REASON_INDENT,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return lines


def find_endpoint(status: dict[str, Any], address: str) -> dict[str, Any]:
    """``address``'s entry in ``serve``'s ``/status``; {} while it has none."""
    for cluster in status.get("clusters", []):
        for endpoint in cluster.get("endpoints", []):
            if endpoint.get("address") == address:
                return dict(endpoint)
    return {}


def _envoy_host(clusters: dict[str, Any], port: int) -> dict[str, Any] | None:
    for cluster in clusters.get("cluster_statuses", []):
        for host in cluster.get("host_statuses", []):
            if host.get("address", {}).get("socket_address", {}).get("port_value") == port:
                return dict(host)
    return None


def envoy_sees(clusters: dict[str, Any], port: int) -> str:
    """The EDS health and weight Envoy's admin ``/clusters`` reports for the host."""
    host = _envoy_host(clusters, port)
    if host is None:
        return "(none yet)"
    flag = host.get("health_status", {}).get("eds_health_status", "?")
    return f"{flag} w={host.get('weight', '?')}"


def envoy_requests(clusters: dict[str, Any], port: int) -> int:
    """The host's ``rq_total`` in Envoy's admin ``/clusters``: user requests only (the
    probes go to the engine directly, not through Envoy); 0 before Envoy knows it."""
    host = _envoy_host(clusters, port) or {}
    for stat in host.get("stats", []):
        if stat.get("name") == "rq_total":
            return int(stat.get("value", 0))
    return 0


def probe_cells(endpoint: dict[str, Any]) -> tuple[str, str, str, str]:
    """(state, weight sent to Envoy, last TTFT, last probe's outcome) from ``/status``."""
    last = endpoint.get("last_probe") or {}
    ttft = last.get("ttft_ms")
    return (
        str(endpoint.get("state", "?")).upper(),
        f"{endpoint.get('envoy', {}).get('weight', '?')}",
        "-" if ttft is None else f"{ttft:.0f} ms",
        str(last.get("outcome", "-")),
    )


@dataclass
class Shares:
    """Each backend's share of the user requests of the last SHARE_WINDOW_S seconds, from
    a counter of user requests per backend sampled once a redraw."""

    seen: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def update(self, now: float, counts: dict[str, int]) -> dict[str, float]:
        recent: dict[str, int] = {}
        for name, count in counts.items():
            samples = self.seen.setdefault(name, [])
            samples.append((now, count))
            del samples[:-64]
            old = next((n for t, n in samples if now - t <= SHARE_WINDOW_S), count)
            recent[name] = count - old
        total = sum(recent.values())
        return {name: (n / total if total else 0.0) for name, n in recent.items()}


def share_cell(share: float) -> str:
    return f"{share * 100:5.1f} %"


@dataclass
class StateLog:
    """Each backend's state as sampled: its changes (for the events) and the seconds spent
    in each state (for the summary at the end)."""

    last: dict[str, str] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)
    spent: dict[str, dict[str, float]] = field(default_factory=dict)

    def sample(self, name: str, state: str, at: float) -> bool:
        """Record ``state`` at ``at`` seconds; True when it differs from the last one."""
        before = self.last.get(name)
        if before is not None:
            spent = self.spent.setdefault(name, {})
            spent[before] = spent.get(before, 0.0) + at - self.since[name]
        self.last[name], self.since[name] = state, at
        return before is not None and before != state

    def summary(self, name: str) -> str:
        spent = self.spent.get(name, {})
        return ", ".join(f"{state} {seconds:.0f} s" for state, seconds in spent.items()) or "-"
