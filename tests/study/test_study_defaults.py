"""A tripwire for the study's committed records: a job's key hashes the encoder's spec *string* and the PPO
overrides only, and specs are relative to the library's defaults ("" is the GTrXL default, ``memory=knn``
keeps its attention and positions, ``position=rope`` is the candidate). A changed default would silently give
the committed records of both editions another meaning (and make ``gtrxl_rope`` the same model as ``gtrxl``).
So every confirmation row must still resolve to the configuration its records were measured with.

Changing a default on purpose (issue 27 point 5: "defaults that follow the evidence") therefore needs the
study's specs pinned to what they meant (explicit specs, with the committed keys migrated as
``records.legacy_key_matches`` does for DT dataset roots); then regenerate the snapshot:
``python tests/study/test_study_defaults.py``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).with_name("data") / "study_defaults.json"


def resolved_defaults() -> dict[str, Any]:
    """Each confirmation row's resolved policy configuration (candidates included) and PPO's defaults."""
    from rl_transformers.algos.ppo_config import PPOConfig
    from rl_transformers.study import confirm_plan as cp
    from rl_transformers.study.encoders import policy_config

    rows = {e.name: {"spec": e.spec, "policy": dataclasses.asdict(policy_config(e.spec))}
            for e in [*cp.encoder_rows(), *cp.CANDIDATES]}  # fmt: skip
    resolved = {"rows": rows, "ppo": dataclasses.asdict(PPOConfig())}
    return json.loads(json.dumps(resolved, sort_keys=True))  # tuples as lists, as stored


def test_every_study_row_still_means_what_its_records_were_measured_with() -> None:
    saved = json.loads(SNAPSHOT.read_text())
    now = resolved_defaults()
    changed = sorted(name for name in saved["rows"] if now["rows"].get(name) != saved["rows"][name])
    assert not changed, (
        f"study rows {changed} now resolve to another configuration than their committed records: see this "
        "module's docstring before changing a default"
    )
    assert sorted(now["rows"]) == sorted(saved["rows"]), "rows added or removed: regenerate the snapshot"
    assert now["ppo"] == saved["ppo"], "PPO's defaults changed under the study's records (its untuned recipe)"
    # the tripwire can fire: the candidate is another model than the default it may replace
    assert saved["rows"]["gtrxl_rope"]["policy"] != saved["rows"]["gtrxl"]["policy"]


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(json.dumps(resolved_defaults(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
