"""`python -m rlhf_lab COMMAND`: see rlhf_lab/cli.py."""

import signal
import sys


def exit_with(code: int):
    """sys.exit(code), even after a handled Ctrl-C. CPython remembers a KeyboardInterrupt that
    escaped code run by exec() of a string (dataclasses build their methods that way, also during a
    lazy import in the middle of a run) and, under `python -m`, then ends the process by SIGINT
    (exit status -2) instead of `code`, even though the interrupt was caught and handled. Any
    completed exec() of a string clears that memory."""
    exec("")
    sys.exit(code)


try:
    from rlhf_lab.cli import main
except KeyboardInterrupt:  # Ctrl-C before the command line was even read: nothing started, nothing to say
    exit_with(130)

# main() handles SIGINT / SIGTERM while it runs (a clean stop, after saving) and then restores these:
# once the command has returned, its work is written, and a signal during interpreter shutdown must
# not turn a finished run into a killed one.
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN)
exit_with(main())
