"""Unknown keys past the first MAX_MESSAGES of a mapping, cut before pydantic sees them.

Pydantic builds an error for each unknown key; only the first MAX_MESSAGES are ever shown
(``config/messages.py``), so the rest are counted here and never handed to it
(docs/design.md §6.3).
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from llm_health.config.messages import MAX_MESSAGES


def unknown_keys_cut(value: Any, annotation: Any) -> tuple[Any, int]:
    """``value`` without the unknown keys past the first MAX_MESSAGES of each mapping of a
    settings model, and how many were cut. Pydantic reports a model's unknown keys after
    its fields' errors, so the problems shown are the same; it no longer builds an error
    for each of a hundred thousand keys. A mapping that loses keys is copied, never
    changed (an alias may share it)."""
    annotation = _one_type(annotation)
    if (
        isinstance(value, dict)
        and isinstance(annotation, type)
        and issubclass(annotation, BaseModel)
    ):
        return _model_keys_cut(value, annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    items = origin is list or (origin is tuple and len(args) == 2 and args[1] is ...)
    if isinstance(value, list) and items:
        cut = [unknown_keys_cut(item, args[0]) for item in value]
        if not any(count for _, count in cut):
            return value, 0
        return [item for item, _ in cut], sum(count for _, count in cut)
    return value, 0


def _model_keys_cut(value: dict[Any, Any], model: type[BaseModel]) -> tuple[Any, int]:
    fields = model.model_fields
    kept: dict[Any, Any] = {}
    unknown = 0
    for key, item in value.items():  # in Python, not in one C call: other threads run
        # Only text keys: a model may take others ("on", read as true: alerts/settings.py).
        if isinstance(key, str) and key not in fields:
            unknown += 1
            if unknown > MAX_MESSAGES:
                continue
        kept[key] = item
    cut = max(0, unknown - MAX_MESSAGES)
    out = kept if cut else value
    for name, info in fields.items():
        if name in out:
            item, count = unknown_keys_cut(out[name], info.annotation)
            if count:
                if out is value:
                    out = dict(value)
                out[name] = item
                cut += count
    return out, cut


def _one_type(annotation: Any) -> Any:
    """The type a value is validated as: Annotated[...] unwrapped, and the one arm of an
    optional type (``X | None``); a union of several types stays what it is."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, UnionType):
        arms = [arm for arm in get_args(annotation) if arm is not type(None)]
        if len(arms) == 1:
            return _one_type(arms[0])
    return annotation
