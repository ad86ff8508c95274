"""Admin commands on top of the admin gRPC API: ``status``, ``drain``, ``undrain``,
``force``, ``clear-override``, ``probe-now``.

grpc and the generated stubs are imported inside the command functions, so
``llm-health validate`` and ``--help`` stay light. Exit codes: 0 done, 1 the API could not
be reached, refused the call (token, unknown endpoint) or a probe got no token, 2 bad
usage or an argument the API rejects.

``status --json`` prints ``{"revision", "clusters"}`` exactly as ``/status`` shows them
(built by the same ``status_document`` from the API's answer); ``--watch`` then follows
the change stream (``WatchEndpoints``), one line (or one JSON object) per change.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from llm_health.cli.argtypes import duration
from llm_health.cli.commands import summary
from llm_health.cli.text import ms
from llm_health.model.board import EndpointSnapshot, HealthSnapshot

DEFAULT_ADMIN = "127.0.0.1:18000"
TOKEN_ENV = "LLM_HEALTH_ADMIN_TOKEN"
ADMIN_ENV = "LLM_HEALTH_ADMIN"
FORCEABLE = ("healthy", "degraded", "unhealthy", "draining")
DEFAULT_WIDTH = 100
MIN_REASON = 12
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class CommandError(Exception):
    """A failure already explained in words; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# --- argparse ------------------------------------------------------------------------------


def register(commands: Any) -> None:
    """Add every admin subcommand to ``commands`` (argparse subparsers)."""
    status = _command(commands, "status", _status)
    status.add_argument("--cluster", default="", help="only this cluster")
    status.add_argument("--json", action="store_true", help="print /status's clusters as JSON")
    status.add_argument("--watch", action="store_true", help="then print every change")
    drain = _command(commands, "drain", _drain)
    _endpoint_args(drain)
    drain.add_argument("--reason", default="", help="shown in /status and the logs")
    undrain = _command(commands, "undrain", _undrain)
    _endpoint_args(undrain)
    force = _command(commands, "force", _force)
    _endpoint_args(force)
    force.add_argument("state", choices=FORCEABLE)
    force.add_argument("--for", dest="duration", type=duration, required=True, metavar="DURATION")
    force.add_argument("--reason", default="")
    clear = _command(commands, "clear-override", _clear)
    _endpoint_args(clear)
    probe = _command(commands, "probe-now", _probe)
    _endpoint_args(probe)
    probe.add_argument("--json", action="store_true")


def _command(
    commands: Any, name: str, run: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    help_text = summary(name)
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=help_text, description=help_text
    )
    parser.add_argument(
        "--admin",
        default=os.environ.get(ADMIN_ENV, DEFAULT_ADMIN),
        metavar="ADDR",
        help=f"the plugin's admin gRPC address (host:port or unix:/path; ${ADMIN_ENV}; "
        f"default {DEFAULT_ADMIN})",
    )
    parser.add_argument("--token", default=None, help=f"bearer token (default: ${TOKEN_ENV})")
    parser.add_argument("--timeout", type=duration, default=5.0, metavar="DURATION")
    parser.set_defaults(func=lambda args: _run(run, args))
    return parser


def _endpoint_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cluster")
    parser.add_argument("address", help="host:port as in the config")


def _run(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return run(args)
    except CommandError as exc:
        print(f"llm-health {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 0


# --- the client ----------------------------------------------------------------------------


class _Client:
    """A blocking stub with the token and a deadline on every call; gRPC errors become
    CommandError with a sentence a human can act on."""

    def __init__(self, args: argparse.Namespace) -> None:
        import grpc

        from llm_health.adminpb import admin_pb2_grpc

        self.address = args.admin
        self._timeout = args.timeout
        token = args.token if args.token is not None else os.environ.get(TOKEN_ENV, "")
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        # ListEndpoints of a large fleet can pass gRPC's default 4 MiB receive limit.
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        self._channel = grpc.insecure_channel(args.admin, options=options)
        self.stub = admin_pb2_grpc.AdminStub(self._channel)  # type: ignore[no-untyped-call]

    def call(self, method: str, request: Any) -> Any:
        import grpc

        try:
            return getattr(self.stub, method)(
                request, timeout=self._timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise self._error(exc) from None

    def stream(self, method: str, request: Any) -> Iterator[Any]:
        import grpc

        received = False
        try:
            for message in getattr(self.stub, method)(request, metadata=self._metadata):
                received = True
                yield message
        except grpc.RpcError as exc:
            if received and exc.code() is grpc.StatusCode.UNAVAILABLE:
                raise CommandError(
                    f"lost the admin API at {self.address}: {exc.details()}"
                ) from None
            raise self._error(exc) from None

    def _error(self, exc: Any) -> CommandError:
        import grpc

        code, details = exc.code(), exc.details() or ""
        if code is grpc.StatusCode.UNAVAILABLE:
            return CommandError(f"cannot reach the admin API at {self.address}: {details}")
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return CommandError(f"no answer from {self.address} within {self._timeout:g} s")
        if code is grpc.StatusCode.UNAUTHENTICATED:
            return CommandError(f"{details} (pass --token or set ${TOKEN_ENV})")
        if code is grpc.StatusCode.UNIMPLEMENTED:
            return CommandError(f"{self.address} does not serve the admin API (admin.grpc?)")
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            return CommandError(details, code=2)
        return CommandError(details or str(code))

    def close(self) -> None:
        self._channel.close()


def _with_client(args: argparse.Namespace, work: Callable[[_Client], int]) -> int:
    client = _Client(args)
    try:
        return work(client)
    finally:
        client.close()


# --- commands ------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from llm_health.adminpb import admin_pb2 as pb
    from llm_health.servers.admin_codec import snapshot_from_pb

    def work(client: _Client) -> int:
        if args.watch:
            return _watch(client, args)
        answer = client.call("ListEndpoints", pb.ListEndpointsRequest(cluster=args.cluster))
        snapshot = snapshot_from_pb(answer)
        out = sys.stdout
        if args.json:
            print(json.dumps(status_json(snapshot), indent=2), file=out)
        else:
            print(render_table(snapshot, _width()), file=out)
        return 0

    return _with_client(args, work)


def _watch(client: _Client, args: argparse.Namespace) -> int:
    from llm_health.adminpb import admin_pb2 as pb
    from llm_health.servers.admin_codec import endpoint_from_pb, snapshot_from_pb

    known: dict[tuple[str, str], EndpointSnapshot] = {}
    request = pb.WatchEndpointsRequest(cluster=args.cluster)
    for message in client.stream("WatchEndpoints", request):
        if message.initial:
            full = pb.ListEndpointsResponse(revision=message.revision, clusters=message.clusters)
            snapshot = snapshot_from_pb(full)
            _emit(
                json.dumps(status_json(snapshot)) if args.json else render_table(snapshot, _width())
            )
            endpoints = [e for c in snapshot.clusters.values() for e in c.endpoints]
            removed: list[tuple[str, str]] = []
        else:
            endpoints = [endpoint_from_pb(e) for e in message.endpoints]
            removed = [(k.cluster, k.address) for k in message.removed]
            _print_changes(known, endpoints, removed, message.revision, args.json)
        known.update({(e.cluster, e.spec.address): e for e in endpoints})
        for key in removed:
            known.pop(key, None)
    return 0


def _print_changes(
    known: dict[tuple[str, str], EndpointSnapshot],
    endpoints: list[EndpointSnapshot],
    removed: list[tuple[str, str]],
    revision: int,
    as_json: bool,
) -> None:
    from llm_health.ops.status_document import status_document

    now = time.time()
    if as_json:
        changed = []
        for endpoint in endpoints:
            doc = status_document(_as_snapshot([endpoint], revision))
            entry = doc["clusters"][0]["endpoints"][0]
            entry["cluster"] = endpoint.cluster
            entry["previous_state"] = _previous(known, endpoint.cluster, endpoint.spec.address)
            changed.append(entry)
        gone = [{"cluster": c, "address": a} for c, a in removed]
        _emit(json.dumps({"revision": revision, "at": now, "changed": changed, "removed": gone}))
        return
    for endpoint in endpoints:
        _emit(change_line(known.get((endpoint.cluster, endpoint.spec.address)), endpoint, now))
    for cluster, address in removed:
        _emit(f"{_clock(now)}  {cluster}  {address}  removed")


def _previous(
    known: dict[tuple[str, str], EndpointSnapshot], cluster: str, address: str
) -> str | None:
    before = known.get((cluster, address))
    return None if before is None else before.state.value


def _drain(args: argparse.Namespace) -> int:
    from llm_health.adminpb import admin_pb2 as pb

    request = pb.DrainRequest(cluster=args.cluster, address=args.address, reason=args.reason)
    return _with_client(args, lambda c: _report(c.call("Drain", request), "drained"))


def _undrain(args: argparse.Namespace) -> int:
    from llm_health.adminpb import admin_pb2 as pb

    request = pb.EndpointRequest(cluster=args.cluster, address=args.address)
    return _with_client(args, lambda c: _report(c.call("Undrain", request), "undrained"))


def _force(args: argparse.Namespace) -> int:
    from google.protobuf.duration_pb2 import Duration

    from llm_health.adminpb import admin_pb2 as pb
    from llm_health.model.states import State
    from llm_health.servers.admin_codec import state_to_pb

    length = Duration()
    length.FromNanoseconds(round(args.duration * 1e9))
    request = pb.ForceStateRequest(
        cluster=args.cluster,
        address=args.address,
        state=state_to_pb(State(args.state)),
        duration=length,
        reason=args.reason,
    )
    return _with_client(args, lambda c: _report(c.call("ForceState", request), "forced"))


def _clear(args: argparse.Namespace) -> int:
    from llm_health.adminpb import admin_pb2 as pb

    request = pb.EndpointRequest(cluster=args.cluster, address=args.address)
    return _with_client(args, lambda c: _report(c.call("ClearOverride", request), "cleared"))


def _report(answer: Any, verb: str) -> int:
    from llm_health.servers.admin_codec import endpoint_from_pb

    endpoint = endpoint_from_pb(answer.endpoint)
    note = "" if answer.changed else " (nothing to change)"
    until = ""
    if endpoint.override_until is not None:
        until = f" until {time.strftime('%H:%M:%S', time.localtime(endpoint.override_until))}"
    print(
        f"{endpoint.cluster} {endpoint.spec.address}: {verb}{note}; now {endpoint.state.value}"
        f"{until}, Envoy {endpoint.view.health.value} weight {endpoint.view.weight} "
        f"({endpoint.reason})"
    )
    return 0


def _probe(args: argparse.Namespace) -> int:
    from llm_health.adminpb import admin_pb2 as pb
    from llm_health.model.outcome import SUCCESSES
    from llm_health.servers.admin_codec import endpoint_from_pb, result_from_pb

    request = pb.EndpointRequest(cluster=args.cluster, address=args.address)

    def work(client: _Client) -> int:
        answer = client.call("ProbeNow", request)
        result, endpoint = result_from_pb(answer.result), endpoint_from_pb(answer.endpoint)
        if args.json:
            doc = _probe_json(result)
            doc.update(state=endpoint.state.value, ignored=answer.ignored)
            print(json.dumps(doc, indent=2))
        else:
            ignored = " (ignored: prober loop lagged)" if answer.ignored else ""
            print(
                f"{endpoint.cluster} {endpoint.spec.address}: {result.outcome.value.upper()}  "
                f"ttft {ms(result.ttft_ms, 'ms')}  connect {ms(result.connect_ms, 'ms')}  "
                f"headers {ms(result.headers_ms, 'ms')}{ignored} -> now {endpoint.state.value}, "
                f"Envoy weight {endpoint.view.weight}"
                + (f"  ({result.detail})" if result.detail else "")
            )
        return 0 if result.outcome in SUCCESSES else 1

    return _with_client(args, work)


def _probe_json(result: Any) -> dict[str, Any]:
    return {
        "outcome": result.outcome.value,
        "ttft_ms": result.ttft_ms,
        "connect_ms": result.connect_ms,
        "headers_ms": result.headers_ms,
        "status": result.status,
        "detail": result.detail,
        "loop_lag_ms": result.loop_lag_ms,
    }


# --- rendering (pure) ----------------------------------------------------------------------


def status_json(snapshot: HealthSnapshot) -> dict[str, Any]:
    """``{"revision", "clusters"}`` exactly as the plugin's /status has them."""
    from llm_health.ops.status_document import status_document

    doc = status_document(snapshot)
    return {"revision": doc["revision"], "clusters": doc["clusters"]}


_COLUMNS = ("CLUSTER", "ENDPOINT", "STATE", "ENVOY", "WEIGHT", "LAST", "TTFT", "FOR", "REASON")


def render_table(
    snapshot: HealthSnapshot, width: int = DEFAULT_WIDTH, now: float | None = None
) -> str:
    """One line per endpoint, every line at most ``width`` characters (the reason, then
    long names, are cut with "~")."""
    now = time.time() if now is None else now
    rows = [_row(e, now) for c in snapshot.clusters.values() for e in c.endpoints]
    widths = [len(h) for h in _COLUMNS]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    widths[0], widths[1] = _name_widths(widths, width)
    fixed = sum(widths[:-1]) + 2 * (len(widths) - 1)
    widths[-1] = max(MIN_REASON, width - fixed)
    lines = [_summary(snapshot)]
    lines += [_line(row, widths)[:width] for row in [list(_COLUMNS), *rows]]
    return "\n".join(lines)


def _name_widths(widths: list[int], width: int) -> tuple[int, int]:
    """Cluster and endpoint column widths: natural if they fit beside the other columns
    and MIN_REASON of reason, else shrunk (cluster to a third of the room)."""
    others = sum(widths[2:-1]) + 2 * (len(widths) - 1) + MIN_REASON
    room = max(20, width - others)
    if widths[0] + widths[1] <= room:
        return widths[0], widths[1]
    cluster = max(8, min(widths[0], room // 3))
    return cluster, max(12, room - cluster)


def _summary(snapshot: HealthSnapshot) -> str:
    counts: dict[str, int] = {}
    total = 0
    for cluster in snapshot.clusters.values():
        for endpoint in cluster.endpoints:
            counts[endpoint.state.value] = counts.get(endpoint.state.value, 0) + 1
            total += 1
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"revision {snapshot.revision}: {total} endpoints" + (f" ({parts})" if parts else "")


def _row(e: EndpointSnapshot, now: float) -> list[str]:
    last = e.last
    return [
        e.cluster,
        e.spec.address,
        e.state.value + ("*" if e.override_until is not None else ""),
        e.view.health.value.lower(),
        str(e.view.weight),
        last.outcome.value if last else "-",
        ms(last.ttft_ms, "ms") if last else "-",
        _age(now - e.since),
        e.reason,
    ]


def _line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(_fit(c, w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _fit(text: str, width: int) -> str:
    return text.ljust(width) if len(text) <= width else text[: width - 1] + "~"


def change_line(before: EndpointSnapshot | None, after: EndpointSnapshot, now: float) -> str:
    """``12:00:01.234  llama-70b  10.0.0.1:8000  healthy -> unhealthy  envoy unhealthy/100  reason``"""
    if before is None:
        move = f"added {after.state.value}"
    elif before.state is after.state:
        move = f"{after.state.value} (unchanged)"
    else:
        move = f"{before.state.value} -> {after.state.value}"
    envoy = f"envoy {after.view.health.value.lower()}/{after.view.weight}"
    return f"{_clock(now)}  {after.cluster}  {after.spec.address}  {move}  {envoy}  {after.reason}"


def _as_snapshot(endpoints: list[EndpointSnapshot], revision: int) -> HealthSnapshot:
    from types import MappingProxyType

    from llm_health.model.board import ClusterSnapshot

    grouped: dict[str, list[EndpointSnapshot]] = {}
    for endpoint in endpoints:
        grouped.setdefault(endpoint.cluster, []).append(endpoint)
    clusters = {n: ClusterSnapshot(n, tuple(es), True, "") for n, es in grouped.items()}
    return HealthSnapshot(revision, MappingProxyType(clusters))


def _emit(text: str, out: TextIO | None = None) -> None:
    stream = out or sys.stdout
    stream.write(text + "\n")
    stream.flush()


def _width() -> int:
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch)) + f".{int(epoch % 1 * 1000):03d}"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"
