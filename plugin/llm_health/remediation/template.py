"""argv templating: ``{cluster}``, ``{address}``, ``{host}``, ``{port}``, ``{state}``,
``{cause}`` in each argument are replaced; nothing else is interpreted (no shell, no
format spec, no attribute access: ``str.format`` would let "{0.__class__}" reach into
objects). An unknown ``{name}`` is left as written."""

from __future__ import annotations

import re
from collections.abc import Mapping

FIELDS = ("cluster", "address", "host", "port", "state", "cause")
_PLACEHOLDER = re.compile(r"\{([a-z]+)\}")


def render(argv: tuple[str, ...], values: Mapping[str, str]) -> list[str]:
    return [_PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), arg) for arg in argv]
