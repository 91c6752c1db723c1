"""Tuning seeds, disjoint from the test seeds: the one place both are defined and checked.

Hyper-parameters chosen on the runs that later score them are biased upward (results vary a lot from seed to
seed: Henderson et al. 2018, arXiv 1709.06560; scoring the best of the tuning runs themselves is the
maximisation bias discussed by Patterson et al. 2023, arXiv 2304.01315), so tuning runs never reuse a test seed. The
test seeds are the encoder study's (:data:`rl_transformers.study.suite.SEEDS`, every preset). Trial ``n`` of a
tuning study trains with seed :data:`TUNING_SEED_BASE` + n. A PPO run with seed s seeds its envs s, s + 1, ...,
s + num_envs - 1 and its evaluations from s + 100,003 on, so the base is far enough above every test seed that
neither the run seeds nor the env and evaluation seeds derived from them can meet (:func:`check_disjoint`,
called on import and before every trial).
"""

from __future__ import annotations

from rl_transformers.study.suite import SEEDS

TEST_SEEDS: tuple[int, ...] = tuple(sorted({s for seeds in SEEDS.values() for s in seeds}))
"""Seeds that score results (the study's, every preset); never used by a tuning trial."""
TUNING_SEED_BASE = 1_000_000
"""Trial n of a tuning study trains with seed TUNING_SEED_BASE + n."""
MAX_TRIALS = 100_000
"""Trials per study (the tuning seeds are TUNING_SEED_BASE ... TUNING_SEED_BASE + MAX_TRIALS - 1)."""
SEED_SPAN = 200_000
"""Seeds a run derives from its own (envs: + num_envs; evaluations: + 100,003 + update), bounded above."""


def tuning_seed(trial_number: int) -> int:
    """The seed of tuning trial ``trial_number`` (0-based)."""
    if not 0 <= trial_number < MAX_TRIALS:
        raise ValueError(f"trial number {trial_number} is outside [0, {MAX_TRIALS}) (the tuning seed range)")
    seed = TUNING_SEED_BASE + trial_number
    check_disjoint((seed,), TEST_SEEDS)
    return seed


def check_disjoint(tuning: tuple[int, ...], test: tuple[int, ...]) -> None:
    """Raise ``AssertionError`` when a tuning seed, or a seed derived from it, can equal a test-derived one."""
    for t in tuning:
        for s in test:
            if abs(t - s) < SEED_SPAN:
                raise AssertionError(
                    f"tuning seed {t} is within {SEED_SPAN} of test seed {s}: their env / evaluation seeds "
                    "could coincide; tuning seeds must be disjoint from the test seeds"
                )


check_disjoint((TUNING_SEED_BASE, TUNING_SEED_BASE + MAX_TRIALS - 1), TEST_SEEDS)
if max(TEST_SEEDS) >= TUNING_SEED_BASE - SEED_SPAN:
    raise AssertionError(f"test seeds {TEST_SEEDS} reach into the tuning range from {TUNING_SEED_BASE}")

__all__ = ["MAX_TRIALS", "TEST_SEEDS", "TUNING_SEED_BASE", "check_disjoint", "tuning_seed"]
