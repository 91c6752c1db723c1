"""The encoder study: every attention variant as a policy encoder, online (PPO) and offline (DT).

- :mod:`~rl_transformers.study.suite` - tasks, budgets, presets;
- :mod:`~rl_transformers.study.encoders` - registry expansion, positional rule, parameter matching;
- :mod:`~rl_transformers.study.launch` - jobs, resume, local pool and Ray;
- :mod:`~rl_transformers.study.records` - job keys (no checkout path), record validation, restore of the
  committed records;
- :mod:`~rl_transformers.study.progress` - the progress bar / lines over jobs, ETA from measured rates;
- :mod:`~rl_transformers.study.worker` - one run in a subprocess (calls the trainers' ``train``);
- :mod:`~rl_transformers.study.aggregate` - rliable statistics;
- :mod:`~rl_transformers.study.report` - the screening stage: encoders_screening.{md,json}, its aggregate;
- :mod:`~rl_transformers.study.plots` - the plots (learning curves as small multiples per family);
- :mod:`~rl_transformers.study.probe` / :mod:`~rl_transformers.study.probe_grid` /
  :mod:`~rl_transformers.study.probe_report` / :mod:`~rl_transformers.study.probe_restore` - the supervised
  memory probe: one cell, the grid, its documents, restore of the committed cells;
- :mod:`~rl_transformers.study.notes` - the page's method, notes and caveat, numbers computed from the records.

The CLI is ``scripts/encoder_study.py`` (:class:`~rl_transformers.study.run.StudyConfig`).
"""
