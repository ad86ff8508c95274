"""Splits a pip requirements lock into N files, each package with its hashes whole, dealt
in turn: ``python requirements/parts.py LOCK DIRECTORY N`` writes DIRECTORY/part0.txt ...
part{N-1}.txt.

`make` installs the lock with one plain `pip install --no-deps --require-hashes` per part,
side by side, then `pip check` (docs/design.md §6.5). pip spends most of an install on one
core, reading every file its indexes list for each package, and the lock pins every
package, so no part needs another's resolution.
"""

from __future__ import annotations

import sys
from pathlib import Path


def packages(lock: str) -> list[list[str]]:
    """The lock's entries: a requirement line and its continuation lines (hashes, ``# via``)."""
    entries: list[list[str]] = []
    for line in lock.splitlines():
        if line[:1].isspace() and entries:
            entries[-1].append(line)
        elif line and not line.startswith("#"):
            entries.append([line])
    return entries


def main(lock: Path, directory: Path, count: int) -> None:
    entries = packages(lock.read_text(encoding="utf-8"))
    for part in range(count):
        lines = [line for entry in entries[part::count] for line in entry]
        (directory / f"part{part}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), max(1, int(sys.argv[3])))
