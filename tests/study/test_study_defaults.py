"""A tripwire for the studies' committed records: a job's key hashes the encoder's spec *string* and the
trainer's overrides only, and specs are relative to the library's defaults (``""`` is the GTrXL default,
``memory=knn`` keeps its attention and positions, ``position=rope`` is the confirmation stage's candidate). A
changed default (of a policy, a variant's options, PPO's or the DT's recipe) would silently give committed
records another meaning, and make ``gtrxl_rope`` the same model as ``gtrxl``. So every spec of the committed
records (screening, confirmation, offline memory table) must still resolve to what it was measured with.

The PPO base's positions are pinned (``study.encoders.PPO_BASE_POSITION``), so GTrXL's library default may
change ("defaults that follow the evidence") without firing this. Changing any other default
on purpose needs the studies' specs pinned to what they meant the same way (or explicit specs, with the
committed keys migrated as ``records.legacy_key_matches`` does for DT dataset roots); then regenerate the
snapshot: ``python tests/study/test_study_defaults.py``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECORDS = ("encoders_screening.json", "encoders.json", "offline_memory.json")
SNAPSHOT = Path(__file__).with_name("data") / "study_defaults.json"
DT_RUNTIME = {"seed", "device", "threads", "run_root", "resume", "verbose", "progress", "allow_env_modules",
              "dataset", "dataset_root", "env_id"}  # fmt: skip
"""DTConfig fields that say where and how a run happens, not what it trains (jobs set them)."""


def committed_specs() -> dict[str, list[str]]:
    """The encoder specs of every committed record, per trainer."""
    specs: dict[str, set[str]] = {"ppo": set(), "dt": set()}
    for name in RECORDS:
        data = json.loads((REPO / "docs" / "results" / name).read_text())
        for rec in data["records"] if isinstance(data, dict) else data:
            specs["ppo" if rec["algo"] == "ppo" else "dt"].add(rec["encoder"])
    return {algo: sorted(found) for algo, found in specs.items()}


def variant_defaults() -> dict[str, dict[str, Any]]:
    """Every registered variant's default options: with the bases and recipes below, every default a spec
    can lean on (so records committed after the snapshot are covered too)."""
    from rl_transformers.backbone import available, registry

    return {
        family: {name: dataclasses.asdict(registry.build_options(family, name, {})) for name in names}
        for family, names in available().items()
    }


def resolved_defaults() -> dict[str, Any]:
    """Each committed spec's resolved configuration; the defaults underneath: the PPO and DT bases, every
    variant's options, PPO's and the DT's recipes."""
    from rl_transformers.algos.dt_config import DTConfig
    from rl_transformers.algos.ppo_config import PPOConfig
    from rl_transformers.study.encoders import dt_backbone, policy_config

    specs = committed_specs()
    dt = {k: v for k, v in dataclasses.asdict(DTConfig()).items() if k not in DT_RUNTIME}
    resolved = {
        "ppo_specs": {s: dataclasses.asdict(policy_config(s)) for s in specs["ppo"]},
        "dt_specs": {s: dataclasses.asdict(dt_backbone(s)) for s in specs["dt"]},
        "variants": variant_defaults(),
        "ppo": dataclasses.asdict(PPOConfig()),
        "dt": dt,
    }
    return json.loads(json.dumps(resolved, sort_keys=True))  # tuples as lists, as stored


def test_every_committed_record_still_means_what_it_was_measured_with() -> None:
    saved = json.loads(SNAPSHOT.read_text())
    now = resolved_defaults()
    for part in ("ppo_specs", "dt_specs"):
        changed = sorted(s for s in saved[part] if s in now[part] and now[part][s] != saved[part][s])
        assert not changed, (
            f"{part}: {changed} now resolve to another configuration than their committed records: see this "
            "module's docstring before changing a default"
        )
    # specs first committed later rest on the same defaults, pinned here (no need to regenerate per part)
    assert now["ppo_specs"][""] == saved["ppo_specs"][""], "the GTrXL base (the spec '') changed"
    assert now["variants"] == saved["variants"], "a variant's default options changed under the records"
    assert now["ppo"] == saved["ppo"], (
        "PPO's defaults changed under the studies' records (their untuned recipe)"
    )
    assert now["dt"] == saved["dt"], "the DT's recipe defaults changed under the studies' records"
    # the tripwire can fire: the candidate is another model than the default it may replace
    assert saved["ppo_specs"]["position=rope"] != saved["ppo_specs"][""]


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(json.dumps(resolved_defaults(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
