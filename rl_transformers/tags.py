"""The training-log vocabulary shared by every trainer (PPO, DT, BC): tag names and their meanings.

Tags follow Stable-Baselines3 where a name exists. The logger never invents a tag (except the ``time/<name>_s``
convention of :func:`measure_time`); the standard ones are listed in :data:`STANDARD_TAGS` and exposed as
constants (``EP_REW_MEAN`` ...), so trainers share spellings:

==============================  =============================================================
tag                             meaning
==============================  =============================================================
``rollout/ep_rew_mean``         mean undiscounted return of episodes finished in the window
``rollout/ep_len_mean``         mean length of those episodes
``train/loss``                  total optimised loss
``train/policy_gradient_loss``  PPO clipped surrogate loss
``train/value_loss``            critic loss
``train/entropy_loss``          minus the policy entropy (as SB3)
``train/approx_kl``             approximate KL(old || new) (Schulman's k3 estimator)
``train/clip_fraction``         fraction of samples whose ratio was clipped
``train/clip_range``            PPO clip epsilon
``train/explained_variance``    1 - Var[returns - values] / Var[returns]
``train/learning_rate``         current optimiser learning rate
``train/n_updates``             number of gradient steps so far
``train/grad_norm``             gradient norm before clipping
``train/action_loss``           Decision Transformer action loss (MSE or cross-entropy)
``time/fps``                    environment steps per second
``time/iterations``             training iterations so far
``time/time_elapsed``           seconds since the start of training
``time/total_timesteps``        environment steps so far
``eval/mean_reward``            mean return of evaluation episodes
``eval/mean_ep_length``         mean length of evaluation episodes
``eval/normalized_score``       D4RL-normalised score, 100 * (R - R_random) / (R_expert - R_random)
``time/samples_per_second``     training windows per second (Decision Transformer)
``eval/return_mean``            DT: mean evaluation return of the first target (``@<target>``: each)
``eval/return_std``             DT: std of the evaluation returns (``@<target>``: each target)
``eval/ep_length_mean``         DT: mean evaluation episode length (``@<target>``: each target)
``backbone/...``                backbone diagnostics from ``out.info`` (gate openness, spans ...)
==============================  =============================================================
"""

from __future__ import annotations

__all__ = [
    "ACTION_LOSS",
    "APPROX_KL",
    "CLIP_FRACTION",
    "CLIP_RANGE",
    "ENTROPY_LOSS",
    "EP_LEN_MEAN",
    "EP_REW_MEAN",
    "EVAL_EP_LENGTH_MEAN",
    "EVAL_MEAN_EP_LENGTH",
    "EVAL_MEAN_REWARD",
    "EVAL_NORMALIZED_SCORE",
    "EVAL_RETURN_MEAN",
    "EVAL_RETURN_STD",
    "EVAL_SUCCESS_RATE",
    "EXPLAINED_VARIANCE",
    "FPS",
    "GRAD_NORM",
    "ITERATIONS",
    "LEARNING_RATE",
    "LOSS",
    "N_UPDATES",
    "POLICY_GRADIENT_LOSS",
    "SAMPLES_PER_SECOND",
    "STANDARD_TAGS",
    "TIME_ELAPSED",
    "TOTAL_TIMESTEPS",
    "VALUE_LOSS",
]

# Stable-Baselines3 names where they exist
EP_REW_MEAN = "rollout/ep_rew_mean"
EP_LEN_MEAN = "rollout/ep_len_mean"
LOSS = "train/loss"
POLICY_GRADIENT_LOSS = "train/policy_gradient_loss"
VALUE_LOSS = "train/value_loss"
ENTROPY_LOSS = "train/entropy_loss"
APPROX_KL = "train/approx_kl"
CLIP_FRACTION = "train/clip_fraction"
CLIP_RANGE = "train/clip_range"
EXPLAINED_VARIANCE = "train/explained_variance"
LEARNING_RATE = "train/learning_rate"
N_UPDATES = "train/n_updates"
GRAD_NORM = "train/grad_norm"
ACTION_LOSS = "train/action_loss"
FPS = "time/fps"
ITERATIONS = "time/iterations"
TIME_ELAPSED = "time/time_elapsed"
TOTAL_TIMESTEPS = "time/total_timesteps"
EVAL_MEAN_REWARD = "eval/mean_reward"
EVAL_MEAN_EP_LENGTH = "eval/mean_ep_length"
EVAL_NORMALIZED_SCORE = "eval/normalized_score"
SAMPLES_PER_SECOND = "time/samples_per_second"
EVAL_RETURN_MEAN = "eval/return_mean"
EVAL_RETURN_STD = "eval/return_std"
EVAL_EP_LENGTH_MEAN = "eval/ep_length_mean"
EVAL_SUCCESS_RATE = "eval/success_rate"

STANDARD_TAGS: dict[str, str] = {
    EP_REW_MEAN: "mean undiscounted return of episodes finished in the window",
    EP_LEN_MEAN: "mean length of episodes finished in the window",
    LOSS: "total optimised loss",
    POLICY_GRADIENT_LOSS: "PPO clipped surrogate loss",
    VALUE_LOSS: "critic loss",
    ENTROPY_LOSS: "minus the policy entropy",
    APPROX_KL: "approximate KL(old || new)",
    CLIP_FRACTION: "fraction of samples whose probability ratio was clipped",
    CLIP_RANGE: "PPO clip epsilon",
    EXPLAINED_VARIANCE: "1 - Var[returns - values] / Var[returns]",
    LEARNING_RATE: "current optimiser learning rate",
    N_UPDATES: "number of gradient steps so far",
    GRAD_NORM: "gradient norm before clipping",
    ACTION_LOSS: "Decision Transformer action loss",
    FPS: "environment steps per second",
    ITERATIONS: "training iterations so far",
    TIME_ELAPSED: "seconds since the start of training",
    TOTAL_TIMESTEPS: "environment steps so far",
    EVAL_MEAN_REWARD: "mean return of evaluation episodes",
    EVAL_MEAN_EP_LENGTH: "mean length of evaluation episodes",
    EVAL_NORMALIZED_SCORE: "D4RL-normalised evaluation score (0 = random, 100 = expert)",
    SAMPLES_PER_SECOND: "training windows per second (Decision Transformer)",
    EVAL_RETURN_MEAN: "Decision Transformer: mean evaluation return of the first target (@<target>: per target)",
    EVAL_RETURN_STD: "Decision Transformer: std of the evaluation returns (@<target>: per target)",
    EVAL_EP_LENGTH_MEAN: "Decision Transformer: mean evaluation episode length (@<target>: per target)",
    EVAL_SUCCESS_RATE: "share of evaluation episodes whose last info had is_success / success true (SB3's tag; "
    "envs that report it, e.g. the T-Maze)",
}
