"""The status page's package files (plugin/llm_health/ops/page/): its JavaScript parses,
and the served page is those files, inline, allowed by the hashes of exactly that text
(a browser runs an inline block only if its hash is in the Content-Security-Policy)."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess
from importlib.resources import as_file, files
from pathlib import Path

import pytest

from llm_health.ops import status_page

PAGE = files("llm_health.ops") / "page"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(
    NODE is None, reason="node is not on PATH: nothing to parse the JavaScript with"
)


def node_check(path: Path) -> None:
    assert NODE is not None
    done = subprocess.run([NODE, "--check", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{path} does not parse:\n{done.stderr}"


def inline(tag: str) -> str:
    """The text inside the page's only ``<tag>`` block."""
    (text,) = re.findall(f"<{tag}>(.*?)</{tag}>", status_page.PAGE.decode(), re.DOTALL)
    return text


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@needs_node
def test_the_javascript_file_parses() -> None:
    with as_file(PAGE / "page.js") as path:
        node_check(path)


@needs_node
def test_the_served_script_parses(tmp_path: Path) -> None:
    script = tmp_path / "served.js"
    script.write_text(inline("script"), encoding="utf-8")
    node_check(script)


def test_the_page_is_its_files_inline_with_their_hashes() -> None:
    css, script = inline("style"), inline("script")
    assert css.strip() == (PAGE / "page.css").read_text(encoding="utf-8").strip()
    js = (PAGE / "page.js").read_text(encoding="utf-8")
    assert "__POLL_MS__" in js and "__POINTS__" in js
    expected = js.replace("__POLL_MS__", str(status_page.POLL_MS))
    assert script.strip() == expected.replace("__POINTS__", str(status_page.SPARK_POINTS)).strip()
    assert "__" not in status_page.PAGE.decode().replace(script, "")  # no placeholder left
    policy = status_page.HEADERS["Content-Security-Policy"]
    assert f"script-src {sha256(script)};" in policy
    assert f"style-src {sha256(css)};" in policy
