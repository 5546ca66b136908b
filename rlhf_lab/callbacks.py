"""`Callback`: how live plots, progress bars and checkpoints watch a training run (SFT or RL).

Subclass and override what you need, then pass it to a trainer (`callbacks=[...]`) or call
`trainer.add_callback(...)`. Every trainer calls the hooks in this order:

    on_train_begin(trainer)                           once per `train()` call
    on_step_end(trainer, metrics, distributions)      after every step; `metrics` is the new history row,
                                                      `distributions` what the histograms show (or None)
    on_train_end(trainer)                             always, also after Stop / KeyboardInterrupt
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
