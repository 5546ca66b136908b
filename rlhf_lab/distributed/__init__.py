"""Beyond one process: the rollout/learner split on torch.distributed, staleness, weight sync,
data-parallel learners, and the rollout/trainer mismatch.

    from rlhf_lab.distributed import AsyncTrainer, SplitConfig
    trainer = AsyncTrainer(make_config("grpo"), SplitConfig(rollout_workers=1, max_staleness=1))
    trainer.train()

| file | what |
| --- | --- |
| `config.py` | `SplitConfig` and the checks that need the machine (ports, GPUs, world sizes) |
| `weights.py` | weight sync: one flat bucket or tensor by tensor, broadcast on a group of its own |
| `wire.py` | Python objects (rollouts) over point-to-point sends |
| `staleness.py` | admission (at most K + 1 rollouts ahead) and the queue that drops staler ones |
| `worker.py` | the rollout copy and sampler; the rollout process's loop |
| `tiers.py` | where the learner's rollouts come from: in this process, or from rollout processes |
| `learner.py` | `AsyncTrainer`: a `Trainer` fed by the rollout tier |
| `ddp.py` | data-parallel learners: the loss scale that makes shards add up to the full batch |
| `mismatch.py` | the rollout copy in bf16 / fp16 / int8 KV against the fp32 learner |
| `measure.py` | throughput and sync measurements shared by bench/distributed.py and notebook 16 |
| `workloads.py` | a reward that takes time: where overlapping sampling with training pays |
| `__main__.py` | `python -m rlhf_lab.distributed --rank R ...`: one rollout process |

The corrections for stale or mismatched rollouts (naive, decoupled, TIS, MIS) are in
`rlhf_lab.rl.off_policy`: they are part of the loss, whoever samples.
"""

from .config import SplitConfig, check_divides, command_line_split, free_port, torchrun_environment
from .learner import SPLIT_COLUMNS, AsyncTrainer, RemoteSampler
from .staleness import Admission, RolloutQueue
from .tiers import InlineTier, ProcessTier
from .weights import flatten, trainable_tensors, unflatten_into, weight_payload
from .worker import RolloutMessage, RolloutWorker, WorkerSpec, rollout_worker_main, torchrun_rollout_worker

__all__ = [
    "SPLIT_COLUMNS", "Admission", "AsyncTrainer", "InlineTier", "ProcessTier", "RemoteSampler",
    "RolloutMessage", "RolloutQueue", "RolloutWorker", "SplitConfig", "WorkerSpec", "check_divides",
    "command_line_split", "flatten", "free_port", "rollout_worker_main", "torchrun_environment",
    "torchrun_rollout_worker", "trainable_tensors", "unflatten_into", "weight_payload",
]
