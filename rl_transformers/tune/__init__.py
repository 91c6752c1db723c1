"""Hyper-parameter tuning of any encoder on any task with Optuna: ``rlt tune`` (``scripts/tune.py``).

- :mod:`~rl_transformers.tune.command` - the command: its flags (:class:`~rl_transformers.tune.tuner.TuneConfig`)
  and output;
- :mod:`~rl_transformers.tune.seeds` - tuning seeds, disjoint from the test seeds (checked);
- :mod:`~rl_transformers.tune.study_check` - reading a tuning study back: every trial checked, storage errors;
- :mod:`~rl_transformers.tune.tuner` - the Optuna study: TPE sampler, median pruner, resumable SQLite storage.

Tuning sits on top of the encoder study: it tunes the study's encoders (:mod:`rl_transformers.study.encoders`)
in the study's search space (:mod:`rl_transformers.study.tuning_space`, with each encoder's context knob from
:mod:`rl_transformers.study.knobs`) and checks what it reads back with :mod:`rl_transformers.study.tuning_checks`;
the study's confirmation stage reads tuned values with the same space and checks, so nothing of the study imports
this package.
"""
