"""Tests for rl_transformers.logging: TensorBoard scalars/hparams/text, JSONL rows, stdout table, timing."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

import rl_transformers.logging as rl_logging
from rl_transformers.logging import Logger, hparams_markdown, measure_time
from rl_transformers.tags import STANDARD_TAGS


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _events(log_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return acc


def test_tensorboard_scalars_have_tags_steps_and_values(tmp_path: Path) -> None:
    with Logger(tmp_path, stdout=False) as logger:
        logger.record("train/loss", 0.25)
        logger.record_mean("rollout/ep_rew_mean", 1.0)
        logger.record_mean("rollout/ep_rew_mean", 4.0)
        logger.dump(step=128)
        logger.record("train/loss", torch.tensor(-1.5))  # one-element tensors are unwrapped
        logger.record("time/fps", np.int64(900))
        logger.dump(step=256)
    acc = _events(tmp_path)
    assert set(acc.Tags()["scalars"]) == {"train/loss", "rollout/ep_rew_mean", "time/fps"}
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert loss == [(128, 0.25), (256, -1.5)]
    rew = acc.Scalars("rollout/ep_rew_mean")
    assert [(e.step, e.value) for e in rew] == [(128, 2.5)]  # the mean of 1 and 4, only in its window
    assert [(e.step, e.value) for e in acc.Scalars("time/fps")] == [(256, 900.0)]


def test_jsonl_rows_match_records_and_means(tmp_path: Path) -> None:
    logger = Logger(tmp_path, stdout=False, tensorboard=False)
    logger.record("train/learning_rate", 1e-3)
    logger.record("train/learning_rate", 5e-4)  # the last value wins
    for v in (1.0, 2.0, 6.0):
        logger.record_mean("rollout/ep_len_mean", v)
    logger.record_mean("train/value_loss", [0.5, 1.5])  # every element counts
    logger.record_mean("train/value_loss", torch.tensor([2.0]))
    logger.record("time/total_timesteps", 4096)
    written = logger.dump(7)
    logger.record("train/loss", 3.0)
    logger.dump(8)
    assert logger.dump(9) == {}  # nothing recorded: nothing written
    logger.close()
    rows = _read_jsonl(tmp_path / "progress.jsonl")
    assert rows == [
        {
            "step": 7,
            "rollout/ep_len_mean": 3.0,
            "time/total_timesteps": 4096,
            "train/learning_rate": 5e-4,
            "train/value_loss": 4.0 / 3.0,
        },
        {"step": 8, "train/loss": 3.0},  # the window was cleared by the first dump
    ]
    assert written == {k: v for k, v in rows[0].items() if k != "step"}
    assert isinstance(rows[0]["time/total_timesteps"], int)


def test_dump_flushes_jsonl_before_close(tmp_path: Path) -> None:
    logger = Logger(tmp_path, stdout=False, tensorboard=False)
    logger.record("train/loss", 1.0)
    logger.dump(1)
    assert _read_jsonl(tmp_path / "progress.jsonl") == [{"step": 1, "train/loss": 1.0}]
    logger.close()
    logger.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        logger.dump(2)


def test_hparams_entry_and_markdown_table(tmp_path: Path) -> None:
    hparams = {"learning_rate": 3e-4, "backbone": {"n_layers": 2, "attention": "full"}, "seeds": (1, 2)}
    with Logger(tmp_path, stdout=False) as logger:
        logger.log_hparams(hparams, {"rollout/ep_rew_mean": None, "eval/mean_reward": 12.0}, step=5)
        logger.text("notes", "hello")
    acc = _events(tmp_path)
    content = acc.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in content
    assert "_hparams_/experiment" not in content  # TensorBoard derives it from all runs (mixed algorithms)
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["learning_rate"].number_value == pytest.approx(3e-4)
    assert start.hparams["backbone.n_layers"].number_value == 2
    assert start.hparams["backbone.attention"].string_value == "full"
    assert start.hparams["seeds"].string_value == "[1, 2]"
    # a metric with a value and a step is also written as a scalar; one without is only declared
    assert [(e.step, e.value) for e in acc.Scalars("eval/mean_reward")] == [(5, 12.0)]
    assert "rollout/ep_rew_mean" not in acc.Tags()["scalars"]
    table = acc.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert table.splitlines() == [
        "| parameter | value |",
        "|---|---|",
        "| learning_rate | 0.0003 |",
        "| backbone.n_layers | 2 |",
        "| backbone.attention | full |",
        "| seeds | [1, 2] |",
    ]
    assert acc.Tensors("notes/text_summary")[0].tensor_proto.string_val[0] == b"hello"


def test_hparams_markdown_escapes_pipes() -> None:
    assert hparams_markdown({"env": "a|b"}).splitlines()[-1] == "| env | a\\|b |"


def test_stdout_table_and_switch_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Logger(tmp_path / "on", tensorboard=False) as logger:
        logger.record("rollout/ep_rew_mean", 12.5)
        logger.record("train/loss", 0.125)
        logger.record("train/hidden", 7.0, exclude="stdout")
        logger.dump(64)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("---") and lines[-1].startswith("---")
    assert "| step " in lines[1] and "64" in lines[1]
    assert any("rollout/" in line for line in lines)
    assert any("ep_rew_mean" in line and "12.5" in line for line in lines)
    assert any("loss" in line and "0.125" in line for line in lines)
    assert "hidden" not in out
    assert _read_jsonl(tmp_path / "on" / "progress.jsonl")[0]["train/hidden"] == 7.0  # only stdout skipped

    with Logger(tmp_path / "off", stdout=False, tensorboard=False) as logger:
        logger.record("train/loss", 0.125)
        logger.dump(64)
    assert capsys.readouterr().out == ""

    stream = io.StringIO()  # or sent elsewhere
    with Logger(None, stream=stream) as logger:
        logger.record("train/loss", 2.0)
        logger.dump(1)
    assert "loss" in stream.getvalue()


def test_non_finite_values_are_logged_and_reported(tmp_path: Path) -> None:
    with Logger(tmp_path, stdout=False) as logger:
        logger.record("train/loss", float("nan"))
        logger.record_mean("train/grad_norm", [1.0, float("inf")])
        logger.record("train/value_loss", 0.5)
        assert logger.non_finite_keys() == ["train/grad_norm", "train/loss"]
        logger.dump(3)  # no exception
    row = _read_jsonl(tmp_path / "progress.jsonl")[0]
    assert math.isnan(row["train/loss"]) and row["train/grad_norm"] == math.inf
    assert math.isnan(_events(tmp_path).Scalars("train/loss")[0].value)


def test_record_rejects_bad_values_and_outputs(tmp_path: Path) -> None:
    logger = Logger(None, stdout=False)
    with pytest.raises(ValueError, match="record_mean"):
        logger.record("x", torch.zeros(3))
    with pytest.raises(TypeError, match="dict"):
        logger.record("x", {"a": 1})
    with pytest.raises(ValueError, match="valid"):
        logger.record("x", 1.0, exclude="tensorbord")


def test_purge_step_drops_rows_of_the_interrupted_run(tmp_path: Path) -> None:
    with Logger(tmp_path, stdout=False) as logger:
        for step in (10, 20, 30):
            logger.record("train/loss", float(step))
            logger.dump(step)
    # resumed from the checkpoint of step 20: rows from step 21 on are replaced by the continued run
    with Logger(tmp_path, stdout=False, purge_step=21) as logger:
        logger.record("train/loss", -30.0)
        logger.dump(30)
    expected = [(10, 10.0), (20, 20.0), (30, -30.0)]
    assert [(r["step"], r["train/loss"]) for r in _read_jsonl(tmp_path / "progress.jsonl")] == expected
    assert [(e.step, e.value) for e in _events(tmp_path).Scalars("train/loss")] == expected


def test_measure_time_records_elapsed_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 102.5, 200.0, 201.0, 300.0, 303.0, 400.0, 400.25])
    monkeypatch.setattr(rl_logging, "perf_counter", lambda: next(clock))
    logger = Logger(None, stdout=False)
    with measure_time("rollout", logger) as timer:
        pass
    assert timer.elapsed == 2.5
    with logger.measure_time("train/update_s", mean=True):
        pass
    with measure_time("update_s", logger, mean=True) as timer:  # no "/": becomes time/update_s_s
        pass
    assert logger.pending() == {"time/rollout_s": 2.5, "train/update_s": 1.0, "time/update_s_s": 3.0}
    with measure_time("alone") as timer:  # no logger: only measures
        pass
    assert timer.elapsed == 0.25
    assert logger.pending()["time/rollout_s"] == 2.5  # unchanged


def test_standard_tags_use_sb3_names() -> None:
    from rl_transformers import tags

    assert tags.EP_REW_MEAN == "rollout/ep_rew_mean"
    assert tags.FPS == "time/fps"
    assert tags.APPROX_KL == "train/approx_kl"
    with pytest.raises(AttributeError, match="EP_REW_MEAN"):  # the tags live in rl_transformers.tags only
        rl_logging.EP_REW_MEAN  # noqa: B018
    assert all(tag.split("/")[0] in {"rollout", "train", "time", "eval"} for tag in STANDARD_TAGS)


def tensorboard_experiment(logdir: Path) -> tuple[list[str], list[str]]:
    """(hyper-parameter names, metric tags) the TensorBoard HParams dashboard shows for ``--logdir logdir``,
    computed by TensorBoard's own HParams backend over its event multiplexer."""
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context

    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, str(logdir))
    backend = backend_context.Context(
        base_plugin.TBContext(logdir=str(logdir), data_provider=provider, multiplexer=mux)
    )
    ctx = context.RequestContext()
    experiment = backend.experiment_from_metadata(
        ctx, "", True, backend.hparams_metadata(ctx, ""), backend.hparams_from_data_provider(ctx, "", 1000)
    )
    return [h.name for h in experiment.hparam_infos], [m.name.tag for m in experiment.metric_infos]


def _fake_run(run_dir: Path, hparams: dict, scalars: dict[str, float]) -> None:
    with Logger(run_dir, stdout=False) as logger:
        logger.log_hparams(hparams, {k: None for k in scalars})
        for key, value in scalars.items():
            logger.record(key, value)
        logger.dump(1)


def test_mixed_logdir_shows_every_algorithms_hparams_and_metrics(tmp_path: Path) -> None:
    _fake_run(tmp_path / "ppo" / "a", {"ppo": {"learning_rate": 3e-4}}, {"rollout/ep_rew_mean": 1.0})
    _fake_run(tmp_path / "dt" / "b", {"dataset": "x.hdf5"}, {"eval/return_mean": 2.0})
    names, metrics = tensorboard_experiment(tmp_path)
    assert {"ppo.learning_rate", "dataset"} <= set(names)
    assert {"rollout/ep_rew_mean", "eval/return_mean"} <= set(metrics)

    # The old layout (an experiment definition in every run) hid one algorithm: the check above would fail.
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    old = tmp_path / "old"
    for name, hp, metric in (
        ("ppo", {"lr": 1.0}, "rollout/ep_rew_mean"),
        ("dt", {"ds": "x"}, "eval/return_mean"),
    ):
        with SummaryWriter(str(old / name)) as writer:
            for summary in hparams_summary(hp, {metric: 0.0}):
                writer._get_file_writer().add_summary(summary)
            writer.add_scalar(metric, 1.0, 1)
    _, old_metrics = tensorboard_experiment(old)
    assert len(set(old_metrics) & {"rollout/ep_rew_mean", "eval/return_mean"}) == 1
