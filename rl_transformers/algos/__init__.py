"""Training algorithms: PPO for memory policies (online) and the Decision Transformer / BC trainer (offline).

Import each name from the module that defines it (the package exports nothing, so importing
``rl_transformers.algos.dt`` does not import PPO)::

    from rl_transformers.algos.ppo import PPOTrainer, train
    from rl_transformers.algos.ppo_config import PPOConfig, TrainConfig
    from rl_transformers.algos.dt import DTTrainer, train as train_dt
    from rl_transformers.algos.dt_config import DTConfig
    from rl_transformers.runs.lifecycle import RunResult

Modules: ``ppo`` (the trainer), ``ppo_config``, ``ppo_update`` (loss, Adam, epochs), ``ppo_logging``,
``ppo_checkpoint`` (checkpoint format, loading a trained policy), ``rollout``, ``storage`` (rollout storage,
GAE), ``evaluation``, ``env_util``; ``dt`` (the trainer), ``dt_config``, ``dt_data``, ``dt_setup``,
``dt_logging``, ``dt_checkpoint``, ``bc``; shared: ``recipes``, ``throughput``. The run lifecycle both trainers
share (directories, checkpoints, resume, locks, provenance, processes) is :mod:`rl_transformers.runs`.
"""
