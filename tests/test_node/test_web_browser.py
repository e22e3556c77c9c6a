"""The web observer's page in a real headless Chromium (Debian's ``chromium``), driven by
playwright, against a real ``python -m otp.node`` OS process: the tree and the process table,
the application, ETS and chart pages, and an action (kill a child from its detail view, see it
restart on the page)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
#: Where the tests save their screenshots (README's docs/observer.png is the first, copied by
#: hand).
SHOTS = Path(os.environ.get("OTP_OBSERVER_SCREENSHOT", tempfile.gettempdir()))
SCREENSHOT = SHOTS / "observer.png"
CHARTS_SCREENSHOT = SHOTS / "observer-charts.png"


def _chromium() -> str:
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("OTP_REQUIRE_CHROMIUM"):
            pytest.fail(f"{CHROMIUM} is missing (OTP_REQUIRE_CHROMIUM is set): install chromium")
        pytest.skip(f"{CHROMIUM} is missing (Debian's chromium package)")
    return CHROMIUM


@contextmanager
def _page(executable: str, width: int) -> Iterator[Any]:
    """A page of a fresh headless Chromium (its own profile), closed on the way out."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            headless=True,
            args=FLAGS,
            viewport={"width": width, "height": 800},
        )
        try:
            yield browser.new_page()
        finally:
            browser.close()


def _look(address: str, executable: str) -> dict[str, Any]:
    with _page(executable, 1200) as page:
        page.goto(address + "/")
        page.wait_for_selector("body[data-ready='1']", timeout=20_000)
        page.wait_for_selector("[data-child='demo/greeter']", timeout=20_000)
        seen = {
            "children": page.eval_on_selector_all(
                "[data-child]", "els => els.map(e => e.dataset.child)"
            ),
            "apps": page.eval_on_selector_all("[data-app]", "els => els.map(e => e.dataset.app)"),
            "rows": page.eval_on_selector_all(
                "#processes tbody tr", "els => els.map(e => e.innerText)"
            ),
        }
        page.click("th[data-sort='message_queue_len']")
        page.click("a[data-page='app:dirty']")
        page.wait_for_selector("#app-detail[data-app='dirty'] [data-view='workers'] table")
        seen["dirty"] = page.inner_text("#app-detail")
        page.click("a[data-page='app:dispatcher']")
        page.wait_for_selector("#app-detail[data-app='dispatcher'] [data-view='tools']")
        page.click("a[data-page='ets']")
        page.wait_for_selector("#ets tbody tr[data-table]")
        seen["tables"] = page.eval_on_selector_all(
            "#ets tbody tr", "els => els.map(e => e.dataset.table)"
        )
        page.click("a[data-page='charts']")
        page.wait_for_selector("[data-chart='messages'][data-points]:not([data-points='0'])")
        seen["charts"] = page.eval_on_selector_all(
            "figure[data-chart]", "els => els.map(e => e.dataset.chart)"
        )
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(CHARTS_SCREENSHOT), full_page=True)
        return seen


def _kill_from_the_page(address: str, token: str, executable: str) -> dict[str, Any]:
    """Open the page with the token, kill demo/greeter from its detail view, and wait until
    the tree shows it restarted under a new pid."""
    with _page(executable, 1360) as page:
        page.on("dialog", lambda dialog: dialog.accept())  # the "kill ...?" confirmation
        page.goto(f"{address}/#token={token}")
        page.wait_for_selector("body[data-ready='1'][data-page='overview']")
        page.wait_for_selector("#actions-state input#token")
        greeter = page.wait_for_selector("[data-child='demo/greeter']")
        assert greeter is not None
        old = greeter.get_attribute("data-pid")
        assert old is not None
        page.click("[data-child='demo/greeter'] a.pid")
        page.wait_for_selector(f"#process-detail[data-pid='{old}'] [data-field='behaviour']")
        detail = {
            "behaviour": page.inner_text("#process-detail [data-field='behaviour'] td"),
            "links": page.eval_on_selector_all(
                "#links a.pid", "els => els.map(e => e.textContent)"
            ),
            "mailbox": page.inner_text("#process-detail ol.mailbox"),
        }
        page.click("#process-detail button[data-action='kill']")
        page.wait_for_selector("#action-result.ok")
        page.wait_for_selector("#process-detail p.gone[data-error='unknown_pid']")
        page.click("a[data-page='overview']")
        page.wait_for_selector(
            f"[data-child='demo/greeter'][data-restarted='1']:not([data-pid='{old}'])"
        )
        new = page.get_attribute("[data-child='demo/greeter']", "data-pid")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
        return {"old": old, "new": new, "detail": detail}


async def test_the_page_draws_the_tree_and_the_process_table_in_chromium() -> None:
    executable = _chromium()
    async with Node("--observer", "127.0.0.1:0") as running:
        line = await running.line_with("observer on http://127.0.0.1:")
        address = line.split()[2]
        await running.line_with("stop with Ctrl-C")
        with trio.fail_after(90):
            seen = await trio.to_thread.run_sync(_look, address, executable)
        assert {"demo", "dispatcher", "dirty", "observer"} <= set(seen["apps"])
        assert {"demo/greeter", "demo/ticker", "observer/http"} <= set(seen["children"])
        assert any("application_controller" in row for row in seen["rows"])
        assert "worker id" in seen["dirty"] and "stash tables" in seen["dirty"]
        assert "dispatcher_results" in seen["tables"]
        assert seen["charts"] == ["messages", "restarts", "dirty-calls", "dirty-latency"]
        assert CHARTS_SCREENSHOT.stat().st_size > 10_000
        running.signal(signal.SIGTERM)
        assert await running.exit_code() == 0


async def test_a_child_killed_from_the_page_restarts_on_the_page_in_chromium() -> None:
    executable = _chromium()
    async with Node("--observer", "127.0.0.1:0", "--observer-actions") as running:
        address = (await running.line_with("observer on http://127.0.0.1:")).split()[2]
        line = await running.line_with("observer actions on: token ")
        token = line.split("token ")[1].split()[0]
        await running.line_with("stop with Ctrl-C")
        with trio.fail_after(90):
            seen = await trio.to_thread.run_sync(_kill_from_the_page, address, token, executable)
        assert seen["new"] != seen["old"] and seen["new"].startswith("<nonode@nohost.")
        assert seen["detail"]["behaviour"] == "GenServer otp.node._demo.Greeter"
        assert len(seen["detail"]["links"]) == 1  # its supervisor
        assert seen["detail"]["mailbox"] == "empty"
        assert SCREENSHOT.stat().st_size > 10_000
        running.signal(signal.SIGTERM)
        assert await running.exit_code() == 0


def _dirty_charts(address: str, executable: str) -> dict[str, Any]:
    with _page(executable, 1200) as page:
        page.goto(address + "/#/charts")
        page.wait_for_selector("[data-chart='dirty-calls']:not([data-points='0'])")
        # (attached, not visible: a flat line's box has no height)
        page.wait_for_selector(
            "[data-chart='dirty-latency'] path[data-series='p99']", state="attached"
        )
        seen = {
            "legend": page.inner_text("[data-chart='dirty-latency'] .legend"),
            "calls": page.inner_text("[data-chart='dirty-calls'] .legend"),
        }
        page.click("a[data-page='app:dirty']")
        page.wait_for_selector("#app-detail[data-app='dirty'] [data-view='calls'] table")
        seen["view"] = page.inner_text("#app-detail [data-view='calls']")
        return seen


async def test_the_dirty_pools_call_counters_draw_its_charts_in_chromium() -> None:
    """Against an application showing the dirty pool's ``calls`` view (10 calls a read, 9
    under 10 ms and 1 under 50 ms): calls/s and the latency's mean and p99 are drawn, and the
    pool's page shows its totals and quantiles."""
    executable = _chromium()
    async with Node(
        "--app", "test_node.node_apps:counted_dirty", "--observer", "127.0.0.1:0"
    ) as running:
        address = (await running.line_with("observer on http://127.0.0.1:")).split()[2]
        await running.line_with("stop with Ctrl-C")
        with trio.fail_after(90):
            seen = await trio.to_thread.run_sync(_dirty_charts, address, executable)
        assert "p99: 50" in seen["legend"]  # ms: the 10th call of each read is under 50 ms
        assert "calls/s:" in seen["calls"] and "no data yet" not in seen["calls"]
        assert "latency p99\t≤ 50 ms" in seen["view"] and "DirtyTimeoutError" in seen["view"]
        running.signal(signal.SIGTERM)
        assert await running.exit_code() == 0
