"""Hyper-parameter tuning of any encoder on any task with Optuna (issue 27): ``scripts/tune.py``.

- :mod:`~rl_transformers.tune.knobs` - the context knob of each encoder (shared with the memory probe);
- :mod:`~rl_transformers.tune.seeds` - tuning seeds, disjoint from the test seeds (checked);
- :mod:`~rl_transformers.tune.space` - the search space and its validation;
- :mod:`~rl_transformers.tune.study` - the Optuna study: TPE sampler, median pruner, resumable SQLite storage.
"""
