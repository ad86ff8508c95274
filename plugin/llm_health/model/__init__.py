"""The pure domain: states, outcomes, policy, decisions. No I/O, no grpc, no aiohttp."""

from llm_health.model.durations import format_duration, parse_duration
from llm_health.model.envoy_view import EnvoyHealth, EnvoyView, envoy_view
from llm_health.model.machine import Transition, initial_health, step, trusted
from llm_health.model.outcome import FAILURES, SUCCESSES, Outcome, ProbeResult
from llm_health.model.policy import Policy
from llm_health.model.states import EndpointHealth, State

__all__ = [
    "FAILURES",
    "SUCCESSES",
    "EndpointHealth",
    "EnvoyHealth",
    "EnvoyView",
    "Outcome",
    "Policy",
    "ProbeResult",
    "State",
    "Transition",
    "envoy_view",
    "format_duration",
    "initial_health",
    "parse_duration",
    "step",
    "trusted",
]
