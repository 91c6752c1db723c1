"""The project's own benchmark studies, beside the library and not installed (a checkout imports this folder as
``benchmarks``): the drivers ``benchmarks/<name>.py`` (run as ``python benchmarks/<name>.py``), their code in
:mod:`benchmarks.studies`, the GPU suite's machine scripts in ``gpu/`` and the published results in ``results/``
(benchmarks/README.md). The attention harness a user runs on their own variants is the package's
:mod:`rl_transformers.bench`."""
