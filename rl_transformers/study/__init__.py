"""The encoder study (issue 14): every attention variant as a policy encoder, online (PPO) and offline (DT).

- :mod:`~rl_transformers.study.suite` - tasks, budgets, presets;
- :mod:`~rl_transformers.study.encoders` - registry expansion, positional rule, parameter matching;
- :mod:`~rl_transformers.study.launch` - jobs, resume, local pool and Ray;
- :mod:`~rl_transformers.study.worker` - one run in a subprocess (calls the trainers' ``train``);
- :mod:`~rl_transformers.study.aggregate` - rliable statistics;
- :mod:`~rl_transformers.study.report` - encoders.{md,json}, encoders_aggregate.json, plots.

The CLI is ``scripts/encoder_study.py`` (:class:`~rl_transformers.study.run.StudyConfig`).
"""
