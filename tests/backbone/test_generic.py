"""Every registry entry through the docs/design.md invariants (reference, causality, streaming, reset, gradients).

The cases are drawn from ``available()`` at collection time, so a new variant is tested as soon as it registers.
Each attention runs with a position scheme it supports; each position / block / memory / depth runs with
``full`` attention. Family-specific equalities (window >= L == full, ...) live in tests/backbone/test_<family>.py.
"""

from __future__ import annotations

import pytest
import torch

from rl_transformers.backbone import BackboneConfig, available, capabilities, registry
from tests.backbone import invariants as inv


def _attention_cases() -> list[dict]:
    cases = []
    for name in available()["attention"]:
        cls = registry.get("attention", name).cls
        caps = capabilities("attention", name)
        position = "rope" if "qk" in cls.position_kinds else "none"
        causal = caps.causal
        cases.append(
            pytest.param(dict(attention=name, position=position, causal=causal), id=f"attention-{name}")
        )
    return cases


def _other_cases() -> list:
    cases = []
    for name in available()["position"]:
        causal = True
        cases.append(pytest.param(dict(position=name), id=f"position-{name}"))
    for name in available()["block"]:
        cases.append(pytest.param(dict(block=name), id=f"block-{name}"))
    for name in available()["memory"]:
        cases.append(pytest.param(dict(memory=name, position="rope"), id=f"memory-{name}"))
    for name in available()["depth"]:
        cases.append(pytest.param(dict(depth=name), id=f"depth-{name}"))
    del causal
    return cases


# The defaults of windowed / chunked entries (windows of 32-64) exceed the tests' short sequences, where they
# degenerate to dense attention; these options make the window, chunk or span bite at L = 9-12.
SMALL_WINDOWS: dict[str, dict] = {
    "full": {"max_cache": 3},
    "local": {"window": 3},
    "block_local": {"block": 4, "flange": 2},
    "longformer": {"window": 3, "dilation": (1, 2)},
    "etc": {"window": 3, "n_global": 2},
    "bigbird": {"block": 2, "window_blocks": 1, "n_random": 1},
    "strided": {"stride": 3},
    "fixed": {"stride": 4, "summary": 1},
    "blockwise": {"block_size": 4},
    "linear": {"chunk_size": 4},
    "rfa": {"chunk_size": 4},
    "performer": {"chunk_size": 4},
    "lsh": {"n_buckets": 4, "chunk_size": 4},
    "routing": {"local_heads": 1, "local_window": 3},
    "gaussian_prior": {"max_cache": 4},
    "adaptive_span": {"max_span": 6, "ramp": 2, "query_block": 4},
    "linformer": {"k": 4, "max_len": 16},
}

CHUNK_ONLY = {"linear", "rfa", "performer"}  # chunk_size schedules an exact computation


def _small_window_cases() -> list:
    cases = []
    for name, options in SMALL_WINDOWS.items():
        cls = registry.get("attention", name).cls
        position = "rope" if "qk" in cls.position_kinds else "none"
        case = dict(attention=name, attention_options=options, position=position)
        case["causal"] = capabilities("attention", name).causal
        cases.append(pytest.param(case, id=f"attention-{name}-small"))
    return cases


ALL_CASES = _attention_cases() + _small_window_cases() + _other_cases()


def _streaming(case: dict) -> str:
    kinds = [("attention", case.get("attention", "full")), ("position", case.get("position", "rope"))]
    for kind in ("memory", "depth", "block"):
        if case.get(kind):
            kinds.append((kind, case[kind]))
    levels = [capabilities(k, n).streaming for k, n in kinds]
    return "none" if "none" in levels else "window" if "window" in levels else "exact"


# Where the small options also size parameters or buffers (lsh's rotations, routing's centroids), the wide twin
# keeps those and widens only the window, so the two share weights.
WIDE_TWINS = {
    "lsh": {"n_buckets": 4, "chunk_size": 12},
    "routing": {"local_heads": 1, "local_window": 12},
}
NOT_WINDOWED = {"linformer": "k sizes the E / F projections, not a window (test_lowrank checks k)"}


@pytest.mark.parametrize("name", sorted(set(SMALL_WINDOWS) - set(NOT_WINDOWED)))
def test_small_windows_bite(name: str) -> None:
    """With the same weights, the small options change the output of a 12-step sequence (the window is
    shorter than the sequence), so the small-window cases above test windowed code, not dense fallbacks.
    For the kernel attentions chunk_size is only a computation schedule: there the output must not change."""
    case = next(p.values[0] for p in _small_window_cases() if p.values[0]["attention"] == name)
    small = inv.tiny_backbone(**case)
    wide_case = {k: v for k, v in case.items() if k != "attention_options"}
    if name in WIDE_TWINS:
        wide_case["attention_options"] = WIDE_TWINS[name]
    wide = inv.tiny_backbone(**wide_case)
    wide_state = wide.state_dict()
    shapes = {k: (wide_state[k].shape, v.shape) for k, v in small.state_dict().items() if k in wide_state}
    assert all(a == b for a, b in shapes.values()), f"give {name!r} a WIDE_TWINS entry with the same shapes"
    small.load_state_dict(wide_state, strict=False)
    x = torch.randn(2, 12, small.cfg.d_model, dtype=torch.float64)
    if name in CHUNK_ONLY:
        torch.testing.assert_close(small(x).y, wide(x).y, rtol=1e-10, atol=1e-10)
    else:
        assert not torch.allclose(small(x).y, wide(x).y, atol=1e-9)


@pytest.mark.parametrize("case", ALL_CASES)
def test_forward_shapes_and_finite(case: dict) -> None:
    bb = inv.tiny_backbone(**case)
    x = torch.randn(2, 9, bb.cfg.d_model, dtype=torch.float64)
    out = bb(x)
    assert out.y.shape == x.shape
    assert torch.isfinite(out.y).all()
    for name, value in out.aux_losses.items():
        assert torch.isfinite(value).all(), name


@pytest.mark.parametrize("case", ALL_CASES)
def test_gradients(case: dict) -> None:
    inv.check_gradients(inv.tiny_backbone(**case))


@pytest.mark.parametrize("case", ALL_CASES)
def test_causality(case: dict) -> None:
    bb = inv.tiny_backbone(**case)
    if not bb.cfg.causal:
        pytest.skip("non-causal entry")
    inv.check_causal(bb)


@pytest.mark.parametrize("case", ALL_CASES)
def test_streaming_equals_full(case: dict) -> None:
    if _streaming(case) != "exact":
        pytest.skip(f"streaming={_streaming(case)!r}: covered by the family test with its window mask")
    bb = inv.tiny_backbone(**case)
    if not bb.cfg.causal:
        pytest.skip("streaming is defined for causal models")
    inv.check_streaming(bb)


@pytest.mark.parametrize("case", ALL_CASES)
def test_reset_row_equals_fresh(case: dict) -> None:
    if _streaming(case) == "none":
        pytest.skip("no streaming state")
    bb = inv.tiny_backbone(**case)
    if not bb.cfg.causal:
        pytest.skip("streaming is defined for causal models")
    inv.check_reset(bb)
    inv.check_state_ops(bb)


def test_available_lists_design_names() -> None:
    """The registry names fixed in docs/design.md, exactly."""
    names = available()
    assert set(names) == {"attention", "position", "memory", "block", "depth"}
    assert set(names["position"]) == {
        "none", "sinusoidal", "learned", "shaw", "xl_relative", "t5", "rope", "xpos", "alibi",
        "kerple_power", "kerple_log", "sandwich", "da",
    }  # fmt: skip
    assert set(names["attention"]) == {
        "full", "local", "block_local", "block_local_2d", "strided", "fixed", "blockwise", "longformer",
        "bigbird", "etc", "lsh", "routing", "linformer", "memory_compressed", "linear", "rfa", "performer",
        "gaussian_prior", "adaptive_span", "retnet", "gla", "mamba2", "mlstm", "deltanet", "gated_deltanet",
        "lru", "mingru", "mamba", "ffm", "fox",
    }  # fmt: skip
    assert set(names["memory"]) == {"xl", "compressive", "knn"}
    assert set(names["block"]) == {"post_ln", "pre_ln", "gtrxl", "rezero", "reversible"}
    assert set(names["depth"]) == {"fixed", "universal", "early_exit"}


def test_first_lookup_from_many_threads_sees_the_whole_registry() -> None:
    """A fresh interpreter: 8 threads race on the first lookup; each must see every entry."""
    import ast
    import subprocess
    import sys

    code = """
import threading
from rl_transformers.backbone import available
seen = []
start = threading.Barrier(8)
def look():
    start.wait()
    seen.append(sum(len(v) for v in available().values()))
threads = [threading.Thread(target=look) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(seen)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    counts = ast.literal_eval(out)
    assert counts == [sum(len(v) for v in available().values())] * 8


def test_the_order_of_the_names_does_not_depend_on_what_was_imported_first() -> None:
    """Fresh interpreters that import one variant module (or none) before the first lookup list the same order.

    Tables, documents and test parametrizations are built from ``available()``; a registry in registration
    order put ``lsh`` first after ``import rl_transformers.backbone.attention.lsh``."""
    import ast
    import subprocess
    import sys

    def order(first: str) -> dict[str, list[str]]:
        code = f"{first}\nfrom rl_transformers.backbone import available\nprint(available())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        return ast.literal_eval(out)

    plain = order("")
    assert plain["attention"][0] != "lsh" and plain["position"][0] != "xl_relative"
    for first in (
        "import rl_transformers.backbone.attention.lsh",
        "import rl_transformers.backbone.position.relative",
    ):
        assert order(first) == plain, first
    assert plain == available()


def test_unknown_names_and_options_are_explained() -> None:
    with pytest.raises(
        ValueError, match=r"unknown attention 'ful'\. Did you mean 'full'\? Valid attention names: \[.*'full'"
    ):
        BackboneConfig(attention="ful")
    with pytest.raises(
        ValueError, match=r"unknown option 'max_cach'.*Did you mean 'max_cache'.*Valid options"
    ):
        BackboneConfig(attention_options={"max_cach": 3})
    with pytest.raises(ValueError, match=r"unknown position 'alibii'"):
        BackboneConfig(position="alibii")
    with pytest.raises(ValueError, match="not divisible"):
        BackboneConfig(d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="absolute position scheme"):
        BackboneConfig(memory="xl", position="sinusoidal")


@pytest.mark.parametrize(
    "attention, options, match",
    [
        ("block_local_2d", {"image_shape": None}, "image_shape"),
        ("blockwise", {"block_size": None}, "block_size"),
    ],
)
def test_configurations_that_cannot_stream_refuse_a_carried_cache(attention, options, match) -> None:
    bb = inv.tiny_backbone(attention=attention, attention_options=options, position="rope")
    x = torch.randn(1, 8, bb.cfg.d_model, dtype=torch.float64)
    state = bb(x[:, :4]).state
    with pytest.raises(ValueError, match=f"cannot stream.*{match}"):
        bb(x[:, 4:], state=state)
