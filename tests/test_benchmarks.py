"""Every `hogkit bench` scenario imports and has the scenario interface (timing itself
is measured in benchmarks/, never asserted in tests)."""

from __future__ import annotations

import importlib

import pytest

from hogkit.cli import BENCH_SCENARIOS


@pytest.mark.parametrize("name", BENCH_SCENARIOS)
def test_scenario_has_run_and_format_table(name):
    mod = importlib.import_module(f"hogkit.benchmarks.{name}")
    assert callable(mod.run) and callable(mod.format_table)
    assert mod.__doc__
