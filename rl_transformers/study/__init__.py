"""The encoder study: every attention variant as a policy encoder, online (PPO) and offline (DT).

Plan and run (the screening stage, ``scripts/encoder_study.py``, :class:`~rl_transformers.study.run.StudyConfig`):

- :mod:`~rl_transformers.study.suite` - tasks, budgets, presets;
- :mod:`~rl_transformers.study.encoders` - registry expansion, positional rule, parameter matching;
- :mod:`~rl_transformers.study.ranges` - the values a record can hold for its task;
- :mod:`~rl_transformers.study.records` - jobs and job keys (no checkout path), record validation, restore of the
  committed records;
- :mod:`~rl_transformers.study.launch` - making and running jobs: local pool and Ray;
- :mod:`~rl_transformers.study.joblock` - a job's ``running.lock`` (one job never runs twice);
- :mod:`~rl_transformers.study.attempts` - an interrupted PPO run resumes from its checkpoint;
- :mod:`~rl_transformers.study.worker` - one run in a subprocess (calls the trainers' ``train``);
- :mod:`~rl_transformers.study.progress` - the progress bar / lines over jobs, ETA from measured rates;
- :mod:`~rl_transformers.study.run` - the driver: plan a preset, run the unfinished jobs, rebuild the documents.

Documents of the screening stage:

- :mod:`~rl_transformers.study.files` - the document names under ``--docs``;
- :mod:`~rl_transformers.study.aggregate` - rliable statistics;
- :mod:`~rl_transformers.study.report` - encoders_screening.{md,json} and its aggregate;
- :mod:`~rl_transformers.study.summary` - the findings in words, from the same aggregates;
- :mod:`~rl_transformers.study.notes` - the page's method, notes and caveat, numbers computed from the records;
- :mod:`~rl_transformers.study.plots` - the plots (learning curves as small multiples per family).

Tuning (the optional stage: ``scripts/tune.py``, :mod:`rl_transformers.tune`):

- :mod:`~rl_transformers.study.knobs` - each encoder's context knob (shared with the memory probe and the tuner);
- :mod:`~rl_transformers.study.tuning_space` - the tuning search space;
- :mod:`~rl_transformers.study.tuning_checks` - tuned parameters and values read back as data, checked;

The offline memory table (``scripts/offline_memory.py``):

- :mod:`~rl_transformers.study.offline_memory` - rows, jobs and estimates of the T-Maze table;
- :mod:`~rl_transformers.study.offline_memory_report` - offline_memory.{md,json} and the study's offline section;
- :mod:`~rl_transformers.study.offline_memory_run` - run, dry-run or rebuild the table.

Side-by-side with the ecosystem (``scripts/compare_peer.py``):

- :mod:`~rl_transformers.study.peer_ppo` - sb3-contrib's RecurrentPPO with rl-baselines3-zoo's recipe;
- :mod:`~rl_transformers.study.peer_compare` - the paired runs of both libraries;
- :mod:`~rl_transformers.study.peer_report` - learning.md, generated from their records.
"""
