"""Tests for rl_transformers.utils.training: seeding, threads, graceful Ctrl-C, finiteness, schedules."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from rl_transformers.utils import (
    GracefulInterrupt,
    NonFiniteError,
    available_cores,
    check_finite,
    linear_schedule,
    linear_warmup,
    seed_everything,
    set_threads,
    warmup_cosine,
)


def _wait_for(flag: GracefulInterrupt) -> None:
    # Python runs signal handlers between bytecodes of the main thread; give it a moment
    deadline = time.monotonic() + 2.0
    while not flag.requested and time.monotonic() < deadline:
        time.sleep(0.001)


@pytest.fixture
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_seed_everything_reproduces_draws() -> None:
    def draws() -> tuple[float, float, list[float]]:
        return random.random(), float(np.random.rand()), torch.rand(2).tolist()

    seed_everything(123)
    first = draws()
    seed_everything(123)
    assert draws() == first
    seed_everything(124)
    assert draws() != first


def test_set_threads(restore_threads: None) -> None:
    assert set_threads(1) == 1 and torch.get_num_threads() == 1
    assert set_threads() == available_cores() == len(os.sched_getaffinity(0))
    assert torch.get_num_threads() == available_cores()
    with pytest.raises(ValueError, match="threads"):
        set_threads(0)


def test_graceful_interrupt_sets_flag_and_restores_handler() -> None:
    before = signal.getsignal(signal.SIGINT)
    with GracefulInterrupt(message=False) as stop:
        assert stop.installed and not stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        _wait_for(stop)
        assert stop.requested and stop.signal_received == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is before
    assert not stop.installed


def test_second_interrupt_raises_keyboard_interrupt(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KeyboardInterrupt), GracefulInterrupt() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        _wait_for(stop)
        assert stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2.0)  # interrupted by the KeyboardInterrupt long before this ends
    assert "Ctrl-C again" in capsys.readouterr().err


def test_graceful_interrupt_outside_main_thread_does_nothing() -> None:
    result: dict[str, bool] = {}

    def worker() -> None:
        with GracefulInterrupt() as stop:
            result["installed"] = stop.installed

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert result == {"installed": False}
    assert signal.getsignal(signal.SIGINT) is before


def test_check_finite_passes_finite_values_through() -> None:
    loss = torch.tensor(0.5)
    assert check_finite(loss, "train/loss", 3) is loss
    assert check_finite(1.0, "x") == 1.0
    arr = np.ones(3)
    assert check_finite(arr, "x") is arr


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        (float("nan"), "value nan"),
        (torch.tensor(float("inf")), "value inf"),
        (torch.tensor([1.0, float("nan"), float("inf"), float("-inf")]), "1 NaN and 2 inf of 4 elements"),
        (np.array([float("nan"), 0.0]), "1 NaN and 0 inf of 2 elements"),
    ],
    ids=["float", "tensor-scalar", "tensor", "numpy"],
)
def test_check_finite_raises_naming_quantity_and_step(value: object, detail: str) -> None:
    with pytest.raises(NonFiniteError) as info:
        check_finite(value, "train/value_loss", step=4096)
    assert str(info.value).startswith(f"non-finite train/value_loss at step 4096: {detail}")
    assert isinstance(info.value, RuntimeError)
    assert (info.value.name, info.value.step) == ("train/value_loss", 4096)


def test_linear_schedules() -> None:
    assert linear_schedule(1.0, 0.0, 0.25) == 0.75
    assert linear_schedule(2.0, 4.0, 1.5) == 4.0  # clipped
    assert linear_schedule(2.0, 4.0, -1.0) == 2.0
    assert [linear_warmup(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert linear_warmup(0, 0) == 1.0


def test_warmup_cosine_by_hand() -> None:
    import math

    # warm-up 2 of 10 steps, then 0.5 (1 + cos(pi (s - 2) / 8)) down to 0 at step 10, and 0 beyond
    got = [warmup_cosine(s, 2, 10) for s in range(12)]
    expected = [0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) for s in range(2, 10)] + [0.0, 0.0]
    assert got == pytest.approx(expected, abs=1e-12)
    assert got[6] == pytest.approx(0.5) and warmup_cosine(0, 0, 1) == 1.0
