"""Experiments built from the trainers: what the notebooks and the CLI run.

experiments.py     several algorithms on the same checkpoint, task and seed; time to an accuracy
moe_experiment.py  GRPO / GRPO + routing replay / GSPO on the mixture-of-experts checkpoint
scale_up.py        real model families from a local folder, and their memory by formula
staleness.py       the staleness sweep of the rollout/learner split (notebook 16, bench)
"""
