"""`Callback`: how live plots, progress bars and checkpoints watch a training run (SFT or RL).

Subclass and override what you need, then pass it to a trainer (`callbacks=[...]`) or call
`trainer.add_callback(...)`. Every trainer calls the hooks in this order:

    on_train_begin(trainer)                           once per `train()` call
    on_step_end(trainer, metrics, distributions)      after every step; `metrics` is the new history row,
                                                      `distributions` what the histograms show (or None)
    on_train_end(trainer)                             always, also after Stop / KeyboardInterrupt

`rlhf_lab.train.run_state.Checkpointer` is one: it saves a resumable state every N steps and at any stop.
"""

from __future__ import annotations


class Callback:
    """A no-op for every hook; override the ones you need."""

    def on_train_begin(self, trainer) -> None: ...

    def on_step_end(self, trainer, metrics: dict, distributions=None) -> None: ...

    def on_train_end(self, trainer) -> None: ...


def call_hooks(callbacks, event: str, *args) -> None:
    """Call `event` on every callback that defines it (duck typing: any object with the method works)."""
    for callback in callbacks:
        method = getattr(callback, event, None)
        if method is not None:
            method(*args)


class NonFiniteLossError(FloatingPointError):
    """A step's loss, gradient or weights were NaN or infinite (the trainer keeps the last good step)."""


class ProgressBar(Callback):
    """A tqdm bar over the steps of any trainer, showing the last reward (RL) or loss (SFT) and the
    last held-out accuracy. `total` defaults to config.steps (None with a time budget: a counter)."""

    def __init__(self, total: int | None = None, desc: str | None = None) -> None:
        self.total, self.desc, self.bar = total, desc, None

    def on_train_begin(self, trainer) -> None:
        from tqdm.auto import tqdm

        config = trainer.config
        total = self.total if self.total is not None else (None if config.time_budget else config.steps)
        desc = self.desc or getattr(config, "algo", None) or f"sft {config.task}"
        self.bar = tqdm(total=total, desc=desc, leave=False)

    def on_step_end(self, trainer, metrics: dict, distributions=None) -> None:
        self.bar.update(1)
        post = {name: f"{metrics[name]:.3f}" for name in ("reward_mean", "loss") if name in metrics}
        accuracy = metrics.get("eval_accuracy", float("nan"))
        if accuracy == accuracy:  # not NaN: this step was evaluated
            post["eval_acc"] = f"{accuracy:.3f}"
        self.bar.set_postfix(post)

    def on_train_end(self, trainer) -> None:
        if self.bar is not None:
            self.bar.close()
