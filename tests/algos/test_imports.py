"""The algos package imports lazily: the offline trainer does not pull the online one."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rl_transformers.algos as algos


def test_dt_import_does_not_import_ppo() -> None:
    code = "import sys, rl_transformers.algos.dt; print('rl_transformers.algos.ppo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_lazy_names_resolve_and_unknown_names_fail() -> None:
    from rl_transformers.algos.storage import compute_gae

    assert algos.compute_gae is compute_gae
    assert sorted(algos.__all__) == sorted(algos._EXPORTS)
    assert all(callable(getattr(algos, name)) for name in algos.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        algos.nope  # noqa: B018
