"""The loader reads only regular files (config/reading.py ``open_regular``): a FIFO, a
directory or a device (here /dev/zero through a symlink) is refused with one clear line,
at once and without a read (a FIFO's open would wait for a writer forever)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from llm_health.config import load_config
from llm_health.config.reading import open_regular
from llm_health.errors import ConfigError

WITHIN_S = 5.0


def load_in_thread(path: Path) -> list[str]:
    """load_config's messages; the call runs in a daemon thread, so that a loader that
    blocks fails this test instead of hanging it."""
    outcome: list[Any] = []

    def load() -> None:
        try:
            load_config(path, {})
        except ConfigError as exc:
            outcome.extend(exc.messages)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(WITHIN_S)
    assert not thread.is_alive(), f"load_config({path}) still blocked after {WITHIN_S} s"
    return outcome


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "llm-health.yaml"
    os.mkfifo(path)
    assert load_in_thread(path) == [
        f"{path}: cannot read: it is a FIFO (named pipe), not a regular file"
    ]


def test_a_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "llm-health.yaml"
    path.mkdir()
    assert load_in_thread(path) == [f"{path}: cannot read: it is a directory, not a regular file"]


def test_a_device_is_refused_before_any_read(tmp_path: Path) -> None:
    path = tmp_path / "llm-health.yaml"
    path.symlink_to("/dev/zero")
    assert load_in_thread(path) == [
        f"{path}: cannot read: it is a character device, not a regular file"
    ]


def test_a_fifo_swapped_in_after_the_check_is_still_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path is checked, then opened: a FIFO put there in between must neither hold
    the open (O_NONBLOCK) nor be read (the open descriptor is checked again)."""
    regular, fifo = tmp_path / "regular.yaml", tmp_path / "llm-health.yaml"
    regular.write_text("clusters: []\n")
    os.mkfifo(fifo)
    real_stat = os.stat

    def stat_before_the_swap(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        return real_stat(regular if Path(path) == fifo else path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat_before_the_swap)
    with pytest.raises(ConfigError) as caught:
        open_regular(fifo)
    assert caught.value.messages == [
        f"{fifo}: cannot read: it is a FIFO (named pipe), not a regular file"
    ]


def test_a_symlink_to_a_regular_file_is_read(tmp_path: Path) -> None:
    target = tmp_path / "real.yaml"
    target.write_text("clusters: [{name: a, endpoints: [{address: 10.0.0.1:80}]}]\n")
    link = tmp_path / "llm-health.yaml"
    link.symlink_to(target)
    assert [c.name for c in load_config(link, {}).clusters] == ["a"]
