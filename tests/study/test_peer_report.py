"""The comparison page from hand-built records: the exact permutation test against scipy's, Holm by hand, the
IQM against rliable called directly, and a byte-for-byte rebuild at another path."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from rl_transformers.study.peer_report import (
    exact_permutation_p,
    holm,
    load_records,
    render,
    replace_block,
    return_digits,
    summarise,
    table,
)

pytest.importorskip("rliable")


def _records(root: Path, arm: str, means: list[float], steps: int = 1000, cpu: float = 2.0) -> None:
    for seed, mean in enumerate(means):
        record = {"arm": arm, "seed": seed, "returns": [mean - 1, mean + 1], "total_timesteps": steps}
        record |= {"cpu_seconds": cpu, "parameters": 10, "git_sha": "abcdef0123"}
        (root / arm).mkdir(parents=True, exist_ok=True)
        (root / arm / f"s{seed}.json").write_text(json.dumps(record))


def test_exact_permutation_p_equals_scipy() -> None:
    from scipy.stats import permutation_test

    a, b = [500.0, 480.0, 500.0, 490.0], [300.0, 500.0, 200.0, 250.0, 410.0]
    ref = permutation_test(  # the |difference in means| statistic: a two-sided test as one tail
        (a, b),
        lambda x, y: abs(np.mean(x) - np.mean(y)),
        permutation_type="independent",
        n_resamples=np.inf,
        alternative="greater",
    )
    assert exact_permutation_p(a, b) == pytest.approx(ref.pvalue)
    assert exact_permutation_p([1.0, 2.0], [1.0, 2.0]) == 1.0
    # complete separation of 3 against 3: 2 of the 20 splits are as extreme
    assert exact_permutation_p([9.0, 8.0, 7.0], [1.0, 2.0, 3.0]) == pytest.approx(0.1)
    # POPGym's scores: means of float episode returns, 1 + 7e-16 where the episode was perfect, many decimals
    # elsewhere; the observed split itself always counts, whatever the rounding of the sums
    a = [1.0000000000000007] * 6
    b = [0.5958333333333333, 0.635, 0.6675, 0.6741666666666667, 0.8891666666666671]
    for x, y in ((a, b), (b, a)):  # the table's order is (arm, reference)
        assert exact_permutation_p(x, y) == pytest.approx(1 / math.comb(11, 5))  # only the observed split
        assert exact_permutation_p(x, y) == pytest.approx(_every_split_p(x, y))


def test_holm_by_hand() -> None:
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "c": 0.06, "b": 0.06})
    assert holm({"a": 0.6, "b": 0.9}) == pytest.approx({"a": 1.0, "b": 1.0})


def test_iqm_equals_rliable(tmp_path: Path) -> None:
    from rliable import metrics

    means = [500.0, 120.0, 480.0, 300.0, 499.0, 10.0, 450.0, 470.0]
    _records(tmp_path, "x", means)
    summary = summarise(load_records(tmp_path))["x"]
    assert summary.iqm[0] == pytest.approx(metrics.aggregate_iqm(np.array(means)[:, None]))
    assert summary.iqm[1] <= summary.iqm[0] <= summary.iqm[2]
    assert summary.steps_per_cpu_s == 500.0 and summary.commits == ["abcdef0"]


def test_page_rebuilds_byte_for_byte_elsewhere(tmp_path: Path) -> None:
    _records(tmp_path / "a" / "records", "peer", [500.0, 500.0, 499.0])
    _records(tmp_path / "a" / "records", "lstm", [500.0, 200.0, 480.0])
    page = render(tmp_path / "a" / "records", 475.0, "peer", "# Title\n\nText.\n")
    assert "| lstm | 10 | 3 | 500 / 200 / 480 | 2 of 3 |" in page and "| peer |" in page
    compact = "\n".join(
        table(summarise(load_records(tmp_path / "a" / "records")), 475.0, "peer", compact=True)
    )
    assert "| lstm | 3 | 2 of 3 |" in compact and "CPU" not in compact and "500 / 200" not in compact
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert render(tmp_path / "b" / "records", 475.0, "peer", "# Title\n\nText.\n") == page


def test_readme_block() -> None:
    text = "intro\n<!-- learning:start -->\nold\n<!-- learning:end -->\noutro\n"
    assert (
        replace_block(text, "learning", "new")
        == "intro\n<!-- learning:start -->\nnew\n<!-- learning:end -->\noutro\n"
    )
    with pytest.raises(ValueError, match="no <!-- other:start -->"):
        replace_block(text, "other", "x")


def test_provenance_file_fills_older_records(tmp_path: Path) -> None:
    _records(tmp_path, "old", [500.0, 480.0])
    for path in (tmp_path / "old").glob("s*.json"):
        record = json.loads(path.read_text())
        del record["git_sha"]
        path.write_text(json.dumps(record))
    assert summarise(load_records(tmp_path))["old"].commits == ["?"]
    (tmp_path / "old" / "provenance.json").write_text(json.dumps({"git_sha": "1234567abc", "machine": "x"}))
    assert summarise(load_records(tmp_path))["old"].commits == ["1234567"]
    _records(tmp_path, "new", [1.0])  # a record's own commit wins over the file
    (tmp_path / "new" / "provenance.json").write_text(json.dumps({"git_sha": "fffffff"}))
    assert summarise(load_records(tmp_path))["new"].commits == ["abcdef0"]


def test_committed_page_and_readme_table_rebuild_from_the_records() -> None:
    """docs/results/learning.md and the README's table are what the committed records give, byte for byte."""
    repo = Path(__file__).resolve().parents[2]
    experiment = repo / "experiments" / "peer_cartpole_novel"
    preamble = (experiment / "preamble.md").read_text(encoding="utf-8")
    page = render(experiment / "records", 475.0, "peer", preamble)
    assert (repo / "docs" / "results" / "learning.md").read_text(encoding="utf-8") == page
    rows = "\n".join(table(summarise(load_records(experiment / "records")), 475.0, "peer", compact=True))
    readme = (repo / "README.md").read_text(encoding="utf-8")
    assert replace_block(readme, "learning", rows) == readme


def _every_split_p(a: list[float], b: list[float]) -> float:
    """The definition, split by split (small samples only)."""
    pooled, n = [*a, *b], len(a)
    observed, extreme, count = abs(np.mean(a) - np.mean(b)), 0, 0
    for idx in itertools.combinations(range(len(pooled)), n):
        x = [pooled[i] for i in idx]
        y = [pooled[i] for i in range(len(pooled)) if i not in idx]
        extreme += int(abs(np.mean(x) - np.mean(y)) >= observed - 1e-12)
        count += 1
    return extreme / count


def test_exact_permutation_p_counts_tied_values_as_every_split_does() -> None:
    rng = np.random.default_rng(0)
    for _ in range(25):
        n, m = int(rng.integers(2, 7)), int(rng.integers(2, 7))
        a = [float(v) for v in rng.choice([1.0, 2.5, 3.0, 500.0], size=n)]
        b = [float(v) for v in rng.choice([1.0, 2.5, 3.0, 500.0, 7.25], size=m)]
        assert exact_permutation_p(a, b) == pytest.approx(_every_split_p(a, b))


def test_exact_permutation_p_at_twenty_seeds_each() -> None:
    """Complete separation of 20 against 20: only the observed split and its mirror are as extreme."""
    assert exact_permutation_p([500.0] * 20, [200.0] * 20) == pytest.approx(2 / math.comb(40, 20))
    assert exact_permutation_p([500.0] * 18 + [210.0, 470.0], [500.0] * 17 + [251.0, 205.0, 498.0]) > 0.5


def test_digits_for_scores_on_minus_one_to_one(tmp_path: Path) -> None:
    """POPGym's scores lie in [-1, 1]: with digits=2 the per-seed values keep two decimals and the IQM three,
    and the solved count reads the threshold 0.9 on the unrounded means."""
    _records(tmp_path, "gtrxl", [0.954, 0.8996, -0.5])
    rows = table(summarise(load_records(tmp_path)), 0.9, None, digits=2)
    row = next(r for r in rows if r.startswith("| gtrxl |"))
    assert "| 0.95 / 0.90 / -0.50 | 1 of 3 |" in row
    iqm = summarise(load_records(tmp_path))["gtrxl"].iqm
    assert f"| {iqm[0]:.3f} [{iqm[1]:.3f}, {iqm[2]:.3f}] |" in row


def test_default_digits_follow_the_scale_of_the_returns(tmp_path: Path) -> None:
    """Without ``digits`` the table shows POPGym's [-1, 1] scores with two decimals (whole numbers would print
    them as 1 / -0) and CartPole's returns as whole numbers."""
    _records(tmp_path / "popgym", "gtrxl", [0.954, -0.5])
    popgym = summarise(load_records(tmp_path / "popgym"))
    assert return_digits(popgym) == 2
    assert "| 0.95 / -0.50 |" in next(r for r in table(popgym, 0.9, None) if r.startswith("| gtrxl |"))
    _records(tmp_path / "cartpole", "lstm", [500.0, 228.4, 0.5])
    cartpole = summarise(load_records(tmp_path / "cartpole"))
    assert return_digits(cartpole) == 0
    assert "| 500 / 228 / 0 |" in next(r for r in table(cartpole, 475, None) if r.startswith("| lstm |"))


def test_speed_of_a_resumed_run_counts_its_last_stretch(tmp_path: Path) -> None:
    """A resumed record's CPU seconds cover the env steps since its last resume (``cpu_steps``), not the whole
    budget: 1,000 steps in 2 s and 250 steps in 1 s are 500 and 250 steps per CPU-second."""
    _records(tmp_path, "a", [1.0, 2.0])
    resumed = json.loads((tmp_path / "a" / "s1.json").read_text())
    resumed |= {"resumed_at": [750], "cpu_steps": 250, "cpu_seconds": 1.0}
    (tmp_path / "a" / "s1.json").write_text(json.dumps(resumed))
    assert summarise(load_records(tmp_path))["a"].steps_per_cpu_s == pytest.approx((500 + 250) / 2)
