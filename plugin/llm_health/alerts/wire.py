"""What a webhook receives and what it is called (pure: no I/O).

- ``encode``: a payload (``events.payload``, ``ratelimit.summary_payload``) as the bytes
  POSTed, compact JSON;
- ``request_headers``: the receiver's own headers (secrets, from the config) between ours;
  ``X-LLM-Health-Event-Id`` is the event's id, the same on every attempt;
- ``origin``: ``scheme://host[:port]`` of a webhook URL, the only part of it ever logged
  or shown: the path and query may carry a token (docs/design.md §7.10).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

USER_AGENT = "llm-health-alerts/1"


def encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def request_headers(own: Mapping[str, str], event_id: str) -> dict[str, str]:
    return {
        "User-Agent": USER_AGENT,
        **own,
        "Content-Type": "application/json",
        "X-LLM-Health-Event-Id": event_id,
    }


def origin(url: str) -> str:
    """scheme://host[:port] only: the path and query may carry a token."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
