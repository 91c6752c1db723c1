"""Data-parallel DT training: 2 gloo ranks on CPU (torch.multiprocessing, spawn start method) end with identical weights."""

from __future__ import annotations

import gc
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from tests.algos.test_dt import cartpole_dataset, tiny_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, dataset: str, out: str, segments: int = 1) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    gc.disable()  # as if the cyclic collector did not run before exit: shutdown() must free the group itself
    from rl_transformers.algos.dt import train
    from rl_transformers.policies.decision_transformer import dt_backbone_config

    # segments > 1: one backward per segment under no_sync, the gradients all-reduced at the last one
    memory = dict(memory="xl", memory_options={"mem_len": 12}) if segments > 1 else {}
    config = tiny_config(
        Path(dataset),
        Path(out),
        total_steps=5,
        eval_every=0,
        eval_episodes=0,
        save_every=5,
        device="cpu",
        segments=segments,
        backbone=dt_backbone_config(d_model=16, n_layers=1, n_heads=2, **memory),
    )
    try:
        result = train(config, run_dir=Path(out) / "run")
        # no DDP wrapper (holding the gloo group) outlives train(): one left in a reference cycle dies at
        # interpreter exit, where gloo's threads abort the process
        wrappers = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
        state = {k: v.clone() for k, v in result.model.state_dict().items()}
        torch.save({"state": state, "ddp_alive": wrappers}, Path(out) / f"rank{rank}.pt")
    finally:  # train() destroys its process group; this catches a failure before it made one
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.parametrize("segments", [1, 3], ids=["windows", "segments"])
def test_two_gloo_ranks_keep_identical_parameters(tmp_path: Path, segments: int) -> None:
    dataset = cartpole_dataset(tmp_path / "cartpole.hdf5", n_good=2, n_random=4, max_steps=40)
    # spawn, not fork: a fork of the pytest worker copies its threads' held locks (execnet I/O, torch's pool),
    # which can deadlock a child; and a deadline, so a stuck rendezvous fails the test instead of hanging CI
    context = mp.start_processes(
        _worker,
        args=(2, _free_port(), str(dataset), str(tmp_path), segments),
        nprocs=2,
        start_method="spawn",
        join=False,
    )
    deadline = time.monotonic() + 300
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, "the two ranks did not finish within 300 s"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["ddp_alive"] == 0 and r1["ddp_alive"] == 0
    s0, s1 = r0["state"], r1["state"]
    for name in s0:
        assert torch.equal(s0[name], s1[name]), name
    # training happened, and the checkpoint (written by rank 0) holds both ranks' RNG states
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["step"] == 5 and ckpt["world_size"] == 2 and len(ckpt["sampler_rng"]) == 2
    assert ckpt["sampler_rng"][0] != ckpt["sampler_rng"][1]
    for name in s0:
        assert torch.equal(ckpt["model"][name], s0[name])
    assert not (tmp_path / "runs").exists()  # rank 1 never made a run directory of its own
