"""``--compile``: the acting step and the training forward have no graph break, and compiled equals
eager.

Every configuration is the GTrXL policy (gated blocks, XL memory, ``xl_relative`` positions; ``rope`` for the
kernel attentions, which refuse score schemes) with one attention or memory swapped in. Inputs are random, with
episode resets at random envs and steps while acting and episode starts inside the training sequences (cut
into packed pieces, or restarted inside the core where it masks by episode: ``Core.segments``). Compiled and eager run in float64 and must agree to 1e-9 (absolute and relative), values,
carried states and parameter gradients alike: a wrong graph gives errors of order 1e-2 and more. The
``aot_eager`` backend (dynamo + AOTAutograd, no code generation) checks the captured graphs fast; inductor, what
``--compile`` runs, compiles for minutes on a loaded CPU, so those tests are ``slow``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from rl_transformers.backbone import BackboneConfig
from rl_transformers.policies import GTrXLPolicy, gtrxl_backbone
from rl_transformers.policies.compile import CompiledCall, compile_policy, eager_policy, graph_breaks
from rl_transformers.policies.packing import Packing

OBS = gym.spaces.Box(-1.0, 1.0, (3,))
ACT = gym.spaces.Discrete(3)
B, STEPS, W = 4, 14, 6
TOL = 1e-9
MAX_BREAKS = 0
"""Graph breaks allowed in the acting step and the training forward."""

BASE = gtrxl_backbone(d_model=16, n_layers=2, n_heads=2, mem_len=6)
CONFIGS: dict[str, BackboneConfig] = {
    "full": BASE,
    "gaussian_prior": BASE.replace(attention="gaussian_prior"),
    "lsh": BASE.replace(attention="lsh", attention_options={"chunk_size": 4}),
    "performer": BASE.replace(attention="performer", position="rope"),
    "linear": BASE.replace(attention="linear", position="rope"),
    "block_local_2d": BASE.replace(attention="block_local_2d", attention_options={"image_shape": (4, 4)}),
    "compressive": BASE.replace(
        memory="compressive",
        memory_options={"mem_len": 6, "cmem_len": 3, "rate": 2},  # mem_len >= W: uncut
    ),
    "knn": BASE.replace(memory="knn", memory_options={"mem_len": 4, "store_size": 8, "top_k": 3}),
    "full_separate_critic": BASE,  # --critic separate: the twin core and its twin state
}
SEPARATE_CRITIC = {"full_separate_critic"}


def make_policy(name: str) -> GTrXLPolicy:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compressive / knn replay inexactly: not what is tested here
        critic = "separate" if name in SEPARATE_CRITIC else "shared"
        return GTrXLPolicy(OBS, ACT, CONFIGS[name], critic=critic).double()


def inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Observations (STEPS, B, 3) and episode starts (STEPS, B) with resets at random envs and steps."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(STEPS, B, 3, generator=g, dtype=torch.float64)
    starts = torch.rand(STEPS, B, generator=g) < 0.25
    starts[0] = True
    return obs, starts


def leaves(state: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    state.map(lambda t: out.append(t) or t)
    return out


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.is_floating_point():
        torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)
    else:
        assert torch.equal(a, b)


def act_all(policy: GTrXLPolicy, step: Any, obs: torch.Tensor, starts: torch.Tensor) -> tuple[list, list]:
    features, states = [], []
    with torch.inference_mode():
        state = policy.acting_state(policy.initial_state(B))  # as a rollout starts (XL: projections cached)
        for t in range(STEPS):
            h, state = step(obs[t], state, starts[t])
            features.append(h)
            states.append(state.map(torch.clone))  # a snapshot: the next step writes an owned knn store
    return features, states


def training_pass(
    policy: GTrXLPolicy, state: Any, obs: torch.Tensor, starts: torch.Tensor
) -> list[torch.Tensor]:
    """Log-probs, entropies, values and parameter gradients of one sequence batch (B, W) from ``state``."""
    actions = torch.arange(B * W).remainder(3).view(B, W)
    policy.zero_grad(set_to_none=True)
    out = policy.evaluate_sequence(obs, actions, state, starts)
    loss = out.log_prob.sum() + out.entropy.sum() + out.value.pow(2).sum()
    loss = loss + sum((v for v in out.aux_losses.values()), torch.zeros((), dtype=torch.float64))
    loss.backward()
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in policy.parameters()]
    return [out.log_prob, out.entropy, out.value, *grads]


def check_compiled_equals_eager(name: str, backend: str) -> None:
    policy = make_policy(name)
    obs, starts = inputs(1)
    want_h, want_states = act_all(policy, policy.eager_step, obs, starts)
    messages: list[str] = []
    compile_policy(policy, messages.append, backend=backend)
    assert isinstance(policy.compiled_step, CompiledCall)
    got_h, got_states = act_all(policy, policy.compiled_step, obs, starts)
    assert policy.compiled_step.failed is None, messages
    for t in range(STEPS):
        close(got_h[t], want_h[t])
        for a, b in zip(leaves(got_states[t]), leaves(want_states[t]), strict=True):
            close(a, b)
    # Training forward + backward from a stored mid-stream state, with episode starts inside the sequences.
    seq_obs = obs[STEPS - W :].transpose(0, 1).contiguous()
    seq_starts = starts[STEPS - W :].t().contiguous()
    seq_starts[0, 2] = seq_starts[1, 0] = True
    assert len(Packing.from_starts(seq_starts).row) > B  # rows are cut into pieces
    stored = policy.plain_state(want_states[STEPS - W - 1])  # as the rollout stores it
    got = training_pass(policy, stored, seq_obs, seq_starts)
    assert isinstance(policy.compiled_core, CompiledCall) and policy.compiled_core.failed is None, messages
    eager_policy(policy)
    want = training_pass(policy, stored, seq_obs, seq_starts)
    for a, b in zip(got, want, strict=True):
        close(a, b)
    torch._dynamo.reset()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_acting_step_and_training_forward_have_no_graph_break(name: str) -> None:
    policy = make_policy(name)
    obs, starts = inputs(2)
    _, states = act_all(policy, policy.eager_step, obs, starts)
    with torch.inference_mode():
        graphs, breaks, reasons = graph_breaks(policy.eager_step, obs[-1], states[-2], starts[-1])
    assert breaks <= MAX_BREAKS and graphs == 1, reasons
    seq_starts = starts[STEPS - W :].t().contiguous()
    seq_starts[0, 2] = True
    packing = Packing.from_starts(seq_starts)
    x = torch.randn(B, W, 16, dtype=torch.float64)
    stored = policy.plain_state(states[STEPS - W - 1])
    piece_state = stored.index_select(packing.row)
    graphs, breaks, reasons = graph_breaks(
        policy.core, packing.pack(x), piece_state, reset=packing.reset, valid=packing.valid()
    )
    torch._dynamo.reset()
    assert breaks <= MAX_BREAKS and graphs == 1, reasons
    limit = policy.core.segment_chunk_limit
    if policy.core.segments and (limit is None or limit >= W):  # the uncut training forward: what PPO runs
        # on minibatch states gathered from the storage (normal tensors, not the rollout's inference tensors)
        minibatch = stored.index_select(torch.arange(B))
        graphs, breaks, reasons = graph_breaks(policy.core, x, minibatch, starts=seq_starts)
        torch._dynamo.reset()
        assert breaks <= MAX_BREAKS and graphs == 1, reasons


def test_graph_break_count_bites() -> None:
    """The counter sees a data-dependent branch (what the acting step had before it was made compile-friendly)."""

    def branchy(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if bool(x.any()) else x - 1

    graphs, breaks, _ = graph_breaks(branchy, torch.ones(3))
    torch._dynamo.reset()
    assert breaks >= 1 and graphs >= 1


@pytest.mark.parametrize("name", ["full", "full_separate_critic"])
def test_captured_graphs_equal_eager(name: str) -> None:
    check_compiled_equals_eager(name, "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in ("full", "full_separate_critic")])
def test_captured_graphs_equal_eager_every_attention(name: str) -> None:
    check_compiled_equals_eager(name, "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_inductor_equals_eager(name: str) -> None:
    check_compiled_equals_eager(name, "inductor")


def test_compile_failure_falls_back_to_eager_with_one_message() -> None:
    calls: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x * 2

    messages: list[str] = []
    call = CompiledCall("toy", fn, messages.append, backend="no_such_backend")
    out = call(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 2.0)) and call.failed is not None
    assert len(messages) == 1 and messages[0].startswith("compile: toy failed to compile")
    call(torch.ones(2))
    assert len(messages) == 1  # eager from then on, silently


def test_an_error_of_the_callers_own_propagates() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad input")

    call = CompiledCall("toy", fn, lambda m: None, backend="aot_eager")
    with pytest.raises(ValueError, match="bad input"):
        call(torch.ones(2))


def test_inductor_cache_is_persistent_unless_the_user_chose_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled graphs are cached under the user's cache folder (not /tmp), and a chosen cache is kept."""
    from rl_transformers.policies.compile import persistent_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert persistent_cache_dir() == tmp_path / "xdg" / "rl_transformers" / "inductor"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "xdg" / "rl_transformers" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert persistent_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert persistent_cache_dir() == tmp_path / "home" / ".cache" / "rl_transformers" / "inductor"
