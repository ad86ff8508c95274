"""``value``: the decorator of the value types built on every probe (docs/design.md
§16.10).

A ``@dataclass(frozen=True)`` enforces immutability at run time by building every
instance through ``object.__setattr__``, one call a field, several times the cost of a
plain slots class, and every probe builds a ``ProbeResult``, an ``EndpointHealth`` and a
``Transition`` (figures: docs/benchmarks.md). ``value``
keeps them immutable where it is checked, by the type checker: mypy (``--strict``, in CI)
treats a ``@value`` class as frozen and refuses any assignment to a field; at run time it
is a plain slots dataclass, hashed by its fields as a frozen one is. Build a changed copy
with ``dataclasses.replace``, never assign.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def value(cls: type[T]) -> type[T]:
    return dataclass(slots=True, unsafe_hash=True)(cls)
