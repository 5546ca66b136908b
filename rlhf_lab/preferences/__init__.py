"""The human-feedback half of RLHF: preference data, annotators and their agreement, reward models.

    gold.py          gold_reward: the hidden gold preference that plays the human (Gao et al. 2022)
    annotators.py    Annotator (flip rate + verbosity bias), DEFAULT_ANNOTATORS
    agreement.py     cohen_kappa, fleiss_kappa, rating_counts, accuracy_ceiling
    data.py          PreferencePair, make_preference_data, load_preferences (data/preferences/)
    reward_model.py  bradley_terry_loss, RewardModel (READOUTS: where the score is read), RewardEnsemble, RewardConfig, RewardTrainer,
                     pairwise_accuracy, verbosity_probe, train_reward_model (the shipped ones: data/checkpoints)
    dpo.py           dpo_loss, ipo_loss, implicit_rewards, DPOConfig, DPOTrainer (no reward model)
    overoptimization.py  optimising against a reward model, measured: best-of-n and its KL, KL to the
                     initial policy, Gao et al.'s fits, RewardTracker / GoldEarlyStopping callbacks
"""

from .agreement import accuracy_ceiling, cohen_kappa, fleiss_kappa, rating_counts
from .annotators import DEFAULT_ANNOTATORS, Annotator
from .data import (
    DEFAULT_SOURCES,
    PREFERENCE_DIR,
    Comparison,
    CompletionSource,
    PreferencePair,
    agreement_table,
    first_labels,
    gold_agreement,
    label_comparisons,
    load_preferences,
    make_comparisons,
    make_preference_data,
    orient,
    read_preferences,
    save_preferences,
    write_datasheet,
    write_preference_data,
)
from .dpo import (
    LOSS_TYPES,
    DPOConfig,
    DPOTrainer,
    dpo_loss,
    encode_pairs,
    greedy_scores,
    implicit_rewards,
    ipo_loss,
    preference_logits,
    sampled_kl,
    sequence_logprobs,
)
from .gold import gold_reward
from .overoptimization import (
    BestOfNPool,
    GaoFit,
    GoldEarlyStopping,
    PolicyMeasurement,
    RewardTracker,
    StepTimeBreakdown,
    TimedReward,
    best_of_n,
    best_of_n_curve,
    best_of_n_kl,
    best_of_n_kl_bound,
    best_of_n_pool,
    fit_gao,
    measure_policy,
    sampled_best_of_n_kl,
    sequence_kl,
)
from .reward_model import (
    READOUTS,
    RewardConfig,
    RewardEnsemble,
    RewardModel,
    RewardTrainer,
    bradley_terry_loss,
    build_shipped_reward_models,
    pair_scores,
    pairwise_accuracy,
    reward_models_table,
    train_reward_model,
    verbosity_probe,
)

__all__ = [
    "LOSS_TYPES", "DPOConfig", "DPOTrainer", "dpo_loss", "encode_pairs", "greedy_scores", "implicit_rewards",
    "ipo_loss", "preference_logits", "sampled_kl", "sequence_logprobs",
    "BestOfNPool", "GaoFit", "GoldEarlyStopping", "PolicyMeasurement", "RewardTracker",
    "StepTimeBreakdown", "TimedReward", "best_of_n", "best_of_n_curve", "best_of_n_kl", "best_of_n_kl_bound",
    "best_of_n_pool", "fit_gao", "measure_policy", "sampled_best_of_n_kl", "sequence_kl",
    "DEFAULT_ANNOTATORS", "DEFAULT_SOURCES", "PREFERENCE_DIR", "Annotator", "Comparison", "agreement_table", "gold_agreement", "write_datasheet", "CompletionSource",
    "PreferencePair", "RewardConfig", "RewardEnsemble", "RewardModel", "RewardTrainer", "accuracy_ceiling",
    "bradley_terry_loss", "cohen_kappa", "first_labels", "fleiss_kappa", "gold_reward", "label_comparisons", "load_preferences",
    "make_comparisons", "make_preference_data", "orient", "pair_scores", "pairwise_accuracy", "rating_counts",
    "read_preferences", "save_preferences", "write_preference_data", "build_shipped_reward_models",
    "reward_models_table", "train_reward_model", "verbosity_probe", "READOUTS",
]
