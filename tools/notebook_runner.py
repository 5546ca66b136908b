"""Execute notebooks top to bottom in a fresh kernel, and keep committed notebooks renderable.

    python -m tools.notebook_runner notebooks/*.ipynb          # full mode, outputs written back
    python -m tools.notebook_runner --fast --check notebooks/00_welcome.ipynb   # CI-style, no write

`clean_notebook` removes what breaks GitHub's renderer: the `widgets` entry of the notebook
metadata (its absence is fine; a partial one gives "state key missing from metadata.widgets") and
widget-view outputs (with their text fallback), whose state is not saved; every explorer leaves a
static figure beside its widget.

The kernel's replies are read in short polls (`SlicedPollChannel`): a reply that is already in the
client's socket is picked up within POLL_SLICE seconds even when its wake-up is lost, instead of at the
end of the cell's whole timeout (the cause of the rare ~300 s stalls of the FAST notebook test).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from queue import Empty

from jupyter_client import AsyncKernelManager
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import Type

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
POLL_SLICE = 0.1  # seconds: the longest a reply can wait unnoticed in the client's socket


class SlicedPollChannel(AsyncZMQSocketChannel):
    """A kernel channel whose `get_msg(timeout)` waits in polls of at most POLL_SLICE seconds.

    ZeroMQ announces a message to an event loop through an edge-triggered file descriptor: one wake-up
    per change. When that wake-up is lost, `zmq.asyncio`'s poll sleeps until its timeout and only its
    final non-blocking check finds the message. nbclient waits for a cell's reply in one poll as long
    as the cell timeout, so a cell that had finished in a second occasionally "took" the whole 300 s of
    the FAST test, and passed. It happened in cells that show an ipywidgets Output widget (every
    `interactive` has one), a few percent of them; the likely trigger is nbclient sending that widget's
    comm messages on the shell socket while it waits on the same socket for the reply (the exact line
    that loses the wake-up was not found). Polls of at most POLL_SLICE seconds each end in that same
    check, so a lost wake-up costs at most one slice; `timeout` keeps its meaning (None: wait forever;
    else queue.Empty once it has passed).
    """

    async def get_msg(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_SLICE if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await super().get_msg(timeout=min(POLL_SLICE, left))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class SlicedPollKernelClient(AsyncKernelClient):
    """nbclient's kernel client with every message channel read through `SlicedPollChannel`."""

    shell_channel_class = Type(SlicedPollChannel)
    iopub_channel_class = Type(SlicedPollChannel)
    stdin_channel_class = Type(SlicedPollChannel)
    control_channel_class = Type(SlicedPollChannel)


class SlicedPollKernelManager(AsyncKernelManager):
    """The kernel manager `execute` gives nbclient: its clients are `SlicedPollKernelClient`s."""

    client_factory = Type(SlicedPollKernelClient)


def clean_notebook(nb) -> None:
    """Strip widget state and widget-view outputs in place; keep every other output."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.get("outputs", []):
            if WIDGET_MIME in output.get("data", {}):
                continue  # a live widget; its text fallback ("interactive(children=...)") is noise too
            kept.append(output)
        cell["outputs"] = kept


def execute(path: str | os.PathLike, fast: bool, timeout: int = 900, write: bool = True,
            kernel_name: str = "python3", env: dict[str, str] | None = None):
    """Run a notebook in a fresh kernel with RLHF_LAB_FAST set; return (notebook, seconds).

    The kernel's environment is this process's, with RLHF_LAB_FAST set from `fast`, the inline
    matplotlib backend unless MPLBACKEND is set, and `env`'s entries on top. This process's own
    environment is left as it is, so several notebooks can run at once from threads.
    """
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    kernel_env = {"MPLBACKEND": "module://matplotlib_inline.backend_inline", **os.environ,
                  "RLHF_LAB_FAST": "1" if fast else "0", **(env or {})}
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name,
                            kernel_manager_class=SlicedPollKernelManager,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute(env=kernel_env)
    seconds = time.perf_counter() - start
    clean_notebook(nb)
    if write:
        nbformat.write(nb, path)
    return nb, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--fast", action="store_true", help="set RLHF_LAB_FAST=1 (the CI mode)")
    parser.add_argument("--check", action="store_true", help="execute without writing outputs back")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        _, seconds = execute(path, fast=args.fast, timeout=args.timeout, write=not args.check)
        print(f"{path}: {seconds:.1f} s ({'FAST' if args.fast else 'full'} mode)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
