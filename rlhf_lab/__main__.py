"""`python -m rlhf_lab COMMAND`: see rlhf_lab/cli.py."""

import signal
import sys

try:
    from rlhf_lab.cli import main
except KeyboardInterrupt:  # Ctrl-C before the command line was even read: nothing started, nothing to say
    sys.exit(130)

# main() handles SIGINT / SIGTERM while it runs (a clean stop, after saving) and then restores these:
# once the command has returned, its work is written, and a signal during interpreter shutdown must
# not turn a finished run into a killed one.
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, signal.SIG_IGN)
sys.exit(main())
