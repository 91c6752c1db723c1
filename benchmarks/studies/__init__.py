"""The code of the benchmark studies (each driven by one ``benchmarks/<name>.py``):

- :mod:`~benchmarks.studies.ppo_throughput` - PPO env steps/s per attention (``measure_throughput.py``)
- :mod:`~benchmarks.studies.ppo_profile` - where a PPO update's time goes (``profile_ppo.py``)
- :mod:`~benchmarks.studies.ppo_reference` - PPO vs cleanrl's ppo_trxl at an equal parameter count
  (``bench_ppo_vs_cleanrl.py``)
- :mod:`~benchmarks.studies.dt_models` / :mod:`~benchmarks.studies.dt_timing` - the Decision Transformer vs
  Hugging Face / d3rlpy (``bench_dt_throughput.py``)
- :mod:`~benchmarks.studies.dt_long` - the DT at long context, per row of the offline memory table
  (``bench_dt_long_context.py``)
- :mod:`~benchmarks.studies.gpu_suite` / :mod:`~benchmarks.studies.gpu_report` - the GPU suite and its page
  (``bench_gpu.py``, ``gpu/run.sh``)
- :mod:`~benchmarks.studies.meta` - a table's load line (the machine record is ``rl_transformers.runs.provenance``)
"""
