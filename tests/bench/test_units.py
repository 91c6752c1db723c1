"""Harness pieces with hand-computed answers: timing loop, CUDA clock control flow, FLOPs, crossover, estimates."""

from __future__ import annotations

import types

import pytest

from rl_transformers.bench.config import BenchConfig, Shape
from rl_transformers.bench.memory import Extrapolator
from rl_transformers.bench.report import crossovers
from rl_transformers.bench.rows import flops
from rl_transformers.bench.timing import CpuClock, CudaClock, RepeatPolicy, quantile, time_interleaved


class FakeClock:
    """Returns a fixed per-call duration per function and records the order of timed calls."""

    def __init__(self, durations: dict[str, float]) -> None:
        self.durations = durations
        self.order: list[tuple[str, int]] = []

    def time(self, fn, n: int) -> float:
        name = fn()
        self.order.append((name, n))
        return self.durations[name] * n


def test_round_robin_early_stop_and_loop_calibration() -> None:
    fns = {name: (lambda name=name: name) for name in ("a", "b", "slow")}
    clock = FakeClock({"a": 0.001, "b": 0.004, "slow": 3.0})
    policy = RepeatPolicy(warmup=2, repeats=4, slow_repeat_s=2.0, slow_repeats=2, min_repeat_s=0.01)
    timings = time_interleaved(fns, policy, clock)
    assert timings["a"].loops == 11 and timings["b"].loops == 3 and timings["slow"].loops == 1  # >= 0.01 s
    assert [len(timings[n].samples) for n in ("a", "b", "slow")] == [4, 4, 2]
    assert timings["slow"].early_stop and not timings["a"].early_stop
    assert timings["a"].median == pytest.approx(0.001) and timings["a"].iqr == pytest.approx(0.0, abs=1e-15)
    repeats = [name for name, n in clock.order if n == timings[name].loops and (name != "slow" or n == 1)]
    # warm-up of slow stops after one call (3 s > slow_repeat_s); then rounds a b slow | b slow a | a b | b a
    timed = [name for name, _ in clock.order[-10:]]
    assert timed == ["a", "b", "slow", "b", "slow", "a", "a", "b", "b", "a"]
    assert repeats


def test_errors_are_recorded_not_raised() -> None:
    def boom() -> None:
        raise RuntimeError("kernel exploded")

    timings = time_interleaved({"ok": lambda: None, "bad": boom}, RepeatPolicy(repeats=2, min_repeat_s=0.0))
    assert timings["bad"].error == "RuntimeError: kernel exploded" and not timings["bad"].samples
    assert len(timings["ok"].samples) == 2


def test_quantiles_match_numpy_linear() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0]
    assert quantile(values, 0.25) == pytest.approx(2.25)
    assert quantile(values, 0.75) == pytest.approx(4.75)
    assert quantile([7.0], 0.25) == 7.0


def test_cuda_clock_synchronises_around_events() -> None:
    log: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.t = None

        def record(self) -> None:
            log.append("record")
            self.t = len(log)

        def elapsed_time(self, other: Event) -> float:
            return 250.0 * (other.t - self.t)  # ms

    clock = CudaClock(event_cls=Event, synchronize=lambda: log.append("sync"))
    seconds = clock.time(lambda: log.append("call"), 3)
    assert log == ["sync", "record", "call", "call", "call", "record", "sync"]
    assert seconds == pytest.approx(1.0)  # 4 log entries apart * 250 ms


def test_cpu_clock_times_the_n_calls_between_two_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_transformers.bench import timing

    ticks = iter([10.0, 12.5])  # perf_counter before and after the calls
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    calls: list[int] = []
    assert CpuClock().time(lambda: calls.append(1), 5) == 2.5 and len(calls) == 5


def test_flop_formula() -> None:
    s = Shape(batch=2, heads=4, d_head=64, length=1024)
    attn = 4 * 2 * 4 * 1024**2 * 64
    assert flops("kernel", "forward", s, causal=False, n_layers=2) == attn
    assert flops("kernel", "forward", s, causal=True, n_layers=2) == attn / 2
    assert flops("kernel", "backward", s, causal=True, n_layers=2) == 3.5 * attn / 2
    assert flops("kernel", "step", s, causal=True, n_layers=2) == 4 * 2 * 4 * 1025 * 64
    d = 256
    assert flops("layer", "forward", s, causal=True, n_layers=2) == attn / 2 + 8 * 2 * 1024 * d * d
    assert flops("model", "backward", s, causal=True, n_layers=2) == 2 * (
        3.5 * attn / 2 + 3 * 24 * 2 * 1024 * d * d
    )


def _row(variant: str, length: int, time_ms: float | None, kind: str = "ours", spread: float = 0.02) -> dict:
    base = 10.0  # SDPA takes 10 ms at every length (IQR 9.8 .. 10.2)
    timed = time_ms is not None
    return dict(
        variant=variant, kind=kind, position="none", target="kernel", mode="forward", causal=True, batch=2,
        heads=4, d_head=64, length=length, time_ms=time_ms, compiled=False,
        time_ms_q1=time_ms * (1 - spread) if timed else None, time_ms_q3=time_ms * (1 + spread) if timed else None,
        ratio_sdpa=None if not timed or length == 65536 else (1.0 if kind == "sdpa" else time_ms / base),
    )  # fmt: skip


def test_crossover_is_the_first_length_from_which_the_variant_always_wins() -> None:
    rows = [_row("sdpa", n, 10.0, kind="sdpa") for n in (256, 1024, 4096, 16384)]
    rows += [_row("sdpa", 65536, None, kind="sdpa")]
    rows += [_row("v", n, t) for n, t in ((256, 20.0), (1024, 15.0), (4096, 8.0), (16384, 5.0), (65536, 9.0))]
    rows += [_row("w", n, t) for n, t in ((256, 9.0), (1024, 12.0), (4096, 11.0))]
    rows += [
        _row("tie", n, t, spread=0.05) for n, t in ((256, 9.7), (1024, 9.6))
    ]  # medians below, IQRs overlap
    got = {c["variant"]: c for c in crossovers(rows)}
    assert set(got) == {"v", "w", "tie"}
    assert got["v"]["crossover"] == 4096 and got["v"]["wins_at"] == [4096, 16384]
    # log-linear crossing of ratio 1 between (1024, 1.5) and (4096, 0.8): 1024 * 4 ** (log 1.5 / log(1.5 / 0.8))
    assert got["v"]["crossover_interp"] == pytest.approx(2504.04, abs=0.01)
    assert got["v"]["runs_where_sdpa_skipped"] == [65536]
    assert got["w"]["crossover"] is None and got["w"]["wins_at"] == [256]  # wins at 256, loses afterwards
    assert got["tie"]["crossover"] is None and got["tie"]["verdicts"] == {"256": "tie", "1024": "tie"}


def test_extrapolation_is_power_law_with_clamped_slope() -> None:
    ex = Extrapolator()
    key = "k"
    ex.add(key, Shape(2, 4, 64, 256), 10.0)
    assert ex.predict(key, Shape(2, 4, 64, 256)) is None  # nothing shorter
    assert ex.predict(key, Shape(2, 4, 64, 1024)) == pytest.approx(160.0)  # one point: slope 2
    ex.add(key, Shape(2, 4, 64, 1024), 40.0)  # slope 1
    assert ex.predict(key, Shape(4, 4, 64, 4096)) == pytest.approx(40.0 * 4 * 2)  # linear in B
    ex.add(key, Shape(2, 4, 64, 4096), 41.0)  # slope < 1 clamped to 1
    assert ex.predict(key, Shape(2, 4, 64, 16384)) == pytest.approx(164.0)


def test_config_defaults_and_validation() -> None:
    gpu = BenchConfig().shapes(gpu=True)
    assert {s.d_head for s in gpu} == {64, 128} and all(s.width == 2048 for s in gpu)
    assert max(s.length for s in gpu) == 65536 and all(
        s.batch * s.length == 16384 for s in gpu if s.length <= 16384
    )
    cpu = BenchConfig().shapes(gpu=False)
    assert [(s.batch, s.heads, s.d_head, s.length) for s in cpu] == [
        (2, 4, 64, n) for n in (256, 1024, 4096, 16384)
    ]
    rc = BenchConfig(device="cpu", quick=True).resolve()
    assert rc.targets == ("kernel",) and rc.repeats == 5 and rc.dtype_name == "float32"
    with pytest.raises(ValueError, match="Did you mean 'backward'"):
        BenchConfig(modes=("backwards",))
    with pytest.raises(ValueError, match="attention_options"):
        BenchConfig(attention_options='["local"]')


def test_peers_computing_another_operator_are_labelled() -> None:
    from rl_transformers.bench.config import BenchConfig
    from rl_transformers.bench.ops import Impl
    from rl_transformers.bench.peers import PEERS
    from rl_transformers.bench.rows import base_row

    rc = BenchConfig(lengths=(256,), measure_memory=False, progress=False).resolve()
    shape = Shape(1, 2, 8, 256)
    labelled = {}
    for peer in PEERS:
        impl = Impl(f"peer:{peer.name}", "peer", exact=peer.exact, streaming="none", peer=peer)
        for causal in (True, False):
            row = base_row(rc, impl, impl.name, "none", "kernel", "forward", shape, causal, 0.0)
            labelled[peer.name, causal] = "different operator" in row["note"]
    assert labelled["linear-attention-transformer", True]  # bucketed causal path: first bucket outputs 0
    assert not labelled["linear-attention-transformer", False]
    assert not any(v for (name, _), v in labelled.items() if name != "linear-attention-transformer")


def test_gate_length_for_rows_too_long_or_too_big_to_check() -> None:
    from rl_transformers.bench.gate import Gatekeeper

    rc = BenchConfig(lengths=(256,), measure_memory=False, progress=False, memory_budget_gb=1.0).resolve()
    keeper = Gatekeeper(rc, build=None)  # type: ignore[arg-type]
    budget = rc.memory_budget
    assert keeper.smaller(Shape(2, 4, 64, 16384)).length == rc.check_max_len == 1024
    # the float64 twin (2x the estimated peak, scaled linearly in L) must fit the budget
    assert (
        keeper.smaller(Shape(2, 4, 64, 16384), mem_est=budget).length == 1024
    )  # 2 * budget * 1024/16384 fits
    assert (
        keeper.smaller(Shape(2, 4, 64, 2048), mem_est=1.2 * budget).length == 512
    )  # 1024 -> 2*b*0.5 > b; 512 fits
    assert (
        keeper.smaller(Shape(2, 4, 64, 512), mem_est=0.6 * budget).length == 256
    )  # too big at its own length
    assert keeper.smaller(Shape(2, 4, 64, 128), mem_est=100 * budget).length == 64  # floor
