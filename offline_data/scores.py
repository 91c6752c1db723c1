"""D4RL normalized scores and their reference returns.

The D4RL normalized score (Fu et al. 2020, arXiv 2004.07219) maps an undiscounted episode return R to
100·(R − R_random)/(R_expert − R_random): 0 is a uniformly random policy, 100 the expert that D4RL used.
`D4RL_REF_SCORES` holds D4RL's published `REF_MIN_SCORE` / `REF_MAX_SCORE` (d4rl/infos.py; identical for
the v0/v1/v2 locomotion datasets). Applied to Gymnasium v5 MuJoCo tasks they give familiar units, but the
numbers are not comparable to published v2 tables (different simulator, env version and data).
"""

from __future__ import annotations

import difflib
import re
from typing import Any, NamedTuple

import numpy as np

__all__ = ["D4RL_REF_SCORES", "RefScores", "env_family", "normalized_score", "reference_scores"]


class RefScores(NamedTuple):
    """Reference returns: `ref_min` scores 0, `ref_max` scores 100."""

    ref_min: float
    ref_max: float


D4RL_REF_SCORES: dict[str, RefScores] = {
    "hopper": RefScores(-20.272305, 3234.3),
    "halfcheetah": RefScores(-280.178953, 12135.0),
    "walker2d": RefScores(1.629008, 4592.3),
    "ant": RefScores(-325.6, 3879.7),
}
"""D4RL reference returns keyed by environment family (lower-case Gymnasium name without version)."""


def normalized_score(
    returns: float | np.ndarray | list[float], ref_min: float, ref_max: float
) -> float | np.ndarray:
    """100·(R − ref_min)/(ref_max − ref_min); a float for a scalar input, else an array of R's shape."""
    if not (np.isfinite(ref_min) and np.isfinite(ref_max)) or ref_max <= ref_min:
        raise ValueError(f"need finite ref_min < ref_max, got ref_min={ref_min!r}, ref_max={ref_max!r}")
    scores = 100.0 * (np.asarray(returns, dtype=np.float64) - ref_min) / (ref_max - ref_min)
    return float(scores) if scores.ndim == 0 else scores


def env_family(name: str) -> str | None:
    """The `D4RL_REF_SCORES` family named by an env id, dataset id, D4RL name or path, else None.

    The name is split on non-alphanumerics and each piece compared whole, so "Ant-v5" is "ant" while
    "antmaze-umaze-v2" (other references) is not.
    """
    tokens = re.split(r"[^a-z0-9]+", name.lower())
    for token in tokens:
        if token in D4RL_REF_SCORES:
            return token
    return None


def reference_scores(env_id_or_dataset: Any) -> RefScores:
    """Reference returns for an env id / dataset id / D4RL file name, or a loaded dataset.

    A `DatasetInfo`, `OfflineDataset` or `MinariDataset` with stored references returns those; otherwise
    the D4RL table is looked up by family (`env_family`). Raises `ValueError` naming the input and the known
    families when nothing matches.
    """
    # duck-typed (no import of offline_data.episode, which imports this module: no import circle)
    target = env_id_or_dataset
    names: list[str] = []
    if hasattr(target, "storage") and hasattr(target, "spec"):  # minari.MinariDataset
        meta = target.storage.metadata
        if meta.get("ref_min_score") is not None and meta.get("ref_max_score") is not None:
            return RefScores(float(meta["ref_min_score"]), float(meta["ref_max_score"]))
        spec = target.spec.env_spec
        names = [n for n in (spec.id if spec is not None else None, target.spec.dataset_id) if n]
    elif hasattr(getattr(target, "info", target), "ref_min_score"):  # DatasetInfo, or an OfflineDataset's
        info = getattr(target, "info", target)
        if info.ref_min_score is not None and info.ref_max_score is not None:
            return RefScores(float(info.ref_min_score), float(info.ref_max_score))
        names = [n for n in (info.env_id, info.dataset_id, info.source) if n]
    else:
        names = [str(target)]
    for name in names:
        family = env_family(name)
        if family is not None:
            return D4RL_REF_SCORES[family]
    shown = names[0] if names else repr(target)
    close = difflib.get_close_matches(re.sub(r"-v\d+$", "", shown.lower()), D4RL_REF_SCORES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"no reference scores for {shown!r}: the dataset stores none and no D4RL family "
        f"{sorted(D4RL_REF_SCORES)} appears in its name.{hint} Pass ref_min/ref_max explicitly."
    )
