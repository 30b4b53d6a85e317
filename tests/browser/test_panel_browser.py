"""What a person sees: JupyterLab in headless Chromium runs a notebook that shows a
``%iq`` result and the panel; the test sets the panel's widgets and clicks Run with real
clicks, then reads the rendered page (not the kernel's messages). A second notebook runs
``%iq watch`` while a writer in another process commits: the version the page shows
goes up in the one output the watch keeps updating, and Kernel ▸ Interrupt ends it
cleanly.

Chromium is Debian's (``make test`` installs it); Playwright's Python package drives it
through ``executable_path`` — Playwright's own browser download cannot work here (no
network). JupyterLab runs on 127.0.0.1 with a throw-away configuration: a random free
port, a random token, its config, data, runtime and workspace folders in the test's
temporary folder, no update check, no news, a read-only extension manager.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from helpers import write_notebook_stores

import iqkit

CHROMIUM = os.environ.get("IQKIT_CHROMIUM", "/usr/bin/chromium")
#: No sandbox (root in a container), no GPU, and nothing that reaches for the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Where the screenshot goes (tests/output/ is git-ignored).
OUTPUT = Path(__file__).resolve().parent.parent / "output" / "browser"
#: How long the kernel may take to run a cell on a loaded 2-core machine.
SLOW_MS = 120_000
#: The writer the watch test runs in a process of its own (shared with tests/jupyter).
WRITER = Path(__file__).resolve().parent.parent / "jupyter" / "watch_writer.py"
#: The store the watch notebook watches: 'alice' written once, then by the writer.
LIVE_STORE = "live"
#: The watch cell's own limit: the test interrupts it long before, unless that fails.
WATCH_SECONDS = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_notebook(folder: Path, name: str, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(cell) for cell in cells]
    path = folder / name
    nbformat.write(nb, path)
    return path


@dataclass(frozen=True)
class Lab:
    """The running JupyterLab: its base URL and token, and the stores its kernels read."""

    base: str
    token: str
    root: Path

    def url(self, notebook: str) -> str:
        return f"{self.base}/lab/tree/{notebook}?reset&token={self.token}"


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A JupyterLab server on the notebooks and small stores, shared by this module's
    tests (starting one takes most of a test's time)."""
    tmp_path = tmp_path_factory.mktemp("lab")
    root = tmp_path / "stores"
    write_notebook_stores(root)
    iqkit.create_store(root, LIVE_STORE, partitions=2, value_serde="int64")
    with iqkit.StoreWriter(root, LIVE_STORE) as w:
        w.put("alice", 0)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    # IQKIT_ROOT names the stores
    _write_notebook(
        notebooks, "panel.ipynb", ["%load_ext iqkit\n%iq get totals alice", "%iq panel"]
    )
    _write_notebook(
        notebooks,
        "watch.ipynb",
        [f"%load_ext iqkit\n%iq watch get {LIVE_STORE} alice --for {WATCH_SECONDS} --every 0.2"],
    )
    home = tmp_path / "jupyter"
    config = home / "config"
    (config / "labconfig").mkdir(parents=True)
    # The news/announcements plugin would ask, in a toast over the page, whether to fetch
    # news from the internet: not in a test, and not on a machine without network.
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {
        **os.environ,
        "IQKIT_ROOT": str(root),  # as `make lab` sets it
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(home / "data"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
        "TMPDIR": str(scratch),
    }
    port, token = _free_port(), secrets.token_hex(16)
    log = (tmp_path / "jupyterlab.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--port-retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={notebooks}",
            "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            # Jupyter refuses to start as root (CI machines run as root) without this.
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ],
        env=env,
        cwd=notebooks,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(server, f"{base}/api/status?token={token}", tmp_path / "jupyterlab.log")
        yield Lab(base, token, root)
    finally:
        _shut_down(server, f"{base}/api/shutdown?token={token}")
        log.close()


def _wait_until_serving(server: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"JupyterLab exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer within 120 s:\n{log.read_text()[-3000:]}")


def _shut_down(server: subprocess.Popen, url: str) -> None:
    """Ask the server to stop (it stops its kernels), then make sure it did."""
    with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
        urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10).close()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def chromium() -> str:
    """Debian's chromium and Playwright, or one line saying what to install (never a
    skip: ``make test`` installs both, so a missing one is a broken machine)."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"the browser test needs Chromium at {CHROMIUM}: apt-get install chromium "
            "(make test does it as root), or set IQKIT_CHROMIUM",
            pytrace=False,
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("the browser test needs Playwright: pip install playwright", pytrace=False)
    return CHROMIUM


def _short_temp_folder() -> str:
    """$TMPDIR when its paths leave room for Chromium's socket, else /tmp.

    ``make test`` points $TMPDIR into the clone, whose path may be long; Chromium puts
    ``.org.chromium.Chromium.XXXXXX/SingletonSocket`` under it, and a Unix socket path has
    at most 107 bytes. The folder made here is removed at the end either way.
    """
    tmp = tempfile.gettempdir()
    return tmp if len(tmp) <= 48 else "/tmp"


def _browser_scratch(request, monkeypatch) -> None:
    """Playwright's driver puts the browser profile, and Chromium its singleton socket,
    under $TMPDIR: a folder of our own, removed at the end. Short, because a Unix socket
    path has at most 107 bytes and pytest's tmp_path is too long for Chromium's."""
    scratch = Path(tempfile.mkdtemp(prefix="iqkit-browser-", dir=_short_temp_folder()))
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    monkeypatch.setenv("TMPDIR", str(scratch))


def _run_all_cells(page) -> None:
    """Run ▸ Run All Cells, clicked like a person would, once the kernel is idle."""
    from playwright.sync_api import expect

    # The notebook's kernel (its kernelspec: python3, this venv's) is up.
    expect(page.get_by_text(re.compile(r"^Python 3.*\| Idle$"))).to_be_visible()
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def test_panel_in_a_real_browser(chromium: str, jupyterlab: Lab, request, monkeypatch) -> None:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=SLOW_MS)
    _browser_scratch(request, monkeypatch)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    screenshot = OUTPUT / "panel.png"
    screenshot.unlink(missing_ok=True)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1500})
            page.set_default_timeout(SLOW_MS)
            page.goto(jupyterlab.url("panel.ipynb"))
            notebook = page.locator(".jp-NotebookPanel:visible .jp-Notebook")
            expect(notebook).to_be_visible()
            _run_all_cells(page)

            # The %iq result, as rendered: the rows, the per-partition status, the line.
            result = notebook.locator(".iqkit-result")
            expect(result).to_be_visible()
            expect(result.locator("table").first).to_contain_text("alice")
            expect(result).to_contain_text("success")
            expect(result).to_contain_text("Equivalent: %iq get totals alice")

            # The panel: store, query type, prefix, execution info, Run — real clicks.
            panel = notebook.locator(".widget-vbox").filter(has=page.locator(".widget-tab")).first
            expect(panel).to_be_visible()
            panel.scroll_into_view_if_needed()
            store = panel.locator(".widget-dropdown select")
            store.click()
            store.select_option("totals")
            panel.locator("button.widget-toggle-button", has_text="prefix").click()
            prefix = panel.locator(".widget-text", has=page.locator("label", has_text="prefix"))
            prefix.locator("input").click()
            page.keyboard.type("al")
            panel.locator(".widget-checkbox", has_text="execution info").locator("input").click()
            panel.locator("button.widget-button", has_text="Run").click()

            tabs = panel.locator(".widget-tab .lm-TabBar-tab")
            shown = panel.locator(".widget-tab .widget-html-content:visible")
            # With execution info on, the panel opens the Trace tab when the result is in.
            expect(tabs.filter(has_text="Trace")).to_have_class(re.compile("lm-mod-current"))
            expect(shown).to_contain_text("StateEngine")

            tabs.filter(has_text="Rows").click()
            summary = "totals · PrefixScanQuery · 2 rows · partitions 4 ok / 0 failed"
            expect(shown).to_contain_text(summary)
            rows = shown.locator("table")
            expect(rows).to_contain_text("alice")
            expect(rows).to_contain_text("alfred")
            expect(rows).not_to_contain_text("bob")

            tabs.filter(has_text="%iq line").click()
            expect(shown).to_have_text("%iq prefix totals al --trace")

            tabs.filter(has_text="Partitions").click()
            status = shown.locator("table tbody tr")
            expect(status).to_have_count(4)  # a prefix scan reads all 4 partitions
            assert [row.locator("td").nth(1).inner_text() for row in status.all()] == [
                "success"
            ] * 4
            page.screenshot(path=str(screenshot))
        finally:
            browser.close()
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


def test_watch_updates_its_output_in_the_page(
    chromium: str, jupyterlab: Lab, request, monkeypatch
) -> None:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=SLOW_MS)
    _browser_scratch(request, monkeypatch)
    with iqkit.open(jupyterlab.root) as engine:
        first = engine.version(LIVE_STORE)
    assert first is not None
    plan = [[["alice", n]] for n in (1, 2, 3)]
    last = first + len(plan)
    writer: subprocess.Popen | None = None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(SLOW_MS)
            page.goto(jupyterlab.url("watch.ipynb"))
            notebook = page.locator(".jp-NotebookPanel:visible .jp-Notebook")
            expect(notebook).to_be_visible()
            _run_all_cells(page)

            watch = notebook.locator(".iqkit-watch")
            version = watch.locator(".iq-watch-version")
            expect(version).to_have_text(str(first))
            expect(watch.locator(".iq-watch-state")).to_have_text("watching")

            # Another process commits while the cell runs: the same output shows each
            # newer version (one output, updated in place), the changed row marked.
            writer = subprocess.Popen(
                [sys.executable, str(WRITER), str(jupyterlab.root), LIVE_STORE,
                 json.dumps(plan), "--pause", "0.3"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            expect(version).to_have_text(str(last))
            assert writer.wait(timeout=SLOW_MS / 1000) == 0
            expect(watch).to_have_count(1)
            expect(watch.locator("tr.iq-changed")).to_contain_text("alice")
            expect(watch.locator("tr.iq-changed")).to_contain_text(str(plan[-1][0][1]))

            # Kernel ▸ Interrupt Kernel: the watch ends cleanly, saying so, no traceback.
            page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Interrupt Kernel").first.click()
            expect(watch.locator(".iq-watch-state")).to_have_text("watched (interrupted)")
            expect(notebook.locator(".iqkit-watch-end")).to_contain_text("interrupted")
            expect(notebook).not_to_contain_text("KeyboardInterrupt")
            expect(notebook).not_to_contain_text("Traceback")
        finally:
            browser.close()
            if writer is not None and writer.poll() is None:
                writer.kill()
                writer.wait()
