"""Training throughput (windows/s) of the default Decision Transformer, and of HF's of the same size.

Both models get the same synthetic Hopper-shaped batches (obs 11, action 3 in [-1, 1], K = 20, batch 64,
3 layers, d = 128, 1 head, ReLU, dropout 0.1 as in GPT-2, max_ep_len 1000) and the same update: masked action MSE,
backward, clip 0.25, AdamW. Timings alternate between the models in rounds, after warm-up, and report the
median round. ``transformers`` is optional (``pip install transformers``; it does not pull another torch);
without it only ours is measured.

    python scripts/bench_dt_throughput.py --device cpu --steps 20 --rounds 3
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import tyro

from rl_transformers.policies.decision_transformer import DecisionTransformer, dt_backbone_config
from rl_transformers.utils.errors import run_cli


@dataclass(frozen=True)
class Args:
    device: str = "cpu"
    """Device to time on."""
    batch_size: int = 64
    """Windows per update."""
    context_len: int = 20
    """K steps per window."""
    steps: int = 20
    """Timed updates per round."""
    rounds: int = 3
    """Alternating timing rounds (the median is reported)."""
    warmup: int = 5
    """Untimed updates first."""
    threads: int | None = None
    """torch CPU threads."""
    dropout: float = 0.1
    """Dropout of both models (the paper's 0.1; 0 isolates the architecture)."""


def make_batch(args: Args, device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    b, k = args.batch_size, args.context_len
    lengths = torch.randint(1, k + 1, (b,), generator=g)
    mask = torch.arange(k)[None] < lengths[:, None]
    batch = {
        "returns_to_go": torch.rand(b, k, generator=g) * 3600,
        "observations": torch.randn(b, k, 11, generator=g),
        "actions": torch.rand(b, k, 3, generator=g) * 2 - 1,
        "timesteps": torch.randint(0, 1000, (b, k), generator=g),
        "mask": mask,
    }
    return {name: t.to(device) for name, t in batch.items()}


def ours(args: Args, device: torch.device) -> tuple[torch.nn.Module, Callable[[dict], torch.Tensor]]:
    box = gym.spaces.Box(-np.inf, np.inf, (11,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    backbone = dt_backbone_config(dropout=args.dropout)
    model = DecisionTransformer(box, action_space, backbone, args.context_len, max_ep_len=1000).to(device)

    def loss(batch: dict) -> torch.Tensor:
        out = model(**batch)
        return model.action_loss(out.predictions, batch["actions"], batch["mask"])

    return model, loss


def huggingface(
    args: Args, device: torch.device
) -> tuple[torch.nn.Module, Callable[[dict], torch.Tensor]] | None:
    try:
        from transformers import DecisionTransformerConfig, DecisionTransformerModel
    except ImportError:
        return None
    p = args.dropout
    cfg = DecisionTransformerConfig(
        state_dim=11, act_dim=3, hidden_size=128, n_layer=3, n_head=1, max_ep_len=1000,
        resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
    )  # fmt: skip
    model = DecisionTransformerModel(cfg).to(device)

    def loss(batch: dict) -> torch.Tensor:
        mask = batch["mask"]
        out = model(
            states=batch["observations"],
            actions=batch["actions"],
            rewards=torch.zeros_like(batch["returns_to_go"])[..., None],
            returns_to_go=batch["returns_to_go"][..., None] / 1000.0,
            timesteps=batch["timesteps"],
            attention_mask=mask.long(),
        )
        err = (out.action_preds - batch["actions"]).pow(2).sum(-1)
        return (err * mask).sum() / (mask.sum() * 3)

    return model, loss


def main(args: Args) -> None:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batch = make_batch(args, device)
    candidates = {"rl_transformers": ours(args, device), "huggingface": huggingface(args, device)}
    runs = {}
    for name, built in candidates.items():
        if built is None:
            print(f"{name}: transformers is not installed, skipped")
            continue
        model, loss_fn = built
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)

        def update(model=model, loss_fn=loss_fn, opt=opt) -> None:
            loss = loss_fn(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()

        for _ in range(args.warmup):
            update()
        n_params = sum(p.numel() for p in model.parameters())
        runs[name] = {"update": update, "n_parameters": n_params, "rates": []}
    for _ in range(args.rounds):
        for run in runs.values():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.steps):
                run["update"]()
            if device.type == "cuda":
                torch.cuda.synchronize()
            run["rates"].append(args.steps * args.batch_size / (time.perf_counter() - start))
    report = {
        name: {
            "samples_per_second": round(statistics.median(run["rates"]), 1),
            "rounds": [round(r, 1) for r in run["rates"]],
            "n_parameters": run["n_parameters"],
        }
        for name, run in runs.items()
    }
    info = {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__}
    info |= {"batch_size": args.batch_size, "context_len": args.context_len, "dropout": args.dropout}
    print(json.dumps({"setup": info} | report, indent=2))


if __name__ == "__main__":
    run_cli(lambda: main(tyro.cli(Args, description=__doc__)))
