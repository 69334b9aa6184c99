"""What a run prints and draws: the staleness histogram on its real bins, the summary's
per-worker lists folded past 8 workers."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hogkit.cli import _fmt_per_worker
from hogkit.kernels.staleness import HIST_BINS, bin_low, bucket
from hogkit.report import hist_steps, plot_run


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**22), min_size=1, max_size=200))
def test_hist_steps_puts_every_read_in_the_bin_that_holds_its_value(values):
    """The plot's steps: contiguous edges from 0 on the recorder's own log-linear bins
    (one per value below 128, then 64 per doubling), each value counted in the step
    whose edges enclose it; what the summary stores ({bin's low: count}) draws back."""
    top = HIST_BINS - 1
    h = {}
    for v in values:
        low = bin_low(bucket.py_func(v, top))
        h[str(low)] = h.get(str(low), 0) + 1
    edges, counts = hist_steps(h)
    assert edges[0] == 0 and np.all(np.diff(edges) >= 1) and counts.sum() == len(values)
    for v in values:
        k = np.searchsorted(edges, v, side="right") - 1
        assert edges[k] <= v < edges[k + 1] and counts[k] > 0
    assert max(values) < edges[-1] and len(edges) == len(counts) + 1


def test_the_staleness_plot_draws_a_summary(tmp_path):
    s = {"staleness": {"update_gap": {"count": 3, "mean": 0.3, "p99": 1, "max": 1,
                                      "histogram": {"0": 2, "1": 1}},
                       "clock_lag": {"count": 3, "mean": 700, "p99": 900, "max": 900,
                                     "histogram": {"0": 1, "512": 1, "896": 1}}},
         "loss_curve": [{"t": 0, "loss": 1.0}, {"t": 1, "loss": 0.5}], "workers": 2,
         "config": {"workload": "mf", "policy": {"name": "async"}}}
    paths = plot_run(s, tmp_path)
    assert [p.split("/")[-1] for p in paths] == ["loss.png", "staleness.png"]


def test_per_worker_lists_fold_past_eight_workers():
    assert _fmt_per_worker([0.1, 0.2]) == "0.100, 0.200"
    line = _fmt_per_worker([0.01 * k for k in range(64)])
    assert line == ("mean 0.315, min 0.000 (worker 0), max 0.630 (worker 63) over 64 "
                    "workers")
    assert _fmt_per_worker([]) == "-"
