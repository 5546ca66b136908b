"""`python -m rlhf_lab COMMAND`: see rlhf_lab/cli.py."""

import sys

from rlhf_lab.cli import main

sys.exit(main())
