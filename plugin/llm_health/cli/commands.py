"""The table of ``llm-health``'s subcommands: each one's name, one-line help and module.

It imports nothing: ``llm-health --help`` and ``--version`` build the command list from it
alone, and a command's module (its arguments, and whatever it imports: aiohttp, grpc,
pydantic) is imported only when that command runs or shows its own help.
"""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    module: str  # llm_health.cli.<module>, whose ``register`` adds the command
    summary: str  # the one-line help in ``llm-health --help``


COMMANDS: dict[str, Command] = {
    "serve": Command("serve", "run the plugin: probe, serve xDS to Envoy, serve /status"),
    "probe": Command("probe", "send micro-probes to a live endpoint and print TTFT"),
    "validate": Command("validate", "check a config file and exit"),
    "sim": Command("sim", "run the fault-injecting OpenAI-compatible fake inference server"),
    "agent": Command("agent", "run beside one engine in its pod: answer the kubelet's probes"),
    "status": Command("admin", "endpoint states from a running plugin"),
    "drain": Command("admin", "take an endpoint out of rotation (DRAINING)"),
    "undrain": Command("admin", "bring a drained endpoint back"),
    "force": Command("admin", "force a state for a while (maintenance)"),
    "clear-override": Command("admin", "end a forced state now"),
    "probe-now": Command("admin", "probe an endpoint now and fold the result in"),
}


def summary(name: str) -> str:
    """The one-line help of command ``name`` (its module passes it to ``add_parser``)."""
    return COMMANDS[name].summary
