"""Benchmark scenarios, installed as ``hogkit.benchmarks`` and run by ``hogkit bench``.

Each scenario module has ``run(quick=False) -> dict`` (raw figures plus a ``ratios``
object against a baseline measured in the same run) and ``format_table(result)``.
Results and the exact commands are recorded in ``benchmarks/RESULTS.md``."""
