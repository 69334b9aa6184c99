"""LLVM intrinsics and a libc clock that the kernels need and numba does not expose.

- ``prefetch(A, r, j)``: ``llvm.prefetch`` (write intent, high locality) of the cache
  line holding ``A[r, j]``; ``prefetch_row(A, r)`` fetches every line of row ``r``.
  The row kernels prefetch the row 8 batch entries ahead: random rows of a table far
  beyond L3 are latency-bound otherwise (about 1.4x faster on a 256 MB table).
- ``sqrt(x)``: ``llvm.sqrt`` (IEEE square root, correctly rounded like ``math.sqrt``).
  numba lowers ``math.sqrt`` / ``np.sqrt`` to a call of libm ``sqrt``/``sqrtf``,
  which keeps LLVM from vectorising the loop around it; the intrinsic does not.
  The argument must not be negative (the callers take roots of sums of squares).
- ``uint_bits(x)``: a float32 / float64 array viewed as uint32 / uint64 (same
  bytes; the width is picked when the kernel is typed). A float's magnitude orders
  like its bits with the sign bit cleared, which lets ``density.topk_mask`` select
  on integer keys (radix select, no comparison branches).
- ``monotonic_ns()``: ``clock_gettime(CLOCK_MONOTONIC)`` in ns, the clock of Python's
  ``time.monotonic_ns()`` (system-wide on Linux, so comparable across processes).
  numba has no clock; libc's ``clock_gettime`` is a vDSO call (~20 ns), and a libc
  symbol keeps the kernel cacheable.

- ``sched_yield()``: libc's ``sched_yield``: a spinning waiter gives its core to a
  runnable peer (more workers than cores), and returns at once when there is none.
- ``cas(A, j, expected, new)``: atomic compare-and-swap of the integer ``A[j]`` (LLVM
  ``cmpxchg``, sequentially consistent on success and failure): if ``A[j] ==
  expected`` it becomes ``new``; returns the value ``A[j]`` held before, so the swap
  happened iff the result equals ``expected``. Atomic across threads and across
  processes that map the same shared memory (x86-64 ``lock cmpxchg``); also a full
  fence, so plain loads after it see what other CASes published before it. numba has
  no atomics; the block scheduler (``blocks.py``) claims blocks with it.

- ``load_acquire(A, j)`` / ``store_release(A, j, v)``: an atomic load (acquire) and
  store (release) of the integer ``A[j]`` (``A`` 1-D and aligned, writable for the
  store; ``0 <= j < len(A)``, not checked): a spinning reader sees another thread's or
  process's store (a plain load in a loop may be read once and kept in a register),
  and what was written before a release is seen after the acquire that reads it.
  Plain ``mov`` instructions on x86-64: the probe of a cache line's hand-over time
  (``probe.py``) spins on them.

With ``NUMBA_DISABLE_JIT=1`` all eight are plain Python (a no-op, ``math.sqrt``,
``ndarray.view``, ``time.monotonic_ns``, ``os.sched_yield``, a compare-then-store
that is *not* atomic: one interpreted process only, and plain indexing), so the
kernels still run, interpreted, for coverage.

``FASTMATH``, the kernels' fast-math flags, is defined here too, at the bottom of every
kernel family: a called kernel states its flags (numba gives one that states none its
first caller's and caches that build: ``delayed.py``), and most state these.
"""

import math
import os
import time

import numpy as np

from numba import njit
from numba.core import config

#: the kernels' arithmetic flags (see ``step.py``): reassociation only
FASTMATH = {"reassoc"}

if config.DISABLE_JIT:
    def prefetch(A, r, j):
        return None

    def sqrt(x):
        return math.sqrt(x)

    def uint_bits(x):
        return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint64)

    def monotonic_ns():
        return time.monotonic_ns()

    def sched_yield():
        os.sched_yield()

    def cas(A, j, expected, new):
        old = A[j]
        if old == expected:
            A[j] = new
        return old

    def load_acquire(A, j):
        return A[j]

    def store_release(A, j, v):
        A[j] = v

else:
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    @intrinsic
    def prefetch(typingctx, A, r, j):
        sig = types.void(A, r, j)

        def codegen(context, builder, signature, args):
            aryty = signature.args[0]
            ary = context.make_array(aryty)(context, builder, args[0])
            idx = [context.cast(builder, v, t, types.intp)
                   for v, t in zip(args[1:], signature.args[1:])]
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx)
            i8p = builder.bitcast(ptr, ir.IntType(8).as_pointer())
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p.type, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            builder.call(fn, [i8p, i32(1), i32(3), i32(1)])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def sqrt(typingctx, x):
        if not isinstance(x, types.Float):
            return None
        sig = x(x)

        def codegen(context, builder, signature, args):
            fn = builder.module.declare_intrinsic("llvm.sqrt", [args[0].type])
            return builder.call(fn, args)

        return sig, codegen

    @intrinsic
    def monotonic_ns(typingctx):
        sig = types.int64()

        def codegen(context, builder, signature, args):
            i64, i32 = ir.IntType(64), ir.IntType(32)
            ts_t = ir.LiteralStructType([i64, i64])          # struct timespec on x86-64
            ts = cgutils.alloca_once(builder, ts_t)
            fnty = ir.FunctionType(i32, [i32, ts_t.as_pointer()])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "clock_gettime")
            builder.call(fn, [i32(1), ts])                   # CLOCK_MONOTONIC = 1
            sec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 0))
            nsec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 1))
            return builder.add(builder.mul(sec, i64(1_000_000_000)), nsec)

        return sig, codegen

    @intrinsic
    def sched_yield(typingctx):
        sig = types.void()

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(32), [])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "sched_yield")
            builder.call(fn, [])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def cas(typingctx, A, j, expected, new):
        if not (isinstance(A, types.Array) and A.ndim == 1
                and isinstance(A.dtype, types.Integer) and isinstance(j, types.Integer)
                and isinstance(expected, types.Integer) and isinstance(new, types.Integer)):
            return None
        sig = A.dtype(A, j, expected, new)

        def codegen(context, builder, signature, args):
            aryty, jty, ety, nty = signature.args
            ary = context.make_array(aryty)(context, builder, args[0])
            j = context.cast(builder, args[1], jty, types.intp)
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [j])
            cmp = context.cast(builder, args[2], ety, aryty.dtype)
            val = context.cast(builder, args[3], nty, aryty.dtype)
            pair = builder.cmpxchg(ptr, cmp, val, "seq_cst", "seq_cst")
            return builder.extract_value(pair, 0)

        return sig, codegen

    def _int_item(A, j):
        """A 1-D, aligned array of integers indexed by an integer: what an atomic access
        of its natural alignment may take (an unaligned one is not atomic)."""
        return (isinstance(A, types.Array) and A.ndim == 1 and A.aligned
                and isinstance(A.dtype, types.Integer) and isinstance(j, types.Integer))

    def _item_pointer(context, builder, signature, args):
        aryty, jty = signature.args[:2]
        ary = context.make_array(aryty)(context, builder, args[0])
        j = context.cast(builder, args[1], jty, types.intp)
        return cgutils.get_item_pointer(context, builder, aryty, ary, [j])

    @intrinsic
    def load_acquire(typingctx, A, j):
        if not _int_item(A, j):
            return None
        sig = A.dtype(A, j)

        def codegen(context, builder, signature, args):
            ptr = _item_pointer(context, builder, signature, args)
            return builder.load_atomic(ptr, "acquire", signature.args[0].dtype.bitwidth // 8)

        return sig, codegen

    @intrinsic
    def store_release(typingctx, A, j, v):
        if not (_int_item(A, j) and A.mutable and isinstance(v, types.Integer)):
            return None
        sig = types.void(A, j, v)

        def codegen(context, builder, signature, args):
            ptr = _item_pointer(context, builder, signature, args)
            dt = signature.args[0].dtype
            val = context.cast(builder, args[2], signature.args[2], dt)
            builder.store_atomic(val, ptr, "release", dt.bitwidth // 8)
            return context.get_dummy_value()

        return sig, codegen

    from numba.extending import overload

    def uint_bits(x):
        return x.view(np.uint32 if x.dtype.itemsize == 4 else np.uint64)

    @overload(uint_bits)
    def _uint_bits(x):
        if not isinstance(x, types.Array) or not isinstance(x.dtype, types.Float):
            return None
        it = np.uint32 if x.dtype.bitwidth == 32 else np.uint64
        return lambda x: x.view(it)


@njit(cache=True, nogil=True, inline="always")
def prefetch_row(A, r):
    """Prefetch every 64-byte line of row ``r`` of the 2-D array ``A``. Inlined, and
    without a division (a ``range`` with a computed step divides): as a call it cost
    ~3 ns a row, more than a one-column row's update (logreg's weights)."""
    size = A.itemsize
    step = 16 if size == 4 else (8 if size == 8 else max(1, 64 // size))
    d = A.shape[1]
    j = 0
    while j < d:
        prefetch(A, r, j)
        j += step
