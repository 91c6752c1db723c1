"""Training throughput (windows/s) of the default Decision Transformer and of the peers' models of its size.

Every candidate (``benchmarks.studies.dt_models``) gets the same synthetic Hopper-shaped batch (obs 11,
action 3, K = 20, batch 64, 3 layers, d = 128, 1 head, ReLU, dropout 0.1, max_ep_len 1000) and the same
update: masked action MSE, backward, clip 0.25, AdamW. After warm-up, rounds alternate between the candidates
(in a rotated order each round) and each round is timed by the process CPU time (``time.process_time``, which
other processes on the machine do not inflate) and by the wall clock. The table reports the median round of
each clock and the ratio of ``rl_transformers`` to every other candidate by both clocks. Peers are optional
(``pip install transformers`` / ``d3rlpy``); a missing one is listed as skipped.

    python benchmarks/bench_dt_throughput.py                          # 1 thread, all installed candidates
    python benchmarks/bench_dt_throughput.py --out benchmarks/results/dt_throughput   # + results.json / .md
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import tyro

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: benchmarks/ (not installed) imports from the checkout's root
    sys.path.insert(0, str(ROOT))

from benchmarks.studies import dt_models  # noqa: E402
from benchmarks.studies.dt_timing import run_rounds, summarise, write_results  # noqa: E402
from rl_transformers.runs.provenance import finish_machine_info, machine_info  # noqa: E402


@dataclass(frozen=True)
class Args:
    device: str = "cpu"
    """Device to time on."""
    shape: dt_models.DTShape = field(default_factory=dt_models.DTShape)
    """Model and batch shape (the paper's by default)."""
    candidates: tuple[str, ...] = tuple(dt_models.BUILDERS)
    """Candidates to time (``rl_transformers`` is the reference of the ratios)."""
    steps: int = 10
    """Timed updates per round."""
    rounds: int = 7
    """Interleaved timing rounds (medians are reported)."""
    warmup: int = 5
    """Untimed updates of each candidate first."""
    threads: int = 1
    """torch CPU threads (1: CPU time and wall clock agree on an idle machine)."""
    out: Path | None = None
    """Directory for results.json and results.md (printed only when None)."""


def main(args: Args) -> dict:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    unknown = sorted(set(args.candidates) - set(dt_models.BUILDERS))
    if unknown:
        raise SystemExit(f"unknown candidates {unknown}; valid: {sorted(dt_models.BUILDERS)}")
    built, skipped = {}, {}
    for name in args.candidates:
        candidate = dt_models.BUILDERS[name](args.shape, device)
        if candidate is None:
            skipped[name] = f"not installed ({dt_models.INSTALL_HINT.get(name, '')})"
        else:
            built[name] = candidate
    batch = dt_models.make_batch(args.shape, device)
    machine = machine_info(device)  # load and time at the start of the measurement
    rounds = run_rounds(built, batch, device, args.steps, args.rounds, args.warmup)
    samples = args.steps * args.shape.batch_size
    report = summarise(built, rounds, samples, reference="rl_transformers")
    report["skipped"] = skipped
    report["command"] = " ".join(["python", "benchmarks/bench_dt_throughput.py", *sys.argv[1:]])
    report["machine"] = finish_machine_info(machine)
    report["setup"] = {"device": str(device), "threads": torch.get_num_threads()} | asdict(args.shape)
    report["setup"] |= {"steps": args.steps, "rounds": args.rounds, "warmup": args.warmup}
    if args.out is not None:
        write_results(report, args.out)
    print(json.dumps(report["table"], indent=2))
    return report


if __name__ == "__main__":
    main(tyro.cli(Args, description=__doc__))
