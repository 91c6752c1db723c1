"""The algos package exports no names, so the offline trainer does not pull the online one."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rl_transformers.algos as algos


def test_dt_import_does_not_import_ppo() -> None:
    code = "import sys, rl_transformers.algos.dt; print('rl_transformers.algos.ppo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_package_exports_no_names() -> None:
    """Each name is imported from the module that defines it; the package's former lazy names (``from
    rl_transformers.algos import PPOConfig``) are an ImportError naming the name, not a silent alias."""
    from rl_transformers.algos.storage import compute_gae

    assert callable(compute_gae)
    assert not hasattr(algos, "__all__") and not hasattr(algos, "__getattr__")
    for name in ("PPOConfig", "TrainConfig", "PPOTrainer", "TrainResult", "train", "compute_gae"):
        with pytest.raises(ImportError, match=f"cannot import name '{name}'"):
            exec(f"from rl_transformers.algos import {name}", {})
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        algos.nope  # noqa: B018
