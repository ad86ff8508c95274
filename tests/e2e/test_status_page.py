"""The live status page at ``GET /`` (plugin/llm_health/ops/status_page.py) in a real
browser: Debian's headless chromium driven by Selenium through Debian's chromedriver
(``make tools`` installs both; a missing browser fails here, it is never skipped).
No Envoy: simulators and ``llm-health serve`` on loopback.

Set ``STATUS_PAGE_SCREENSHOT=docs/status-page.png`` to (re)write the screenshot in
docs/operations.md (healthy, degraded, unhealthy and drained rows, sparklines filled for
~15 s).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service

from tests.polling import wait_until
from tests.processes import PluginProcess, SimProcess

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CLUSTER = "llama-70b"
FAST = ("--ttft", "20ms", "--tpot", "2ms")
HOSTILE = '<script>alert(1)</script><img src=x onerror="window.__xss=1"> & "quotes"'
WITHIN_S = 2.0  # the page polls /status every second: a change shows within two
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None]
    assert not missing, f"{missing} not installed: `make tools` (Debian chromium, chromium-driver)"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[list[SimProcess], PluginProcess]]:
    """Four sims (a, b, c, d) and a plugin probing them; all stopped at teardown."""
    started: list[SimProcess | PluginProcess] = []
    try:
        sims = [SimProcess(tmp_path, name, *FAST) for name in "abcd"]
        started.extend(sims)
        settings = {
            "probe": {"model": "sim-model"},
            "clusters": [{"name": CLUSTER, "endpoints": [{"address": s.address} for s in sims]}],
        }
        plugin = PluginProcess(tmp_path / "plugin", settings)
        started.append(plugin)
        for sim in sims:
            sim.wait_up()
        plugin.start().wait_ready()
        yield sims, plugin
    finally:
        for process in reversed(started):
            process.stop()


def page_rows(driver: webdriver.Chrome) -> dict[str, dict[str, Any]]:
    """endpoint -> what the page shows in its row."""
    rows: dict[str, dict[str, Any]] = driver.execute_script(
        """
        const out = {};
        for (const tr of document.querySelectorAll("tr.ep")) {
          out[tr.dataset.endpoint] = {
            state: tr.dataset.state,
            text: tr.innerText,
            reason: tr.querySelector(".reason").textContent,
            spark: tr.querySelector("svg.spark polyline").getAttribute("points")
              .split(" ").filter(Boolean).length,
          };
        }
        return out;
        """
    )
    return rows


def page_states(driver: webdriver.Chrome) -> dict[str, str]:
    return {address: row["state"] for address, row in page_rows(driver).items()}


def test_status_page_live(
    stack: tuple[list[SimProcess], PluginProcess], browser: webdriver.Chrome, tmp_path: Path
) -> None:
    (a, b, c, d), plugin = stack
    base = f"http://127.0.0.1:{plugin.http_port}/"
    addresses = [s.address for s in (a, b, c, d)]

    # The response: HTML with a strict CSP (no inline code but the page's own, by hash).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(base, timeout=5) as response:
        headers = response.headers
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert headers["X-Content-Type-Options"] == "nosniff"
        csp = headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "script-src 'sha256-" in csp

    wait_until(lambda: set(plugin.states().values()) == {"healthy"}, 20, "every endpoint healthy")
    browser.get(base)
    wait_until(
        lambda: page_states(browser) == dict.fromkeys(addresses, "healthy"),
        10,
        "the page to show four healthy endpoints",
    )
    assert browser.find_element("css selector", "h2").text == CLUSTER
    assert "weight 100" in page_rows(browser)[a.address]["text"]
    browser.execute_script("window.__sameDocument = 'before the fault';")
    polls = browser.execute_script("return window.llmHealthStatusPage.polls")

    # A fault: the page follows /status within two seconds, without a reload.
    c.set_fault(fault="cuda_error")
    wait_until(
        lambda: plugin.states()[c.address] == "unhealthy", 15, "/status: c unhealthy", interval=0.02
    )
    wait_until(
        lambda: page_states(browser)[c.address] == "unhealthy",
        WITHIN_S,
        f"the page to show c unhealthy within {WITHIN_S} s of /status",
        interval=0.02,
    )
    assert browser.execute_script("return window.__sameDocument") == "before the fault"
    assert browser.execute_script("return performance.getEntriesByType('navigation').length") == 1
    assert browser.execute_script("return window.llmHealthStatusPage.polls") > polls
    row = page_rows(browser)[c.address]
    assert "fatal" in row["text"] and "UNHEALTHY" in row["text"], row["text"]

    # Slow: degraded, with a reduced weight for Envoy.
    b.set_fault(ttft="400ms")
    wait_until(lambda: page_states(browser)[b.address] == "degraded", 20, "the page: b degraded")

    # Untrusted text (an operator's drain reason here; engine errors alike) is only text.
    cli(plugin, "drain", CLUSTER, d.address, "--reason", HOSTILE)
    wait_until(
        lambda: page_rows(browser)[d.address]["reason"] == HOSTILE,
        WITHIN_S + 1,
        "the page to show the drain reason as text",
    )
    assert page_states(browser)[d.address] == "draining"
    assert browser.execute_script("return document.scripts.length") == 1  # the page's own
    assert browser.execute_script("return document.querySelectorAll('main img').length") == 0
    assert browser.execute_script("return window.__xss") is None
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - raises when no alert is open
    assert page_states(browser)[a.address] == "healthy"

    # Sparklines: one point per new probe, kept across polls.
    wait_until(lambda: page_rows(browser)[a.address]["spark"] >= 3, 10, "a sparkline of 3+")

    # Nothing was refused by the CSP and the script threw nothing.
    problems = [
        entry["message"]
        for entry in browser.get_log("browser")
        if entry["level"] == "SEVERE" and "favicon.ico" not in entry["message"]
    ]
    assert not problems, problems

    # A phone: one column, nothing wider than the screen.
    browser.set_window_size(390, 844)
    wait_until(
        lambda: browser.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth"
        ),
        5,
        "no horizontal scrolling at 390 px",
    )
    browser.save_screenshot(str(tmp_path / "phone.png"))  # kept with the test's files

    target = os.environ.get("STATUS_PAGE_SCREENSHOT")
    if target:
        screenshot(browser, ROOT / target, [a.address])


def screenshot(driver: webdriver.Chrome, path: Path, watch: list[str]) -> None:
    """The picture in docs/operations.md: wide window, sparklines given time to fill."""
    driver.set_window_size(1280, 900)
    wait_until(lambda: page_rows(driver)[watch[0]]["spark"] >= 15, 40, "15 sparkline points")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(int(height) + 140, 1200))
    time.sleep(0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(path))


def cli(plugin: PluginProcess, *args: str) -> str:
    """``llm-health <args> --admin <the plugin's gRPC port>`` as a subprocess."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LLM_HEALTH_")},
        "PYTHONPATH": os.pathsep.join([str(ROOT / "plugin"), os.environ.get("PYTHONPATH", "")]),
    }
    admin = f"127.0.0.1:{plugin.grpc_port}"
    done = subprocess.run(
        [sys.executable, "-m", "llm_health.cli", *args, "--admin", admin],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
