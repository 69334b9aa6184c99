"""Each worker's private training state, kept in shared memory so it outlives the worker.

A worker's rule state (momentum, DC-ASGD's and Gap-Aware's arrays and step counts), its
density residuals, its random stream and its sampler cursor used to live in the worker's
own memory: a restarted worker, or a resumed run, began them again from zero. Here they
live in one more store (``tag="wstate"``), created by the parent with one block per
worker:

- ``<rank>/rule/<key>`` and ``<rank>/density/<key>``: the arrays of ``rule.init`` and
  ``density.init``; the worker *binds* its state dicts to these views, so every update
  writes them in place (no copy, nothing to publish). A rule that keeps one state for
  every worker (``rule.shared_state``: Adam) has one block, ``shared/rule/<key>``,
  which every worker binds;
- ``<rank>/rng``: the worker's PCG64 state (``RNG_WORDS`` uint64-as-int64 words, word 0
  a "published" flag) and ``<rank>/cursor``: its sampler cursor; the worker *publishes*
  these, and the compiled core's own Gap-Aware step counts (into the rule state's
  ``k/<name>``), every 16th chunk of the compiled core (about every 16 ms), every 64
  iterations of the Python engine, and when it finishes.

A periodic checkpoint copies the store while the workers write (fuzzy, like the
parameters; a half-written 128-bit state is still a state of the same stream, the
stream's increment never changes). The final, quiesced checkpoint holds every worker's
exact state: resuming from it continues each worker's stream where it stopped, and a
one-worker run resumed from it computes the same parameters as one uninterrupted run.

What is not carried: a LocalSGD worker's private replica (a resumed or restarted
LocalSGD worker starts its phase from the shared model), an adaptive batch sizer's
history, and a straggler model's private generator.
"""

from __future__ import annotations

import os

import numpy as np

from hogkit.state.checkpoint import read, save

__all__ = ["FILE", "initial", "bind", "publish", "restore", "save_state", "load_state",
           "load_into"]

FILE = "worker_state.npz"
RNG_WORDS = 8
_MASK = (1 << 64) - 1


def initial(rule, density, params, workers) -> dict:
    """The store's arrays for ``workers`` workers, as a fresh run starts them (each
    ``init`` is called once: every worker's block starts from the same arrays, which
    the store copies in; a shared rule state is one block)."""
    shared = bool(getattr(rule, "shared_state", False))
    parts = {"rule": rule.init(params),
             "density": density.init(params) if density is not None else {}}
    rng, cursor = np.zeros(RNG_WORDS, np.int64), np.zeros(1, np.int64)
    out = {}
    if shared:
        out.update({f"{SHARED}/rule/{key}": a for key, a in parts.pop("rule").items()})
    for r in range(workers):
        for part, state in parts.items():
            for key, a in state.items():
                out[f"{r}/{part}/{key}"] = a
        out[f"{r}/rng"], out[f"{r}/cursor"] = rng, cursor
    return out


#: the owner of a state block every worker binds
SHARED = "shared"


def bind(views, rank, part) -> dict:
    """Worker ``rank``'s ``part`` (``"rule"`` or ``"density"``) state: the store's views
    under their ``init`` keys, written in place by every update (the shared block, when
    the store has one for ``part``)."""
    for owner in (SHARED, rank):
        prefix = f"{owner}/{part}/"
        got = {k[len(prefix):]: v for k, v in views.items() if k.startswith(prefix)}
        if got:
            return got
    return {}


def _words(rng) -> list:
    s = rng.bit_generator.state
    if s.get("bit_generator") != "PCG64":
        return []
    st, inc = s["state"]["state"], s["state"]["inc"]
    return [1, st & _MASK, st >> 64, inc & _MASK, inc >> 64,
            int(s["has_uint32"]), int(s["uinteger"])]


def publish(views, rank, *, rng=None, cursor=None, counts=None) -> None:
    """Write the worker's stream position and sampler cursor; ``counts``: ``(names, K,
    rule_state)``, the compiled core's Gap-Aware step counts, into the (bound) state."""
    if views is None:
        return
    if rng is not None:
        words = _words(rng)
        if words:
            row = views[f"{rank}/rng"].view(np.uint64)
            row[1:len(words)] = words[1:]
            row[0] = 1
    if cursor is not None:
        views[f"{rank}/cursor"][:cursor.size] = cursor
    if counts is not None:
        names, K, state = counts
        for i, n in enumerate(names):
            slot = state.get(f"k/{n}")
            if slot is not None:
                slot[0] = K[i]


def restore(views, rank, *, rng=None, cursor=None) -> bool:
    """Set ``rng`` and ``cursor`` to what ``rank`` published (restarted worker, resumed
    run); False when nothing was published (a fresh run: the seeded streams stand)."""
    if views is None:
        return False
    row = views[f"{rank}/rng"].view(np.uint64)
    if row[0] != 1:
        return False
    if rng is not None:
        w = [int(x) for x in row]
        rng.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": w[1] | (w[2] << 64), "inc": w[3] | (w[4] << 64)},
            "has_uint32": w[5], "uinteger": w[6]}
    if cursor is not None:
        cursor[...] = views[f"{rank}/cursor"][:cursor.size]
    return True


def save_state(folder, views, seq: int) -> None:
    """A copy of the store to ``folder/worker_state.npz`` (atomically), labelled ``seq``
    (the checkpoint it belongs to)."""
    save(os.path.join(folder, FILE), {k: np.array(v, copy=True) for k, v in views.items()},
         meta={"seq": int(seq)})


def load_state(folder, seq: int):
    """The saved arrays of ``folder`` if they belong to checkpoint ``seq``, else None
    (an older run, or a crash between the two files)."""
    path = os.path.join(folder, FILE)
    if seq is None or not os.path.exists(path):
        return None
    arrays, meta = read(path)
    return arrays if meta.get("seq") == seq else None


def load_into(views, arrays) -> list:
    """Copy the saved arrays that still fit (same name, shape and dtype) into the store;
    returns the names copied (a resume may change the rule or density: theirs start
    fresh)."""
    done = []
    for name, a in arrays.items():
        v = views.get(name)
        if v is not None and v.shape == a.shape and v.dtype == a.dtype:
            v[...] = a
            done.append(name)
    return done
