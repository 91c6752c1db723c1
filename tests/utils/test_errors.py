"""utils.errors.run_cli (user errors without traceback, --debug / RLT_DEBUG) and utils.checks."""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone.options import check_aux_weights, check_divides
from rl_transformers.utils.checks import check_device, check_device_available
from rl_transformers.utils.errors import EXIT_INTERRUPTED, UserError, choice_hint, closest, run_cli


def _raise(err: BaseException):
    def main() -> None:
        raise err

    return main


def test_user_error_prints_message_and_exits_2(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.delenv("RLT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as info:
        run_cli(_raise(UserError("window=0 is bad", source="--x")), argv=["prog"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --x: window=0 is bad\n")
    assert "Traceback" not in err and "--debug" in err


def test_wrapped_user_error_is_still_a_user_error(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.delenv("RLT_DEBUG", raising=False)

    def main() -> None:
        try:
            raise UserError("bad file")
        except UserError as cause:
            raise RuntimeError("while loading") from cause

    with pytest.raises(SystemExit):
        run_cli(main, argv=["prog"])
    assert capsys.readouterr().err.startswith("error: bad file\n")


def test_debug_flag_and_env_show_the_traceback(monkeypatch) -> None:
    monkeypatch.delenv("RLT_DEBUG", raising=False)
    argv = ["prog", "--debug", "--seed", "3"]
    seen: list[list[str]] = []

    def main() -> None:
        seen.append(list(argv))
        raise UserError("bad")

    with pytest.raises(UserError, match="bad"):
        run_cli(main, argv=argv)
    assert seen == [["prog", "--seed", "3"]]  # --debug removed before the script parses its flags
    monkeypatch.setenv("RLT_DEBUG", "1")
    with pytest.raises(UserError):
        run_cli(_raise(UserError("bad")), argv=["prog"])
    monkeypatch.setenv("RLT_DEBUG", "0")
    with pytest.raises(SystemExit):
        run_cli(_raise(UserError("bad")), argv=["prog"])


def test_other_exceptions_pass_through(monkeypatch) -> None:
    monkeypatch.delenv("RLT_DEBUG", raising=False)
    with pytest.raises(IndexError):
        run_cli(_raise(IndexError("bug")), argv=["prog"])
    with pytest.raises(ValueError, match="plain"):  # a plain ValueError may be a bug: traceback kept
        run_cli(_raise(ValueError("plain")), argv=["prog"])
    with pytest.raises(KeyboardInterrupt):
        run_cli(_raise(KeyboardInterrupt()), argv=["prog"])
    assert run_cli(lambda: 7, argv=["prog"]) == 7


def test_a_script_that_stops_on_ctrl_c_says_so_without_a_traceback(monkeypatch, capsys) -> None:
    """``on_interrupt`` (the resumable studies): Ctrl-C prints one line and exits 130; --debug keeps the
    traceback; without ``on_interrupt`` it still passes through (test above)."""
    monkeypatch.delenv("RLT_DEBUG", raising=False)
    with pytest.raises(SystemExit) as done:
        run_cli(_raise(KeyboardInterrupt()), argv=["prog"], on_interrupt="rerun to resume")
    assert done.value.code == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err == "interrupted: rerun to resume\n"
    with pytest.raises(KeyboardInterrupt):
        run_cli(_raise(KeyboardInterrupt()), argv=["prog", "--debug"], on_interrupt="rerun to resume")


def test_hints() -> None:
    assert closest("cudaa", ["cpu", "cuda"]) == "cuda"
    assert closest("zzz", ["cpu", "cuda"]) is None
    assert choice_hint("gelu2", ["relu", "gelu"]) == "valid: relu, gelu (did you mean 'gelu'?)"
    assert issubclass(UserError, ValueError)


@pytest.mark.parametrize("name", ["cpu", "cuda", "cuda:1", "mps", "auto"])
def test_device_names_accepted(name: str) -> None:
    check_device(name)


@pytest.mark.parametrize(("name", "hint"), [("cudaa", "did you mean 'cuda'"), ("gpu", ""), ("cuda:x", "")])
def test_device_names_refused(name: str, hint: str) -> None:
    with pytest.raises(
        UserError, match=r"--device: unknown device .*valid: auto, cpu, cuda, cuda:N, mps"
    ) as info:
        check_device(name)
    assert repr(name) in str(info.value) and hint in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_cuda_is_explained() -> None:
    with pytest.raises(UserError, match=r"--device: device 'cuda' was asked for but CUDA is not available"):
        check_device_available("cuda")
    check_device_available("cpu")


def test_aux_weights() -> None:
    check_aux_weights({"act_ponder": 0.1}, ["act_ponder"], "--w")
    with pytest.raises(
        UserError, match=r"--w: unknown aux loss 'act_pondr'; valid .*act_ponder \(did you mean"
    ):
        check_aux_weights({"act_pondr": 0.1}, ["act_ponder"], "--w")
    with pytest.raises(UserError, match=r"unknown aux loss 'ponder'; this model produces no aux losses"):
        check_aux_weights({"ponder": 0.1}, [], "--w")
    with pytest.raises(UserError, match=r"--w 'act_ponder' must be a number >= 0, got -1"):
        check_aux_weights({"act_ponder": -1}, ["act_ponder"], "--w")


def test_divides() -> None:
    check_divides("num_minibatches", 4, 8, "8 sequences")
    with pytest.raises(
        UserError, match=r"num_minibatches=3 \(--m\) does not divide 8 sequences; valid: 1, 2, 4, 8"
    ):
        check_divides("num_minibatches", 3, 8, "8 sequences", source="--m")
