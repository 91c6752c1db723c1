"""The run infrastructure the PPO and Decision Transformer trainers share: one lifecycle for every run.

Import each name from the module that defines it (the package exports nothing):

- :mod:`~rl_transformers.runs.config` - ``RunConfig``, the run flags both trainers have (``--run-root``, ``--seed``,
  ``--resume``, ...) and what a resume may change;
- :mod:`~rl_transformers.runs.lifecycle` - ``train_run`` (start, resume, train, finish) and ``RunResult``;
- :mod:`~rl_transformers.runs.run` - one run directory's bookkeeping (config, logger, checkpoints, evaluations);
- :mod:`~rl_transformers.runs.run_dirs` - fresh run directories, claimed atomically;
- :mod:`~rl_transformers.runs.checkpoint` - atomic checkpoint saves and the ``step_<n>`` / ``last`` / ``best``
  manager; :mod:`~rl_transformers.runs.checkpoint_load` - the safe loader (tensors only) and a run's newest
  loadable checkpoint;
- :mod:`~rl_transformers.runs.resume` - ``--resume``: flags default to the saved config;
- :mod:`~rl_transformers.runs.ledger` - a resumable job folder's ``job.json``: the request it was started for and the
  steps it resumed from;
- :mod:`~rl_transformers.runs.lock` - a run's ``run.lock`` (one process per run directory);
- :mod:`~rl_transformers.runs.paths` - run directories and files that are links are refused;
- :mod:`~rl_transformers.runs.provenance` - commit, machine and command of a run;
- :mod:`~rl_transformers.runs.distributed` - data-parallel processes (``torchrun``) and their collectives.
"""
