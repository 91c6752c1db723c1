"""What the screening stage ran: the study suite's tasks at the ``full`` preset's budgets and seeds
(:mod:`rl_transformers.study.suite`), and these encoders, frozen here: the registry's rows when it ran. An encoder
registered later is not part of this page (it would turn the finished page into a partial one); comparing it is a
run of the general tool (``scripts/encoder_study.py --encoders NAME``) or a new experiment."""

from __future__ import annotations

ENCODERS: dict[str, tuple[str, ...]] = {
    "ppo": (
        "gtrxl", "full", "local", "block_local", "block_local_2d", "blockwise", "strided", "fixed", "longformer",
        "bigbird", "etc", "lsh", "routing", "memory_compressed", "linear", "performer", "rfa", "gaussian_prior",
        "adaptive_span", "compressive", "knn", "universal", "early_exit", "gru", "lstm", "mlp",
    ),
    "dt": (
        "full", "local", "block_local", "block_local_2d", "blockwise", "strided", "fixed", "longformer", "bigbird",
        "etc", "lsh", "routing", "memory_compressed", "linear", "performer", "rfa", "gaussian_prior",
        "adaptive_span",
    ),
}  # fmt: skip
"""{algo: encoder names} of the screening stage (the order of a page's rows is the registry's)."""
