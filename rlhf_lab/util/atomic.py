"""Writes that a crash cannot half-do, and a lock that a crash cannot leave behind.

    write_text_atomic(path, text)       temp file beside `path` -> fsync -> os.replace
    write_bytes(path, data)             a plain write whose failure is an OSError naming `path`
    replace_folder(folder, write)       build the folder under a hidden name, then swap it in
    recover_folder(folder)              after a killed save: finish or undo the swap, drop leftovers
    FolderLock(folder)                  one writer per folder; the OS releases it when the process dies
    StopSignals(), signals_deferred()   SIGTERM stops like Ctrl-C; a signal during a save waits for it

A folder swap takes two renames (the old folder aside, the new one in). A kill between them leaves
no folder at all, only the hidden copies, so the new copy is first renamed to `.NAME.new-PID`, a
name that means "complete": `recover_folder` puts it in place (or, failing that, the old copy
`.NAME.old-PID` back) and deletes the leftovers of processes that are gone. Saving and loading call
it, so a killed save costs nothing but the save itself.

Standard library only: the model package uses it too.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path


class FolderInUseError(RuntimeError):
    """Another process holds the folder's lock (one writer per output folder)."""


def _fsync_dir(folder: Path) -> None:
    """Make renames inside `folder` durable (POSIX; Windows has no directory handles to sync)."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` so that readers see the old file or the new one, never a mix:
    a temporary file in the same folder, flushed to disk, then renamed over `path`."""
    path = Path(path)
    recover_folder(path)  # deletes the temporary files of a killed earlier write (same naming)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)
    except OSError as exc:
        raise naming(exc, path) from exc
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise naming(exc, path) from exc
        raise
    return path


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` with Python's own file API, so that a failure (a full disk) is an
    OSError naming the file, not a library's own error (torch's "unexpected pos", safetensors')."""
    path = Path(path)
    try:
        with open(path, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise naming(exc, path) from exc
    return path


def naming(error: OSError, path: str | os.PathLike) -> OSError:
    """The same OSError (errno, reason) with `path` as its file: the one the user knows, not a
    temporary name beside it."""
    return type(error)(error.errno, error.strerror or str(error), str(path))


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftovers: this process is not inside a save while it recovers
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT there: keep the leftover
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def _leftovers(folder: Path) -> dict[str, list[tuple[Path, int]]]:
    """`.NAME.tmp-PID-*`, `.NAME.new-PID` and `.NAME.old-PID` beside `folder`, by kind, oldest first."""
    pattern = re.compile(rf"^\.{re.escape(folder.name)}\.(tmp|new|old)-(\d+)(-.*)?$")
    found: dict[str, list[tuple[Path, int]]] = {"tmp": [], "new": [], "old": []}
    if not folder.parent.is_dir():
        return found
    for entry in folder.parent.iterdir():
        match = pattern.match(entry.name)
        if match:
            found[match.group(1)].append((entry, int(match.group(2))))
    for entries in found.values():
        entries.sort(key=lambda item: item[0].stat().st_mtime)
    return found


def recover_folder(folder: str | os.PathLike) -> bool:
    """Repair what a killed `replace_folder` left beside `folder`. Returns True if `folder` was
    missing and a complete copy was put back (the newer one if its swap got that far).

    Leftovers of live processes are kept (they may be saving right now); a folder we cannot write
    (a read-only install) is left alone."""
    folder = Path(folder)
    try:
        found = _leftovers(folder)
        stale = {kind: [path for path, pid in entries if not _pid_alive(pid)] for kind, entries in found.items()}
        restored = False
        if not folder.exists():
            for kind in ("new", "old"):  # a complete new copy beats the old one
                if stale[kind]:
                    os.replace(stale[kind].pop(), folder)
                    restored = True
                    break
        for paths in stale.values():
            for path in paths:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        return restored
    except OSError:
        return False


def replace_folder(folder: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Create or replace `folder` atomically: `write(tmp)` fills a fresh hidden folder beside it,
    every file is flushed to disk, and the result is renamed into place. A reader sees the old
    folder or the new one; a kill at any moment leaves one of them (see `recover_folder`)."""
    folder = Path(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        recover_folder(folder)
        pid = os.getpid()
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-{pid}-", dir=folder.parent))
    except OSError as exc:
        raise naming(exc, folder) from exc
    ready = folder.with_name(f".{folder.name}.new-{pid}")
    old = folder.with_name(f".{folder.name}.old-{pid}")
    try:
        write(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
        for path in tmp.rglob("*"):  # flush contents before a rename makes them visible
            if path.is_file():
                os.chmod(path, 0o644)
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        os.replace(tmp, ready)  # from here on the new copy is complete
        if folder.exists():
            os.replace(folder, old)
        os.replace(ready, folder)
        _fsync_dir(folder.parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if not folder.exists():  # interrupted between the renames: put a complete copy back
            for copy in (ready, old):
                if copy.exists():
                    os.replace(copy, folder)
                    break
        shutil.rmtree(ready, ignore_errors=True)
        if isinstance(exc, OSError):  # a full disk, say: the previous folder is still there
            raise naming(exc, folder) from exc
        raise
    return folder


class FolderLock:
    """Hold `folder/.lock` while writing into `folder`: a second `FolderLock` on it, in any process,
    raises FolderInUseError naming the holder. The OS drops the lock when the holder exits, however
    it exits (even SIGKILL), so a stale lock file never blocks anyone.

        with FolderLock(out):
            ...   # this process is the folder's only writer

    Acquiring also proves the folder writable, before any work is done.
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / ".lock"
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise PermissionError(f"cannot write to the output folder {self.folder} ({exc.strerror}); "
                                  "choose a folder you can write to") from exc
        try:
            _lock(fd)
        except OSError:
            holder = os.read(fd, 512).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise FolderInUseError(f"{self.folder} is in use by another run ({holder}); wait for it to finish "
                                   "or choose another output folder") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}".encode())
        self._fd = fd
        try:  # the lock file could be written; check that new files can be created too
            tempfile.TemporaryFile(dir=self.folder).close()
        except OSError as exc:
            self.release()
            raise PermissionError(f"cannot create files in the output folder {self.folder} ({exc.strerror}); "
                                  "choose a folder you can write to") from exc
        return self

    def release(self) -> None:
        if self._fd is not None:
            _unlock(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# ------------------------------------------------------------------------------------- signals

_ACTIVE: StopSignals | None = None


class StopSignals:
    """While active, SIGINT and SIGTERM (what `kill`, `timeout` and job schedulers send) raise
    KeyboardInterrupt, which the trainer turns into a clean stop. Inside `deferred()` (a save) a
    signal is held until the block ends, so no number of signals can abort a save half-way.

    Main thread only (Python delivers signals there); elsewhere it does nothing."""

    def __init__(self) -> None:
        self.received = 0
        self._deferring = 0
        self._pending = False
        self._what: list[str] = []
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        self.received += 1
        if self._deferring:
            self._pending = True
            print(f"\n{signal.Signals(signum).name}: finishing {self._what[-1]}, then stopping", file=sys.stderr)
            return
        raise KeyboardInterrupt

    def __enter__(self) -> StopSignals:
        global _ACTIVE
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
            _ACTIVE = self
        return self

    def __exit__(self, *exc) -> None:
        global _ACTIVE
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if _ACTIVE is self:
            _ACTIVE = None

    @contextlib.contextmanager
    def deferred(self, what: str = "the save in progress"):
        """Hold signals until the block ends (`what` it is doing goes in the message), then stop."""
        self._deferring += 1
        self._what.append(what)
        try:
            yield
        finally:
            self._deferring -= 1
            self._what.pop()
            if not self._deferring and self._pending:
                self._pending = False
                raise KeyboardInterrupt


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT/SIGTERM until the block ends, when a `StopSignals` is active (the CLI); otherwise
    (a notebook) a no-op, and an interrupt aborts an atomic save, leaving the previous one."""
    if _ACTIVE is None:
        yield
    else:
        with _ACTIVE.deferred():
            yield



if os.name == "nt":
    import msvcrt

    def _lock(fd: int) -> None:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
