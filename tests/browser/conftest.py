"""Fixtures of the browser tests: a real JupyterLab server started the way `make lab` starts it, and
Debian's Chromium driven by Playwright.

- `lab`: one JupyterLab server for the session, on its own free port with a random token, serving a
  temporary root that holds copies of notebooks/*.ipynb, with RLHF_LAB_FAST=1 in the environment its
  kernels inherit. Its settings and workspaces live in the temporary folder too, so a learner's own
  JupyterLab settings never change what the tests see.
- `page`: a fresh browser tab per test (a new user-data directory per session); console errors are
  collected in `page.console_errors`.
- Screenshots go to `screenshots_dir` (tests/conftest.py: RLHF_LAB_SCREENSHOTS, default
  tests/browser/screenshots/); the session prints the folder and its files at the end, so CI keeps
  them in its log.

Chromium comes from the system (Debian: `apt-get install chromium`, at /usr/bin/chromium); Playwright's
own browser download is not used. Set RLHF_LAB_CHROMIUM to use another binary. Without Chromium or the
`playwright` package the tests skip with a message, except when the CI variable is set: then a missing
browser is a failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from lab_ui import NOTEBOOK_DIR

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
# What works in containers and CI: no sandbox (often no user namespaces), no GPU, no network chatter.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]
HOW_TO_ENABLE = ("browser tests need Chromium and the Python package playwright: on Debian/Ubuntu "
                 "`sudo apt-get install chromium` and `.venv/bin/pip install -e .[dev]` (or set "
                 "RLHF_LAB_CHROMIUM to a Chromium/Chrome binary)")
SERVER_START_TIMEOUT = 90  # seconds; a cold JupyterLab on a busy 2-core machine takes 5-20 s


def missing(reason: str):
    """Skip on a laptop; fail in CI, where a skipped browser suite would hide a broken install."""
    message = f"{reason}; {HOW_TO_ENABLE}"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and {message}", pytrace=False)
    pytest.skip(message)


def chromium_path() -> str | None:
    configured = os.environ.get("RLHF_LAB_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


@dataclass
class Lab:
    """A running JupyterLab server."""

    url: str  # http://127.0.0.1:PORT
    token: str
    root: Path  # the folder it serves (copies of the notebooks)

    def notebook_url(self, name: str, workspace: str) -> str:
        # A workspace of its own per tab, reset, so no test sees the tabs another test left open.
        return f"{self.url}/lab/workspaces/{workspace}/tree/{name}?reset&token={self.token}"

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """End every kernel session, so opened notebooks do not pile up kernels on a 2-core machine."""
        for session in self.api("sessions"):
            self.api(f"sessions/{session['id']}", method="DELETE")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_lab_settings(settings_dir: Path) -> None:
    """JupyterLab user settings for the test server: every cell in the DOM (no windowing, so the
    tests can find any cell), and no news or update check (no network, no pop-ups)."""
    settings = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false", "checkForUpdates": False},
    }
    for name, values in settings.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    executable = chromium_path()
    if executable is None:
        missing("no Chromium found (looked for RLHF_LAB_CHROMIUM, " + ", ".join(CHROMIUM_CANDIDATES) + ")")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing("the Python package playwright is not installed")
    home = tmp_path_factory.mktemp("lab")
    root = home / "root"
    root.mkdir()
    for notebook in NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb"):
        shutil.copy(notebook, root / notebook.name)
    write_lab_settings(home / "settings")
    env = dict(os.environ, RLHF_LAB_FAST="1", JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTER_RUNTIME_DIR=str(home / "runtime"))
    env.pop("MPLBACKEND", None)  # the kernel picks the inline backend, as in a learner's session
    port, token = free_port(), secrets.token_hex(16)
    # As `make lab` does: jupyter lab on the notebooks (here a copy), --allow-root when root.
    jupyter = Path(sys.executable).parent / "jupyter"
    launcher = [str(jupyter), "lab"] if jupyter.exists() else [sys.executable, "-m", "jupyterlab"]
    command = [*launcher, str(root), "--no-browser",
               f"--port={port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
               f"--IdentityProvider.token={token}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")
    log_path = home / "server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    lab = Lab(url=f"http://127.0.0.1:{port}", token=token, root=root)
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while True:
        try:
            lab.api("status")
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"JupyterLab did not start; its log:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
    lab.chromium = executable
    yield lab
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


@pytest.fixture(scope="session")
def browser_context(lab, tmp_path_factory):
    from playwright.sync_api import sync_playwright  # the lab fixture checked that it is installed

    playwright = sync_playwright().start()
    context = playwright.chromium.launch_persistent_context(
        str(tmp_path_factory.mktemp("chromium-profile")), executable_path=lab.chromium, headless=True,
        args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    yield context
    context.close()
    playwright.stop()


@pytest.fixture
def page(browser_context, lab):
    page = browser_context.new_page()
    page.console_errors = []
    page.on("console", lambda message: page.console_errors.append(message.text)
            if message.type == "error" else None)
    page.on("pageerror", lambda error: page.console_errors.append(str(error)))
    yield page
    page.close()
    lab.shutdown_kernels()
