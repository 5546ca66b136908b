"""The two-command promise: environment files in step, CI runs the README's command, `make lab` starts."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _spec(requirement: str) -> str:
    return requirement.strip()[len(_name(requirement)):].replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_deps = project["dependencies"] + project["optional-dependencies"]["dev"]
    conda_deps = []
    text = (ROOT / "environment.yml").read_text()
    for line in text[text.index("dependencies:"):].splitlines():
        m = re.match(r"^\s+-\s+([A-Za-z][^#]*?)\s*$", line)
        if m and not m.group(1).startswith(("python", "pip", "-e")):
            conda_deps.append(m.group(1))
    conda = {("torch" if _name(d) == "pytorch" else _name(d)): _spec(d) for d in conda_deps}
    pip = {_name(d): _spec(d) for d in pip_deps}
    assert conda == pip, f"environment.yml and pyproject.toml differ: {set(conda.items()) ^ set(pip.items())}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip() and not line.startswith("#")]
    assert "make test" in commands


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_make_lab_starts_jupyterlab():
    port = _free_port()
    args = (
        f"--no-browser --ServerApp.port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token= "
        "--ServerApp.open_browser=False"
    )
    env_python = Path(sys.executable).parent
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "lab", f"LAB_ARGS={args}", f"VENV={env_python.parent}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.time() + 60
        status = None
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2) as response:
                    status = response.status
                    break
            except OSError:
                time.sleep(0.5)
        assert status == 200, f"JupyterLab did not answer on port {port}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=5) as response:
            assert response.status == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_slow_tests_are_collected_first(request):
    """tests/conftest.py puts the slow tests first, so that `make test`'s workers start the long files
    at once (whatever this session selected, the slow ones precede the rest)."""
    slow = [item.get_closest_marker("slow") is not None for item in request.session.items]
    assert slow == sorted(slow, reverse=True)
