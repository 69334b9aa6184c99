"""Propagation schedules: which piece of which layer goes on the wire next (P3).

**Why.** In a parameter-server iteration the backward pass emits gradients last layer
first, but the next forward pass needs parameters *first* layer first. Sending whole
layers in the order they were generated (MXNet's default store, the baseline) puts the
input-side layers, needed first, at the back of the queue, behind a few huge output-side
layers (VGG-19's fc6 alone is ~103 M parameters). P3 (Jayarajan et al., SysML 2019)
cuts every layer into slices of ``slice_size`` parameters (reference: 40,000) and sends
them in priority order, layers nearest the input first, preempting at slice boundaries,
so the next forward pass starts as soon as layer 0 is back while the big layers are
still on the wire.

**What.** A :class:`Schedule` decides two things, and nothing else:

- :meth:`Schedule.plan`: how each layer is cut into :class:`Message` s and which
  parameter-server shard each message belongs to (slices round-robin over the shards,
  as P3 does; a whole layer on one shard, except that a layer of more than
  ``big_array`` parameters is split evenly over all shards, as MXNet's store does with
  ``MXNET_KVSTORE_BIGARRAY_BOUND``);
- :meth:`Schedule.key`: the order a link sends what is queued on it (smaller first):
  generation order (FIFO) or ``(iteration, layer, slice)`` (priority: older
  iterations first, then input-side layers). A link picks its next message only when
  the current one is done: preemption happens at message boundaries, which is why
  priority without slicing still waits behind a whole fc6.

The four schedules the paper compares are :func:`fifo` (baseline), :func:`slicing`
(slices, FIFO order), :func:`priority` (whole layers, priority order) and :func:`p3`
(both). They are used by the communication model of the simulator
(:mod:`hogkit.p3.comm`), the live two-process demonstration (:mod:`hogkit.p3.live`) and
any real push path that sends layer pieces over a link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.validation import check_int

__all__ = ["Message", "Schedule", "fifo", "slicing", "priority", "p3", "parse_schedule",
           "SCHEDULES", "REFERENCE_SLICE", "BIG_ARRAY"]

#: P3's reference slice size (parameters), MXNet's slice threshold in the paper.
REFERENCE_SLICE = 40_000
#: MXNet's default ``MXNET_KVSTORE_BIGARRAY_BOUND``: arrays larger than this are split
#: evenly over the servers by the baseline store.
BIG_ARRAY = 1_000_000


class Message(NamedTuple):
    """One piece of one layer on the wire: parameters ``[offset, offset + size)`` of
    layer ``layer`` (0 = nearest the input), the ``index``-th piece of that layer,
    owned by parameter-server shard ``server``; ``uid`` numbers every piece of the
    model (0 ..  total pieces - 1)."""
    uid: int
    layer: int
    index: int
    offset: int
    size: int
    server: int


@dataclass(frozen=True)
class Schedule:
    """How layers are cut and in which order their pieces are sent.

    slice_size : parameters per slice, or None for whole layers.
    prioritized : send in ``(iteration, layer, slice)`` order (input side first)
        instead of generation order.
    big_array : for whole layers only, a layer of more than this many parameters is
        split evenly over all shards (the baseline store's behaviour); None: never.
    """
    name: str
    slice_size: Optional[int] = None
    prioritized: bool = False
    big_array: Optional[int] = BIG_ARRAY

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise InvalidType(f"schedule name={self.name!r} must be a non-empty str")
        if not isinstance(self.prioritized, bool):
            raise InvalidType(f"prioritized={self.prioritized!r} must be True or False")
        if self.slice_size is not None:
            check_int("slice_size", self.slice_size, min_value=1,
                      fix=f"P3's reference slice is {REFERENCE_SLICE} parameters")
        if self.big_array is not None:
            check_int("big_array", self.big_array, min_value=1)

    def plan(self, layer_sizes, servers: int = 1) -> list:
        """The messages of each layer: a list (one entry per layer, input side first)
        of lists of :class:`Message`, covering every parameter exactly once."""
        servers = check_int("servers", servers, min_value=1)
        sizes = check_layer_sizes(layer_sizes)
        out, uid, rr = [], 0, 0
        for layer, n in enumerate(sizes):
            if self.slice_size is not None:
                cuts = [(o, min(self.slice_size, n - o)) for o in range(0, n, self.slice_size)]
                owners = [(rr + j) % servers for j in range(len(cuts))]
                rr += len(cuts)
            elif self.big_array is not None and n > self.big_array and servers > 1:
                cuts = _even(n, servers)
                owners = list(range(len(cuts)))
            else:
                cuts = [(0, n)]
                owners = [rr % servers]
                rr += 1
            msgs = []
            for j, ((off, size), s) in enumerate(zip(cuts, owners)):
                msgs.append(Message(uid, layer, j, off, size, s))
                uid += 1
            out.append(msgs)
        return out

    def key(self, msg: Message, iteration: int, seq: int) -> tuple:
        """Sort key of a queued message (smaller is sent first); ``seq`` is the link's
        enqueue counter (generation order, which also breaks ties)."""
        if self.prioritized:
            return (iteration, msg.layer, msg.index, seq)
        return (seq,)

    @property
    def spec(self) -> str:
        """The string form :func:`parse_schedule` reads back (``"p3:40000"``)."""
        return self.name if self.slice_size is None else f"{self.name}:{self.slice_size}"

    def __str__(self):
        return self.spec


def _even(n, parts):
    """``n`` split into ``parts`` contiguous pieces as equal as possible (no empty
    piece: fewer parts when n < parts)."""
    parts = min(parts, n)
    q, r = divmod(n, parts)
    cuts, off = [], 0
    for j in range(parts):
        size = q + (1 if j < r else 0)
        cuts.append((off, size))
        off += size
    return cuts


def check_layer_sizes(layer_sizes) -> list:
    """Layer sizes as a list of positive ints (parameters per layer, input side first)."""
    try:
        sizes = list(layer_sizes)
    except TypeError:
        raise InvalidType(f"layer_sizes must be a sequence of ints, got "
                          f"{type(layer_sizes).__name__}") from None
    if not sizes:
        raise InvalidArgument("layer_sizes is empty; a model needs at least one layer "
                              "with parameters")
    return [check_int(f"layer_sizes[{i}]", n, min_value=1) for i, n in enumerate(sizes)]


def fifo() -> Schedule:
    """The baseline: whole layers, sent in the order the backward pass generates them."""
    return Schedule("fifo")


def slicing(slice_size: int = REFERENCE_SLICE) -> Schedule:
    """Slices of ``slice_size`` parameters, sent in generation order (slicing only)."""
    return Schedule("slicing", slice_size=slice_size)


def priority() -> Schedule:
    """Whole layers, input side first (priority only; a big layer still blocks)."""
    return Schedule("priority", prioritized=True)


def p3(slice_size: int = REFERENCE_SLICE) -> Schedule:
    """P3: slices, input side first, preempting at slice boundaries."""
    return Schedule("p3", slice_size=slice_size, prioritized=True)


SCHEDULES = {"fifo": fifo, "slicing": slicing, "priority": priority, "p3": p3}

_FORMS = '"fifo" | "slicing[:SIZE]" | "priority" | "p3[:SIZE]"'


def parse_schedule(spec) -> Schedule:
    """A :class:`Schedule` from a schedule or its string form (``"p3"``,
    ``"p3:50000"``, ``"slicing:40000"``, ``"fifo"``, ``"priority"``)."""
    if isinstance(spec, Schedule):
        return spec
    if not isinstance(spec, str):
        raise InvalidType(f"schedule={spec!r} must be a Schedule or one of {_FORMS}")
    name, colon, size = spec.strip().lower().partition(":")
    if name not in SCHEDULES:
        raise InvalidArgument(f"schedule={spec!r} is not one of {_FORMS}")
    if not colon:
        return SCHEDULES[name]()
    if name in ("fifo", "priority"):
        raise InvalidArgument(f"schedule={spec!r}: {name} sends whole layers and takes no "
                              f"slice size; use slicing:SIZE or p3:SIZE")
    try:
        n = int(size.strip())
    except ValueError:
        raise InvalidArgument(f"schedule={spec!r}: slice size {size!r} is not an int; "
                              f"e.g. p3:{REFERENCE_SLICE}") from None
    return SCHEDULES[name](n)
