"""``--compile``: the acting step and the training forward of a policy under ``torch.compile`` (inductor).

:func:`compile_policy` gives an :class:`~rl_transformers.policies.actor_critic.ActorCritic` two compiled
callables, used by :meth:`~rl_transformers.policies.actor_critic.ActorCritic.act` and by
:meth:`~rl_transformers.policies.actor_critic.ActorCritic.features` (the PPO minibatch forward; AOTAutograd
compiles its backward too):

- ``compiled_step`` - observation encoder + core for one token per env with the carried state and the episode
  resets (the streaming backbone has static shapes here: fixed number of envs, memories of fixed size with a
  validity mask, resets as masked arithmetic, so the step is one graph with no break);
- ``compiled_core`` - the core over a (B, T) training sequence or its packed pieces (cutting rows at their
  episode starts is data-dependent and stays eager, before the call; piece counts and lengths vary, so inductor
  compiles it with dynamic sizes after the first shape change).

Sampling, log-probabilities and the heads stay eager: they are a few small ops, and eager sampling draws the same
random numbers with or without ``--compile``. Each callable falls back to eager for good, with one printed line
naming the error, when compiling fails (no C compiler, an unsupported construct); an error that eager raises as
well is the caller's and propagates. The time of the first call of each (mostly compilation) is printed.
Inductor caches compiled graphs on disk, so later runs of the same configuration compile in seconds instead of
minutes. Its default cache lives under /tmp (gone after a reboot or a /tmp cleaner): unless the user set
``TORCHINDUCTOR_CACHE_DIR``, :func:`compile_policy` points it at ``$XDG_CACHE_HOME/rl_transformers/inductor``
(``~/.cache/...``), so the compilation is amortised across runs and restarts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rl_transformers.policies.actor_critic import ActorCritic

Log = Callable[[str], None]


def _print(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class CompiledCall:
    """``torch.compile(fn)`` with an eager fallback and a report of the first call's time."""

    def __init__(self, name: str, eager: Callable[..., Any], log: Log = _print, **options: Any) -> None:
        self.name = name
        self.eager = eager
        self.log = log
        self.failed: str | None = None
        """Why compilation failed (then every call is eager), or None."""
        self.first_call_s: float | None = None
        """Seconds of the first compiled call (compilation included)."""
        self.compiled: Callable[..., Any] = eager
        try:
            self.compiled = torch.compile(eager, **options)
        except Exception as err:  # e.g. an unknown backend
            self._fail(err)

    def _fail(self, err: Exception) -> None:
        text = str(err).strip()
        self.failed = f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300]
        self.log(f"compile: {self.name} failed to compile ({self.failed}); running it eagerly")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.failed is not None:
            return self.eager(*args, **kwargs)
        start = time.perf_counter()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as err:  # compile errors come in many types (dynamo, inductor, the C compiler)
            out = self.eager(*args, **kwargs)  # an error eager raises too is the caller's: it propagates
            self._fail(err)
            return out
        if self.first_call_s is None:
            self.first_call_s = time.perf_counter() - start
            self.log(f"compile: {self.name} compiled in {self.first_call_s:.1f} s (first call, inductor)")
        return out


def persistent_cache_dir() -> Path:
    """Inductor's on-disk cache: ``TORCHINDUCTOR_CACHE_DIR`` when the user set it, else set here to
    ``$XDG_CACHE_HOME/rl_transformers/inductor`` (``~/.cache/rl_transformers/inductor``) so it survives /tmp."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(base) / "rl_transformers" / "inductor")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def compile_policy(
    policy: ActorCritic, log: Log = _print, training: bool = True, **options: Any
) -> ActorCritic:
    """Give ``policy`` a compiled acting step and, with ``training``, a compiled training forward (see the module
    docstring); ``options`` go to ``torch.compile`` (e.g. ``backend="aot_eager"`` in tests). Inductor's cache
    goes to :func:`persistent_cache_dir`."""
    persistent_cache_dir()
    policy.compiled_step = CompiledCall("acting step", policy.eager_step, log, **options)
    policy.compiled_core = CompiledCall("training forward", policy.core, log, **options) if training else None
    return policy


def eager_policy(policy: ActorCritic) -> ActorCritic:
    """Undo :func:`compile_policy`."""
    policy.compiled_step = None
    policy.compiled_core = None
    return policy


def graph_breaks(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, int, list[str]]:
    """(graphs, graph breaks, break reasons with their source line) of ``fn(*args, **kwargs)`` under dynamo."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args, **kwargs)
    reasons = []
    for brk in explained.break_reasons:
        where = brk.user_stack[-1] if brk.user_stack else None
        line = f"{where.filename}:{where.lineno}" if where is not None else "?"
        reasons.append(f"{brk.reason.strip().splitlines()[0]} at {line}")
    return explained.graph_count, explained.graph_break_count, reasons


__all__ = ["CompiledCall", "compile_policy", "eager_policy", "graph_breaks", "persistent_cache_dir"]
