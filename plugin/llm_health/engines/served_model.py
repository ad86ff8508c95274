"""The served-model check (pure; docs/design.md §14.2): what an endpoint's OpenAI
``/v1/models`` lists, and whether a cluster's ``model`` is among it."""

from __future__ import annotations

from llm_health.model.redact import printable_line


def model_ids(document: object) -> tuple[str, ...]:
    """The ids an OpenAI ``/v1/models`` answer lists (``data[].id``, and vLLM's ``root``
    for a served alias); ValueError if it is not that shape."""
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        raise ValueError("not an OpenAI model list (no data array)")
    ids: list[str] = []
    for entry in data[:100]:
        if isinstance(entry, dict):
            ids.extend(v for v in (entry.get("id"), entry.get("root")) if isinstance(v, str))
    return tuple(dict.fromkeys(i[:300] for i in ids))


def wrong_model(served: tuple[str, ...], expected: str) -> str | None:
    """Why the endpoint fails the check (the "model" signal's reason), or None."""
    if expected in served:
        return None
    listed = ", ".join(served[:5]) or "no model"
    return printable_line(f"wrong model: serves {listed}, expected {expected}", 300)
