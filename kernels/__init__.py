"""numba kernels of hogkit, installed as ``hogkit.kernels``. Pure functions on arrays
and scalars; nothing here imports hogkit.

One module per family, every kernel ``@njit(cache=True, nogil=True)`` with its own
``fastmath`` flags where it is called, not inlined (numba gives a kernel that states
none its first caller's flags and caches that build: ``delayed.py``), checked by
nobody but its caller (``hogkit.rules.core``, ``hogkit.rules.density``, ``hogkit.engine.step``,
``hogkit.doctor``):

- ``sparse``: ``sgd_rows``, ``momentum_rows`` (row updates, duplicates add up);
- ``dense``: ``sgd_flat``, ``momentum_flat`` (axpy over a flat buffer);
- ``delayed``: staleness-aware, DC-ASGD (constant, adaptive), Gap-Aware, each
  ``*_flat`` and ``*_rows``;
- ``rule``: one dispatch of a rule kind to those (``apply_rows``, ``apply_flat``);
- ``density``: fold / select (top-k, threshold, random) / split of an update, and the
  whole filter of one parameter's rows (``filter_rows``);
- ``guard``: ``all_finite``, ``finite_prefix``;
- ``exchange``: ``take_changed_rows`` (what a cluster node sends);
- ``clock``: the per-worker clock slots, the policy row, and every definition read
  from them (clock lag, others' updates, the one admission state machine ``admit``
  that every engine's policy check runs: SSP, DSSP's grant, bounded delay);
- ``layout``: the control arrays the engines share (the step core's ``cfg``, ``rt``,
  ``io`` and return codes; the simulator's state columns and codes);
- ``pacer``: a straggler's extra time per step (``pace_ns``, ``load_factor``);
- ``staleness``: recording an event in the staleness log;
- ``mf``, ``logreg``: the workloads' samplers and gradients (the step core protocol);
- ``rowvec``: mf's per-sample SGD and row-wise AdaGrad / RMSProp spans and its
  minibatch gradient with read copies as straight-line LLVM vector code;
- ``gapvec``: the gap pass and Gap-Aware's and adaptive DC-ASGD's update passes, the
  same way (the numba loops' bits);
- ``step``: the compiled step core (n whole steps per call), ``sim``: the simulator's
  event loop around the same step;
- ``probe``: ``line_pingpong``, a cache line passed between two threads (the time a
  hand-over between two cores takes: ``hogkit doctor``);
- ``_intrinsics``: ``prefetch``, ``sqrt``, ``uint_bits``, ``monotonic_ns``, ``cas``,
  ``load_acquire``, ``store_release``;
- ``_aliases``: a repair of numba's alias analysis (an array unpacked from a tuple
  argument is the argument's), registered on import, before any kernel compiles.

**Caches.** numba validates a cached function against its own source file only, but
the step core and the event loop inline kernels from the other modules. So that an edit
to any kernel source can never run against stale machine code, importing this package
removes every cached index and object file of these modules that is older than the
newest kernel source
(:func:`_drop_stale_caches`; a fresh install has none).
"""

import glob
import os

from . import _aliases  # noqa: F401  (registers the repair before anything compiles)

_HERE = os.path.dirname(os.path.abspath(__file__))


def _cache_dirs():
    """Where numba keeps this package's caches: the in-tree ``__pycache__`` and, when
    set, ``NUMBA_CACHE_DIR`` (numba puts a subfolder per source folder there)."""
    dirs = [os.path.join(_HERE, "__pycache__")]
    root = os.environ.get("NUMBA_CACHE_DIR")
    if root:
        dirs += glob.glob(os.path.join(root, "*kernels*"))
    return [d for d in dirs if os.path.isdir(d)]


def _drop_stale_caches():
    try:
        newest = max(os.path.getmtime(p) for p in glob.glob(os.path.join(_HERE, "*.py")))
        for d in _cache_dirs():
            for path in glob.glob(os.path.join(d, "*.nb[ic]")):
                if os.path.getmtime(path) < newest:
                    try:
                        os.remove(path)
                    except OSError:
                        pass
    except (OSError, ValueError):   # pragma: no cover - an unreadable tree: numba decides
        pass


_drop_stale_caches()
