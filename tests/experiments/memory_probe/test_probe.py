"""The supervised memory probe: its data, its use of the policy's acting / training path, the grid's stop rule,
resume and dry run, and the documents."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from experiments.memory_probe.grid import (
    ProbeConfig,
    cells_of,
    estimate,
    plan_rows,
    run_grid,
)
from experiments.memory_probe.probe import (
    CellResult,
    ProbeSettings,
    SymbolStreams,
    build_policy,
    collect,
    episode_lengths,
    window_batches,
)
from experiments.memory_probe.restore import restore_cells
from rl_transformers.study.encoders import Encoder
from rl_transformers.study.flags import changed, configure
from rl_transformers.utils.errors import UserError

TINY = "attention=full;position=rope;memory=None;d_model=16;n_heads=2;n_layers=1"
LEARN = ProbeSettings(n_symbols=4, n_streams=8, seq_len=8, windows=2, updates=100, learning_rate=1e-2)


def test_streams_targets_are_the_symbol_k_steps_back_in_the_same_episode() -> None:
    k = 3
    settings = ProbeSettings(n_symbols=5, n_streams=4, seq_len=4)
    streams = SymbolStreams(k, settings, np.random.default_rng(0))
    parts = [streams.rollout(16) for _ in range(5)]  # several rollouts: the stream carries over
    obs = torch.cat([p[0] for p in parts]).numpy()
    starts = torch.cat([p[1] for p in parts]).numpy()
    targets = torch.cat([p[2] for p in parts]).numpy()
    lo, hi = episode_lengths(k, settings.seq_len)
    for b in range(settings.n_streams):
        begin = np.flatnonzero(starts[:, b])
        assert begin[0] == 0
        for s, e in zip(begin, [*begin[1:], len(obs)]):
            if e < len(obs):
                assert lo <= e - s <= hi
            for t in range(s, e):
                expected = obs[t - k, b] if t - s >= k else -1
                assert targets[t, b] == expected


def _reference_gru(policy, obs: torch.Tensor, starts: torch.Tensor) -> list[torch.Tensor]:
    """h before every step (T + 1 entries), by the GRU one step at a time, zeroed at episode starts."""
    rnn = policy.core.rnn
    h = torch.zeros(1, obs.shape[1], rnn.hidden_size)
    hs = [h[0].clone()]
    with torch.no_grad():
        for t in range(obs.shape[0]):
            h = torch.where(starts[t].view(1, -1, 1), torch.zeros_like(h), h)
            x = policy.encode(obs[t]).unsqueeze(1)
            _, h = rnn(x, h)
            hs.append(h[0].clone())
    return hs


def test_gru_state_is_carried_across_windows_and_updates_as_in_ppo() -> None:
    """The state stored at each window start is the GRU's hidden state after the previous step (never reset at
    a window boundary, carried from one rollout to the next, as PPO's rollout stores it), and the training
    pass from it reproduces the acting distribution, which a pass from a zero state does not."""
    torch.manual_seed(0)
    settings = ProbeSettings(n_symbols=4, n_streams=3, seq_len=4, windows=3)
    policy = build_policy("policy=gru;hidden_size=8", settings)
    streams = SymbolStreams(2, settings, np.random.default_rng(1))
    state = policy.initial_state(settings.n_streams)
    rollouts = []
    for _ in range(3):
        rollout, state = collect(policy, streams, state, settings.seq_len, settings.rollout_steps)
        rollouts.append(rollout)
    obs = torch.cat([r.obs for r in rollouts])
    starts = torch.cat([r.starts for r in rollouts])
    ref = _reference_gru(policy, obs, starts)
    steps = settings.rollout_steps
    for i, rollout in enumerate(rollouts):
        for j, stored in enumerate(rollout.states):
            t = i * steps + j * settings.seq_len
            torch.testing.assert_close(stored.h[:, 0], ref[t], atol=1e-5, rtol=0)
            assert not stored.h.requires_grad
        if i > 0:
            assert ref[i * steps].abs().sum() > 0  # a carried state, not a fresh one
    rollout, t0 = rollouts[2], 2 * steps
    with torch.no_grad():
        for w_obs, w_starts, w_targets, w_state in window_batches(rollout, settings.seq_len):
            out = policy.evaluate_sequence(w_obs, w_targets.clamp(min=0), w_state, w_starts)
            zero = policy.evaluate_sequence(
                w_obs, w_targets.clamp(min=0), policy.initial_state(w_obs.shape[0]), w_starts
            )
            assert not torch.allclose(out.log_prob, zero.log_prob, atol=1e-4)
    # the reference distribution of every step of the last rollout, window by window (row j·B + b)
    expected = []
    for j in range(settings.windows):
        rows = []
        for b in range(settings.n_streams):
            hs = torch.stack([ref[t0 + j * settings.seq_len + s + 1][b] for s in range(settings.seq_len)])
            targets = rollout.targets[j * settings.seq_len : (j + 1) * settings.seq_len, b].clamp(min=0)
            rows.append(policy.actor(hs).log_prob(targets))
        expected.append(torch.stack(rows))
    (w_obs, w_starts, w_targets, w_state), *rest = window_batches(rollout, settings.seq_len)
    assert not rest  # equal state shapes: one batch of every window
    with torch.no_grad():
        out = policy.evaluate_sequence(w_obs, w_targets.clamp(min=0), w_state, w_starts)
    torch.testing.assert_close(out.log_prob, torch.cat(expected), atol=1e-5, rtol=0)


def test_a_context_shorter_than_k_fails_and_one_covering_k_succeeds(tmp_path) -> None:
    encoder = Encoder("tiny", TINY + ';attention_options={"max_cache": 2}', "attention")
    cfg = configure(ProbeConfig, out=tmp_path, ks=(4,), seeds=(0,), settings=LEARN)
    rows = plan_rows([encoder], ("default", "cover"))
    assert [(r.bound, r.value(4)) for r in rows] == [("default", 2), ("cover", 5)]
    stopped = run_grid(cfg, rows, log=lambda _: None)
    assert stopped == {"tiny [default]": 4, "tiny [cover]": None}
    short = json.loads(cells_of(rows[0], 4, (0,))[0].path(tmp_path).read_text())
    covering = json.loads(cells_of(rows[1], 4, (0,))[0].path(tmp_path).read_text())
    assert short["updates_to_success"] is None and short["accuracy"] < 0.5  # chance is 0.25
    assert covering["updates_to_success"] is not None and covering["accuracy"] >= LEARN.success


def _stub(succeed_up_to: int, calls: list[tuple[str, int, int]]):
    def measure(spec: str, k: int, seed: int, settings: ProbeSettings) -> CellResult:
        calls.append((spec, k, seed))
        ok = k <= succeed_up_to
        return CellResult(
            spec, k, seed, settings.updates, 1.0 if ok else 0.3, 5 if ok else None, 2.0 + seed, 1.0,
            [0.3, 1.0 if ok else 0.3], 10, True, dataclasses.asdict(settings),
        )  # fmt: skip

    return measure


def test_rows_stop_at_their_first_failing_k_and_the_grid_resumes(tmp_path) -> None:
    encoder = Encoder("tiny", TINY, "attention")  # max_cache defaults to the policy's context_len, 64
    settings = ProbeSettings(updates=3)
    cfg = configure(ProbeConfig, out=tmp_path, ks=(1, 4, 16, 64), seeds=(0, 1), settings=settings)
    rows = plan_rows([encoder], ("default",))
    calls: list[tuple[str, int, int]] = []
    assert run_grid(cfg, rows, _stub(4, calls), log=lambda _: None) == {"tiny [default]": 16}
    assert sorted({k for _, k, _ in calls}) == [1, 4, 16]  # k=64 never runs
    assert len(calls) == 6
    again: list[tuple[str, int, int]] = []
    assert run_grid(cfg, rows, _stub(4, again), log=lambda _: None) == {"tiny [default]": 16}
    assert again == []  # every finished cell is read back, none re-run
    other = configure(ProbeConfig, out=tmp_path, ks=(1,), seeds=(0,), settings=ProbeSettings(updates=4))
    with pytest.raises(UserError, match="other settings"):
        run_grid(other, rows, _stub(4, again), log=lambda _: None)


def test_dry_run_counts_shared_cells_once_and_uses_measured_rates(tmp_path) -> None:
    encoder = Encoder("tiny", TINY, "attention")  # reach knob max_cache, default 64
    cfg = configure(
        ProbeConfig, out=tmp_path, ks=(1, 4, 128), seeds=(0, 1), settings=ProbeSettings(updates=3)
    )
    rows = plan_rows([encoder], ("default", "cover"))
    # default row: 3 k x 2 seeds; cover row: k=1, 4 share the default's cells (64 >= k + 1), k=128 -> 129
    assert "8 cells at most (0 finished, 8 to run" in estimate(cfg, rows)
    run_grid(
        configure(ProbeConfig, out=tmp_path, ks=(1,), seeds=(0, 1), settings=cfg.settings),
        rows[:1],
        _stub(9, []),
    )
    text = estimate(cfg, rows)
    assert "(2 finished, 6 to run" in text
    # the 4 pending cells at max_cache=64 use the measured 2.5 updates/s, the 2 at 129 the same encoder's
    seconds = 6 * (3 + 1) / 2.5
    assert f"({seconds:.0f} s)" in text and "6 from their encoder's measured rates, 0 at the median" in text
    # an encoder with no finished cell takes the median of every finished cell, its peers' included
    fresh = plan_rows([Encoder("fresh", TINY.replace("n_heads=2", "n_heads=4"), "attention")], ("default",))
    text = estimate(cfg, fresh, peers=rows)
    assert (
        "0 from their encoder's measured rates, 6 at the median of the 2 finished cells, 2.50 updates/s"
        in text
    )
    assert f"({6 * (3 + 1) / 2.5:.0f} s)" in text
    assert "6 at the assumed 1 updates/s" in estimate(cfg, fresh)  # nothing measured among its rows


def test_documents_follow_the_cell_results(tmp_path) -> None:
    from experiments.memory_probe import report as probe_report

    encoder = Encoder("tiny", TINY, "attention")
    cfg = configure(
        ProbeConfig, out=tmp_path / "cells", ks=(1, 4, 16), seeds=(0, 1), settings=ProbeSettings(updates=3)
    )
    rows = plan_rows([encoder], ("default",))
    run_grid(cfg, rows, _stub(1, []), log=lambda _: None)
    report = probe_report.build(cfg, rows, "python -m experiments.memory_probe.run --test")
    by_k = report["rows"][0]["by_k"]
    assert by_k["1"]["accuracy_mean"] == 1.0 and by_k["1"]["median_updates_to_success"] == 5
    assert by_k["4"]["accuracy_mean"] == pytest.approx(0.3) and by_k["4"]["updates_to_success"] == [
        None,
        None,
    ]
    assert by_k["16"]["status"] == "stopped" and report["rows"][0]["stopped_at"] == 4
    assert len(report["cells"]) == 4
    paths = probe_report.write(report, tmp_path / "docs")
    text = paths[1].read_text()
    assert "| tiny | max_cache=64 | 1.00 (5; 2/2) | 0.30 | stopped | 2.50 |" in text
    assert "**Status**: complete: all 1 encoders, each row run up to its first failing k; every row stopped by " \
        "k = 16." in text  # fmt: skip
    assert json.loads(paths[0].read_text())["rows"][0]["stopped_at"] == 4
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_cell_equal_to_an_earlier_rows_on_its_first_seed_is_marked_and_its_other_seeds_not_run(
    tmp_path,
) -> None:
    """Rows that are the same model under two names (``local`` = ``full``) are marked, not re-run;
    checked per k (``other`` equals ``first`` at k = 1 and 4 only, as a sparse pattern may over short episodes)."""
    from experiments.encoder_study.sections import probe_lines
    from experiments.memory_probe import report as probe_report

    def measure(spec: str, k: int, seed: int, settings: ProbeSettings) -> CellResult:
        calls.append((spec, k, seed))
        curve = [0.3, 0.9 if "n_heads=4" in spec and k == 16 else 1.0]
        return CellResult(spec, k, seed, settings.updates, curve[-1], 5, 2.0, 1.0, curve, 10, True,
                          dataclasses.asdict(settings))  # fmt: skip

    first = Encoder("first", TINY, "attention")
    twin = Encoder("twin", TINY + ";d_ff=64", "attention")
    other = Encoder("other", TINY.replace("n_heads=2", "n_heads=4"), "attention")
    cfg = configure(
        ProbeConfig, out=tmp_path / "cells", ks=(1, 4, 16), seeds=(0, 1), settings=ProbeSettings(updates=3)
    )
    rows = plan_rows([first, twin, other], ("default",))
    calls: list[tuple[str, int, int]] = []
    assert run_grid(cfg, rows, measure, log=lambda _: None) == dict.fromkeys(r.name for r in rows)
    assert [(k, seed) for spec, k, seed in calls if spec == twin.spec] == [(1, 0), (4, 0), (16, 0)]
    assert [(k, seed) for spec, k, seed in calls if spec == other.spec] == [(1, 0), (4, 0), (16, 0), (16, 1)]
    calls.clear()
    run_grid(cfg, rows, measure, log=lambda _: None)
    assert calls == []  # a resumed grid runs none of the skipped seeds either
    report = probe_report.build(cfg, rows, "python -m experiments.memory_probe.run --test")
    summary = {r["encoder"]: r for r in report["rows"]}
    assert summary["twin"]["repeats"] == "first [default]"
    assert summary["other"]["repeats"] is None and summary["first"]["repeats"] is None
    assert [summary["other"]["by_k"][k].get("repeat_of") for k in ("1", "4", "16")] == [
        "first [default]"
    ] * 2 + [None]
    assert summary["twin"]["by_k"]["16"]["status"] == "done" and summary["twin"]["by_k"]["16"]["seeds"] == [
        0,
        1,
    ]
    text = probe_report.write(report, tmp_path / "docs")[1].read_text()
    same = "1.00 (5; 2/2) = first"
    assert f"| twin (= first) | max_cache=64 | {same} | {same} | {same} | 2.00 |" in text
    assert f"| other | max_cache=64 | {same} | {same} | 0.90 (5; 2/2) | 2.00 |" in text
    assert "**Repeated cells** (other = first, twin = first)" in text
    table = "\n".join(probe_lines(tmp_path / "docs"))
    assert "| `twin` | max_cache | = `first` (the same model) |" in table
    assert "| `other` | max_cache | 16 |" in table
    # a fresh checkout, from the committed documents' thinned curves, finds the same repeats
    fresh = changed(cfg, out=tmp_path / "restored")
    assert restore_cells(fresh, rows, tmp_path / "docs" / "memory_probe.json") == 6 + 3 + 4
    assert (
        probe_report.build(fresh, rows, "python -m experiments.memory_probe.run --test")["rows"]
        == report["rows"]
    )
    # a run of some encoders (python -m experiments.memory_probe.run --encoders twin) finds the rows they repeat among all
    alone = changed(cfg, out=tmp_path / "alone")
    run_grid(alone, rows[:1], measure, log=lambda _: None)
    calls.clear()
    run_grid(alone, rows[1:2], measure, log=lambda _: None, peers=rows)
    assert [(k, seed) for _, k, seed in calls] == [(1, 0), (4, 0), (16, 0)]


def test_the_status_line_says_which_encoders_are_left_and_which_rows_the_grid_stopped(tmp_path) -> None:
    """The documents say how complete the grid is themselves: encoders with cells left (from which k), or, when
    complete, the rows that still recalled the largest k (stopped by the grid, not by failing)."""
    from experiments.memory_probe import report as probe_report

    short, long = Encoder("short", TINY, "attention"), Encoder("long", TINY + ";d_ff=64", "attention")
    cfg = configure(ProbeConfig, out=tmp_path, ks=(1, 4, 16), seeds=(0, 1), settings=ProbeSettings(updates=3))
    rows = plan_rows([short, long], ("default",))
    run_grid(cfg, rows[:1], _stub(1, []), log=lambda _: None)  # short fails k = 4: complete
    run_grid(dataclasses.replace(cfg, ks=(1, 4)), rows[1:], _stub(99, []), log=lambda _: None)
    line = probe_report.status(probe_report.build(cfg, rows, "cmd"))
    assert line == "**Status**: partial: 1 of 2 encoders complete; still to run: long (from k = 16)."
    run_grid(cfg, rows[1:], _stub(99, []), log=lambda _: None)
    line = probe_report.status(probe_report.build(cfg, rows, "cmd"))
    assert line.endswith("still recalling at k = 16, where the grid ends: long [default].")
    assert line.startswith("**Status**: complete: all 2 encoders")


def test_the_probe_takes_the_shared_study_flags_and_refuses_the_ones_it_cannot_honour(tmp_path) -> None:
    """--out, --seeds, --dry-run ... are the study's shared flags (no prefix); more than one worker or a per-run
    timeout cannot apply to cells measured in this process, so they are refused with the way to get them."""
    import tyro

    cfg = tyro.cli(ProbeConfig, args=["--out", str(tmp_path), "--seeds", "3", "4", "--dry-run", "--ks", "1"])
    assert (cfg.out, cfg.seeds, cfg.flags.dry_run, cfg.ks) == (tmp_path, (3, 4), True, (1,))
    assert configure(ProbeConfig).seeds == (0, 1, 2)  # the probe's own default
    with pytest.raises(UserError, match="disjoint --encoders") as err:
        configure(ProbeConfig, workers=2)
    assert err.value.source == "--workers"
    with pytest.raises(UserError, match="--stop-starting-after-h") as err:
        configure(ProbeConfig, timeout_s=60.0)
    assert err.value.source == "--timeout-s"


def test_no_cell_starts_past_the_start_limit_and_the_next_invocation_resumes(tmp_path) -> None:
    import time

    cfg = configure(ProbeConfig, out=tmp_path, ks=(1, 4), seeds=(0, 1), settings=ProbeSettings(updates=3))
    rows = plan_rows([Encoder("tiny", TINY, "attention")], ("default",))
    calls: list[tuple[str, int, int]] = []
    run_grid(cfg, rows, _stub(9, calls), log=lambda _: None, start_by=time.time() - 1)
    assert calls == [] and not any(tmp_path.rglob("*.json"))
    run_grid(cfg, rows, _stub(9, calls), log=lambda _: None, start_by=time.time() + 3600)
    assert [(k, s) for _, k, s in calls] == [(1, 0), (1, 1), (4, 0), (4, 1)]


def test_documents_that_would_drop_committed_cells_are_refused(tmp_path) -> None:
    """A run over part of the grid (or with other settings) must not overwrite committed documents with fewer
    cells; the same cells, or more, are fine; without a committed file (--no-restore) nothing is checked."""
    from experiments.memory_probe.restore import check_nothing_lost

    cell = {"encoder": "gtrxl", "spec": "s", "k": 1, "seed": 0}
    committed = tmp_path / "memory_probe.json"
    committed.write_text(json.dumps({"cells": [cell, {**cell, "seed": 1}]}))
    check_nothing_lost({"cells": [{**cell, "seed": 1}, cell, {**cell, "k": 4}]}, committed)
    with pytest.raises(UserError, match=r"1 of the 2 committed ones would be lost \(e.g. gtrxl/s/1/1\)"):
        check_nothing_lost({"cells": [cell]}, committed)
    check_nothing_lost({"cells": []}, None)
    check_nothing_lost({"cells": []}, tmp_path / "absent.json")
