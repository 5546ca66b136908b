"""Every notebook in notebooks/ runs top to bottom in a fresh kernel in FAST mode, the committed
notebooks render on GitHub (valid nbformat, no widget state, small, no error outputs), and their code
uses only the package's public API (no `obj._private`, no monkeypatched methods)."""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import json
import os
from pathlib import Path
from queue import Empty

import nbformat
import pytest
import zmq
import zmq.asyncio
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.session import Session

from tools.notebook_runner import (
    POLL_SLICE,
    WIDGET_MIME,
    SlicedPollChannel,
    SlicedPollKernelClient,
    SlicedPollKernelManager,
    execute,
)

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]*_*.ipynb"))


def test_notebooks_are_discovered():
    assert NOTEBOOKS, "no notebooks found"
    names = [p.name for p in NOTEBOOKS]
    assert names == sorted(names)
    assert len({n.split("_")[0] for n in names}) == len(names), "two notebooks share a number"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_renders_on_github(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert "widgets" not in nb.metadata, "widget state in metadata (run notebook_runner.clean_notebook)"
    assert path.stat().st_size < 2 * 2**20, f"{path.name} is over 2 MiB"
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert code_cells and all(c.get("execution_count") for c in code_cells), "commit notebooks with outputs"
    for cell in code_cells:
        for output in cell.outputs:
            assert output.output_type != "error", f"error output committed in {path.name}"
            assert WIDGET_MIME not in output.get("data", {}), "widget view without state"
    first = nb.cells[0].source.lower()
    for heading in ("what you will learn", "prerequisites", "run time"):
        assert heading in first, f"first cell of {path.name} lacks '{heading}'"
    json.dumps(nb)  # serialisable


@pytest.fixture(scope="module")
def fast_runs(request, tmp_path_factory, parallel_processes):
    """{notebook path: future of execute(...)}: the FAST runs of the notebooks this session selected,
    started together, `parallel_processes` at a time, each in its own kernel with ONE torch thread.

    The tests below then only wait for their own notebook. On a 2-core machine two kernels of one
    thread each ran the 16 notebooks in 178-184 s, against 369 s one at a time with torch's default
    of two threads (2026-12-03). Two kernels with two threads each would fight for the same cores. A
    run's numbers do not matter here, only that every cell runs without an error.
    """
    selected = [item.callspec.params["path"] for item in request.session.items
                if item.originalname == "test_notebook_executes_in_fast_mode"]
    pool = concurrent.futures.ThreadPoolExecutor(parallel_processes)
    runs = {}
    for path in selected:
        copy = tmp_path_factory.mktemp(path.stem) / path.name
        copy.write_text(path.read_text())
        # timeout per cell: a stalled kernel fails fast
        runs[path] = pool.submit(execute, copy, fast=True, timeout=300, write=False, env={"OMP_NUM_THREADS": "1"})
    yield runs
    pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_in_fast_mode(path, fast_runs, parallel_processes):
    nb, seconds = fast_runs[path].result()
    print(f"{path.name}: {seconds:.1f} s in FAST mode ({min(parallel_processes, len(fast_runs))} at a time)")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"


def test_execute_gives_the_kernel_its_settings_and_leaves_this_process_alone(tmp_path, monkeypatch):
    """What `fast_runs` relies on to start kernels from threads: RLHF_LAB_FAST and `env` reach the
    kernel through its own environment, and this process's environment is not changed (two threads
    setting and restoring os.environ could start a kernel in the wrong mode)."""
    monkeypatch.delenv("RLHF_LAB_FAST", raising=False)
    monkeypatch.delenv("MPLBACKEND", raising=False)
    code = "import os, torch; print(os.environ['RLHF_LAB_FAST'], os.environ['MPLBACKEND'], torch.get_num_threads())"
    path = tmp_path / "env.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), path)
    before = dict(os.environ)
    for fast, env, expected in ((True, {"OMP_NUM_THREADS": "1"}, "1 module://matplotlib_inline.backend_inline 1"),
                                (False, {"MPLBACKEND": "agg"}, "0 agg")):
        nb, _ = execute(path, fast=fast, timeout=60, write=False, env=env)
        assert nb.cells[0].outputs[0]["text"].startswith(expected)
        assert dict(os.environ) == before


class LostWakeupSocket(zmq.asyncio.Socket):
    """A socket whose wake-ups are all lost: `poll(timeout)` sleeps the whole timeout, then finds what is
    already there with a zero-timeout check, as `zmq.asyncio` does when a message's wake-up was consumed
    before the poll started. It records every timeout it was asked for (ms)."""

    requested_timeouts = None  # declared here: pyzmq takes an unknown attribute for a socket option

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requested_timeouts = []

    async def poll(self, timeout=None, flags=zmq.POLLIN):
        self.requested_timeouts.append(timeout)
        await asyncio.sleep((timeout or 0) / 1000)
        return await super().poll(0, flags)


def read_with_lost_wakeups(channel_class, timeout: float, send: bool = True):
    """One `get_msg(timeout)` of `channel_class` on a LostWakeupSocket: (the message, or the queue.Empty it
    raised; the poll timeouts it asked for)."""
    async def run():
        context = zmq.asyncio.Context()
        receiver = context.socket(zmq.PAIR, socket_class=LostWakeupSocket)
        sender = context.socket(zmq.PAIR)
        receiver.bind("inproc://lost-wakeup")
        sender.connect("inproc://lost-wakeup")
        session = Session()
        if send:
            session.send(sender, "execute_reply", {"status": "ok"})
        try:
            message = await channel_class(receiver, session).get_msg(timeout=timeout)
        except Empty as nothing:  # nothing arrived within the timeout
            message = nothing
        finally:
            sender.close(linger=0)
            receiver.close(linger=0)
            context.term()
        return message, receiver.requested_timeouts
    # In a thread of its own: asyncio.run needs a thread with no running event loop, and when the
    # browser tests run first, Playwright's sync API keeps one running in the main thread.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


def test_a_reply_whose_wakeup_is_lost_waits_one_slice_not_the_cell_timeout():
    # The cause of the rare ~300 s FAST-mode stalls: the reply was in the socket, but one poll as long
    # as the cell timeout only found it when that timeout ran out. Read in slices, it waits one slice.
    message, polled = read_with_lost_wakeups(SlicedPollChannel, timeout=5)
    assert message["msg_type"] == "execute_reply"
    assert polled and max(polled) <= POLL_SLICE * 1000, polled
    # The plain channel asks for the whole timeout in one poll: what this test guards against.
    _, plain_polled = read_with_lost_wakeups(AsyncZMQSocketChannel, timeout=2 * POLL_SLICE)
    assert plain_polled == [int(2 * POLL_SLICE * 1000)]


def test_sliced_poll_channel_keeps_get_msg_timeout_semantics():
    nothing, polled = read_with_lost_wakeups(SlicedPollChannel, timeout=2.5 * POLL_SLICE, send=False)
    assert isinstance(nothing, Empty)  # the caller's timeout still ends the wait
    assert len(polled) >= 3 and max(polled) <= POLL_SLICE * 1000, polled


def test_sliced_poll_kernel_manager_reads_every_channel_in_slices():
    client = SlicedPollKernelManager().client()
    assert isinstance(client, SlicedPollKernelClient)
    for name in ("shell", "iopub", "stdin", "control"):
        assert issubclass(getattr(client, f"{name}_channel_class"), SlicedPollChannel), name


# Cell magics whose body is Python: the first line goes, the rest is parsed. Any other cell magic
# (%%bash, %%html, %%writefile, ...) holds no Python and is skipped.
PYTHON_CELL_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")


def _python_source(source: str) -> str | None:
    """A code cell's source with IPython magics and shell escapes blanked (line numbers kept)."""
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        if not lines[0].lstrip().startswith(PYTHON_CELL_MAGICS):
            return None
        lines[0] = ""
    kept = []
    for line in lines:
        stripped = line.lstrip()
        is_magic = stripped.startswith(("%", "!")) or stripped.endswith("?")
        assigns_magic = "=" in stripped and stripped.split("=", 1)[1].lstrip().startswith(("%", "!"))
        kept.append("" if is_magic or assigns_magic else line)
    return "\n".join(kept)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(sources: list[str]) -> list[str]:
    """What the code cells `sources` of one notebook do that the public API does not offer: attribute
    access `x._name`, imports of `_name` or `_module` from rlhf_lab, and monkeypatching (assigning a
    lambda, or a function the notebook defines, to an attribute: `trainer.reward_fn = f`)."""
    trees = {}
    for index, source in enumerate(sources):
        code = _python_source(source)
        if code is not None:
            trees[index] = ast.parse(code)
    defined = {node.name for tree in trees.values() for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    found = []
    for index, tree in trees.items():
        for node in ast.walk(tree):
            where = f"cell {index} line {getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                found.append(f"{where}: {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rlhf_lab":
                private_module = any(_is_private(part) for part in node.module.split("."))
                names = [alias.name for alias in node.names if _is_private(alias.name)]
                if private_module or names:
                    found.append(f"{where}: from {node.module} import {', '.join(a.name for a in node.names)}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "rlhf_lab" and any(_is_private(p) for p in parts):
                        found.append(f"{where}: import {alias.name}")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                patches = isinstance(value, ast.Lambda) or (isinstance(value, ast.Name) and value.id in defined)
                for target in targets:
                    if patches and isinstance(target, ast.Attribute):
                        found.append(f"{where}: monkeypatch {ast.unparse(target)} = {ast.unparse(value)[:40]}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                  and len(node.args) == 3 and (isinstance(node.args[2], ast.Lambda)
                                               or (isinstance(node.args[2], ast.Name) and node.args[2].id in defined))):
                found.append(f"{where}: monkeypatch {ast.unparse(node)[:60]}")
    return found


def test_private_use_scan_catches_what_it_should():
    sources = [
        "%matplotlib inline\n!ls\nimport torch\nfrom rlhf_lab.rl import Trainer",
        "rollout = trainer._collect_rollout()\nx = model.__class__\ny = obj.__dict__\nz = a.b.c",
        "from rlhf_lab.rl.trainer import _helper, public\nfrom rlhf_lab._impl import thing\nimport rlhf_lab._impl",
        "def my_loss(*args):\n    return 0\ntrainer.algorithm.loss = my_loss\ntrainer.reward_fn = lambda *a: 1.0",
        "config.learning_rate = 3e-3\nsetattr(trainer, 'reward_fn', my_loss)\nresult = my_loss()",
        "%%bash\necho obj._private",
        "%%time\nfrom os import _exit",
    ]
    found = private_uses(sources)
    joined = "\n".join(found)
    assert "cell 1 line 1: trainer._collect_rollout" in joined
    assert "__class__" not in joined and "__dict__" not in joined and "a.b.c" not in joined
    assert "cell 2 line 1: from rlhf_lab.rl.trainer import _helper, public" in joined
    assert "from rlhf_lab._impl import thing" in joined and "cell 2 line 3: import rlhf_lab._impl" in joined
    assert "monkeypatch trainer.algorithm.loss = my_loss" in joined
    assert "monkeypatch trainer.reward_fn = lambda" in joined
    assert "cell 4 line 2: monkeypatch setattr(trainer" in joined
    assert "learning_rate" not in joined and "cell 5" not in joined
    assert "cell 6" not in joined  # `from os import _exit` is not the package's
    assert len(found) == 7, found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_only_public_names(path):
    """Notebooks teach the public API: what a notebook needs from a private name, the package exports."""
    nb = nbformat.read(path, as_version=4)
    sources = [c.source if c.cell_type == "code" else "" for c in nb.cells]
    found = private_uses(sources)
    assert not found, f"{path.name} uses private names or monkeypatches:\n  " + "\n  ".join(found)
