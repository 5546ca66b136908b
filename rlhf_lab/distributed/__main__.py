"""`python -m rlhf_lab.distributed --rank R ...`: one rollout process (rlhf_lab.distributed.worker.main).
The learner starts these itself; under torchrun, `python -m rlhf_lab train` starts them instead."""

import sys

from rlhf_lab.distributed.worker import main

sys.exit(main())
