"""How to read the live dashboard: what healthy and failing curves look like.

    from rlhf_lab.viz import dashboard_guide
    dashboard_guide()          # in a notebook: the guide as rendered Markdown
    print(DASHBOARD_GUIDE)     # the Markdown text itself

The guide describes the main view of `LiveDashboard` (plots.MAIN_PANELS), in the order of its panels.
"""

from __future__ import annotations

# One row per panel of the main view: (panel, what a healthy run shows, what a failing run shows).
PANEL_ROWS = (
    ("Reward per answer", "Rises, noisy from step to step.",
     "Flat for hundreds of steps: no learning signal (look at the groups). Rising while held-out accuracy "
     "falls: the policy games the reward."),
    ("Accuracy", "The held-out dots rise, then level off. Neighbouring dots differ by sampling noise.",
     "The dots fall after rising: over-optimisation, or a learning rate that is too high."),
    ("KL to the reference", "Starts at 0 and grows slowly.",
     "Climbs steeply or keeps speeding up: the policy drifts far from the model it started from."),
    ("Policy entropy", "Falls slowly as the policy grows sure of its answers.",
     "Drops to near 0 within a few dozen steps: collapse, every sample alike, nothing left to explore. "
     "Rises steadily: the policy turns random."),
    ("Advantages", "Spread on both sides of 0. As more groups agree, more advantages are exactly 0.",
     "All 0: every group got equal rewards, so the step changed nothing."),
    ("Rewards per prompt group", "Many groups mix right and wrong answers.",
     "All grey: every group is all right or all wrong. The task is too easy or too hard, and GRPO learns "
     "nothing."),
)

DASHBOARD_GUIDE = (
    "**Reading the dashboard.** Each panel answers one question. Healthy and failing runs look different.\n\n"
    "| Panel | Healthy | Something is wrong |\n| --- | --- | --- |\n"
    + "".join(f"| **{panel}** | {healthy} | {failing} |\n" for panel, healthy, failing in PANEL_ROWS)
    + r"""
**The title** gives the step and the seconds of training (evaluation and drawing excluded). Then the
average seconds per step, over the whole run and over the last 10 steps, and the latest held-out accuracy.

**A KL spike.** One tall, isolated spike in k3 usually comes from one sampled token. The policy now finds
that token very unlikely, while the reference did not. With $r = \pi_\text{ref}/\pi_\theta$, the estimator
$k_3 = r - 1 - \log r$ grows like $r$, so one such token can dominate a step's average. The dashboard keeps
the scale for the rest of the curve and labels the spike with its value. A spike that does not come back
is noise. Spikes that repeat, or a baseline that keeps rising, are not.

**The line under the panels** says what the panels left out show in this run. On-policy (one gradient step
per batch of samples), every importance ratio is exactly 1 and nothing is clipped, so those panels carry
nothing. `LiveDashboard(view="full")` draws all twelve.
"""
)


def dashboard_guide():
    """The guide as `IPython.display.Markdown` (a notebook renders it as the cell's value); the plain
    Markdown string where IPython is not installed."""
    try:
        from IPython.display import Markdown
    except ImportError:
        return DASHBOARD_GUIDE
    return Markdown(DASHBOARD_GUIDE)
