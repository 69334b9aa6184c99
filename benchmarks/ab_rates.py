"""Samples/s of one workload, live, at two revisions side by side (an A/B of a change).

    PYTHONPATH=<checkout of revision A> python benchmarks/ab_rates.py logreg 2.0 1 2
    PYTHONPATH=<checkout of revision B> python benchmarks/ab_rates.py logreg 2.0 1 2

Arguments: workload, lr, worker counts. Each worker count runs 3 times for 3 s
(``eval_every=None``); prints the hogkit path in use and ``workers [M samples/s...]``
per line. Alternate A and B runs: this machine's rate drifts between minutes.

``PYTHONPATH`` swaps ``hogkit`` but not ``hogkit.kernels`` where hogkit is installed
editable from another tree: the editable install's finder maps ``hogkit.kernels`` to
that tree's ``kernels/``, and a checkout has no ``hogkit/kernels`` folder to shadow it.
The first line printed names both files; for a change to ``kernels/``, run each
revision from its own venv, or swap the changed files in place between runs.
"""

import sys


def main():
    import hogkit
    from hogkit import SGD, train
    workload, lr, *workers = sys.argv[1:]
    import hogkit.kernels
    print(hogkit.__file__, hogkit.kernels.__file__)
    for w in map(int, workers):
        rates = []
        for _ in range(3):
            r = train(workload, workers=w,
                      outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                      seconds=3, rule=SGD(float(lr)))
            rates.append(round(r.extra["samples"] / r.wall_s / 1e6, 2))
        print(w, rates, r.extra["engine"], flush=True)


if __name__ == "__main__":
    main()
