"""Comparing encoders: any registered encoder as a policy encoder, online (PPO) and offline (DT), on any task.

The general tool (``scripts/encoder_study.py``, :func:`~rl_transformers.study.run.main`): a plan (encoders x tasks
x seeds x budget; tuning as an optional stage), local-pool and Ray launchers, resumable records whose job keys
hash the job's contents (no checkout path), the rliable aggregate and a report. The concrete experiments built
on it live beside the library in ``experiments/<name>/`` (not installed): each is a short description of the
tasks, encoders and budgets it used, its own code, its command and its results.

Plan and run:

- :mod:`~rl_transformers.study.flags` - the flags every driver shares (out, docs, seeds, workers, timeout, dry
  run, report only, restore) and what they share: restoring the committed records, refusing to lose them, the
  rebuild command;
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
- :mod:`~rl_transformers.study.run` - the driver: plan a preset, run the unfinished jobs, rebuild the documents
  (an experiment adds its page text and a part of its own with a :class:`~rl_transformers.study.run.Page`).

Documents:

- :mod:`~rl_transformers.study.files` - the document names under ``--docs``;
- :mod:`~rl_transformers.study.aggregate` - rliable statistics;
- :mod:`~rl_transformers.study.report` - the page and records ({md,json}) and its aggregate;
- :mod:`~rl_transformers.study.summary` - the findings in words, from the same aggregates;
- :mod:`~rl_transformers.study.plots` - the plots (learning curves as small multiples per family).

Tuning (the optional stage: ``scripts/tune.py``, :mod:`rl_transformers.tune`):

- :mod:`~rl_transformers.study.knobs` - each encoder's context knob (shared with the memory probe and the tuner);
- :mod:`~rl_transformers.study.tuning_space` - the tuning search space;
- :mod:`~rl_transformers.study.tuning_checks` - tuned parameters and values read back as data, checked.

The offline memory table, which the long-context DT benchmark (:mod:`rl_transformers.bench.dt_long`) measures
and ``experiments/offline_memory/`` runs:

- :mod:`~rl_transformers.study.offline_memory` - rows, recipe, tasks and jobs of the T-Maze table.

Side-by-side with the ecosystem (``scripts/compare_peer.py``):

- :mod:`~rl_transformers.study.peer_ppo` - sb3-contrib's RecurrentPPO with rl-baselines3-zoo's recipe;
- :mod:`~rl_transformers.study.peer_compare` - the paired runs of both libraries;
- :mod:`~rl_transformers.study.peer_report` - learning.md, generated from their records.
"""
