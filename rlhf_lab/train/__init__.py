"""What every trainer shares (SFT, reward model, DPO, RL), so each trainer holds only its own step.

loop.py        TrainingLoop: steps, evaluation, callbacks, atomic steps, Stop and early stopping
schedule.py    the learning-rate schedule (warm-up, then constant or cosine)
callbacks.py   the Callback hooks and the error a non-finite loss raises
run_state.py   save and resume a run exactly (weights, optimiser, every RNG, the history)
evaluate.py    held-out greedy accuracy, the completion budget, a standard error
"""
