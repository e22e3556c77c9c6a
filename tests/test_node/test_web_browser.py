"""The web observer's page in a real headless Chromium (Debian's ``chromium``), driven by
playwright, against a real ``python -m otp.node`` OS process."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio

from .test_node_cli import Node

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Where the test saves its screenshot (README's docs/observer.png is one, copied by hand).
SCREENSHOT = Path(os.environ.get("OTP_OBSERVER_SCREENSHOT", tempfile.gettempdir())) / "observer.png"


def _chromium() -> str:
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("OTP_REQUIRE_CHROMIUM"):
            pytest.fail(f"{CHROMIUM} is missing (OTP_REQUIRE_CHROMIUM is set): install chromium")
        pytest.skip(f"{CHROMIUM} is missing (Debian's chromium package)")
    return CHROMIUM


def _look(address: str, executable: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            headless=True,
            args=FLAGS,
            viewport={"width": 1200, "height": 800},
        )
        try:
            page = browser.new_page()
            page.goto(address + "/")
            page.wait_for_selector("body[data-ready='1']", timeout=20_000)
            page.wait_for_selector("[data-child='demo/greeter']", timeout=20_000)
            seen = {
                "children": page.eval_on_selector_all(
                    "[data-child]", "els => els.map(e => e.dataset.child)"
                ),
                "apps": page.eval_on_selector_all(
                    "[data-app]", "els => els.map(e => e.dataset.app)"
                ),
                "rows": page.eval_on_selector_all(
                    "#processes tbody tr", "els => els.map(e => e.innerText)"
                ),
            }
            page.click("th[data-sort='message_queue_len']")
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            return seen
        finally:
            browser.close()


async def test_the_page_draws_the_tree_and_the_process_table_in_chromium() -> None:
    executable = _chromium()
    async with Node("--observer", "127.0.0.1:0") as running:
        line = await running.line_with("observer on http://127.0.0.1:")
        address = line.split()[2]
        await running.line_with("stop with Ctrl-C")
        with trio.fail_after(45):
            seen = await trio.to_thread.run_sync(_look, address, executable)
        assert {"demo", "dispatcher", "dirty", "observer"} <= set(seen["apps"])
        assert {"demo/greeter", "demo/ticker", "observer/http"} <= set(seen["children"])
        assert any("application_controller" in row for row in seen["rows"])
        assert SCREENSHOT.stat().st_size > 10_000
        running.signal(signal.SIGTERM)
        assert await running.exit_code() == 0
