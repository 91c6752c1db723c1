"""Learning curves as small multiples: panels per family, references in every panel, distinct styles."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_transformers.study import plots

FAMILIES = {"gtrxl": "default", **{f"att{i}": "attention" for i in range(13)}, "knn": "memory",
            "gru": "baseline", "lstm": "baseline", "mlp": "baseline"}  # fmt: skip


def test_panels_follow_the_families_and_split_the_large_ones_evenly() -> None:
    got = plots.panels([*sorted(FAMILIES), "new"], FAMILIES, ("gru", "lstm", "mlp"))
    assert [t for t, _ in got] == ["default", "attention (1/3)", "attention (2/3)", "attention (3/3)", "memory",
                                   "other"]  # fmt: skip
    assert [len(m) for _, m in got] == [1, 5, 4, 4, 1, 1]  # 13 split as evenly as 3 panels of <= 6 allow
    members = [n for _, m in got for n in m]
    assert sorted(members) == sorted(
        set(FAMILIES) - {"gru", "lstm", "mlp"} | {"new"}
    )  # each once, no reference
    assert all(len(m) <= plots.PANEL_SIZE for _, m in got)


def test_no_two_lines_of_a_panel_look_alike() -> None:
    members = [f"e{i}" for i in range(plots.PANEL_SIZE)]
    styles = plots.panel_styles(members)
    pairs = [(c, s) for c, s, _ in styles.values()]
    refs = [plots.REFERENCE_STYLE[n][:2] for n in ("gru", "lstm", "mlp")]
    assert len(set(pairs + refs)) == len(pairs) + len(refs)
    assert len({c for c, _ in pairs}) == len(pairs)  # colours alone tell them apart
    assert not {c for c, _ in pairs} & {c for c, _ in refs}
    with pytest.raises(ValueError, match="at most"):
        plots.panel_styles([f"e{i}" for i in range(len(plots.COLOURS) + 1)])


def test_curves_figure_draws_the_references_in_every_panel(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    records = [{"algo": "ppo", "task": "T", "encoder_name": n, "seed": s, "curve": [[1000.0, 0.1 * s], [2000.0, 0.5]]}
               for n in FAMILIES for s in (0, 1)]  # fmt: skip
    seen: list = []
    original = plots._save

    def keep(fig, path, dpi):
        seen.append([[line.get_label() for line in ax.get_lines()] for ax in fig.axes if ax.get_visible()])
        return original(fig, path, dpi)

    plots._save, saved = keep, plots._save
    try:
        name = plots.plot_curves(records, "T", FAMILIES, tmp_path)
    finally:
        plots._save = saved
    assert (tmp_path / name).is_file() and name == "curves_T.png"
    [axes] = seen
    assert len(axes) == 5
    for labels in axes:
        assert labels[:3] == ["gru (n=2)", "lstm (n=2)", "mlp (n=2)"]
    assert plots.mean_curve([[[1.0, 0.0], [2.0, 1.0]], [[1.0, 1.0], [2.0, 1.0]]]) == ([1.0, 2.0], [0.5, 1.0])
