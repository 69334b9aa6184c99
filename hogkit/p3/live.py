"""P3 on real processes: a trainer and a parameter server joined by a throttled link.

**Why.** The communication model (:mod:`hogkit.p3.comm`) predicts how much a propagation
schedule gains; this module checks the direction, and the size, against real processes
on this machine. :func:`run_live` spawns two processes:

- the **trainer** runs a torch model's forward and backward passes (one thread). As each
  layer's gradient is complete (``register_post_accumulate_grad_hook``) its pieces
  (the schedule's :meth:`~hogkit.p3.propagation.Schedule.plan`) are queued on the
  trainer's outgoing link; a forward pre-hook makes layer l wait until every piece of
  layer l has come back from the previous iteration;
- the **parameter server** applies each pushed piece (plain SGD) as it arrives and
  queues the updated values on its own outgoing link.

Each side's outgoing link is a :class:`PacedSender` on one end of a duplex pipe: one
message at a time, each holding the link for ``bytes / bandwidth`` seconds before it is
delivered whole (store and forward, as the model assumes), the next message picked by
the schedule's key when the link frees (preemption at message boundaries). Deadlines
are absolute, so a late wake-up does not slow a backlogged link down.

The trainer measures its iterations per second, each layer's wait, and the loss;
before the run it measures its own layer profile (:func:`hogkit.p3.profiles.from_module`,
``measure=True``) so that :func:`hogkit.p3.comm.simulate_comm` can predict the same run
(``predict=True``). At the end the server sends its parameters back and the trainer
checks they equal its own (every piece went up and came back once).
"""

from __future__ import annotations

import heapq
import os
import signal
import struct
import sys
import threading
import time
from typing import Optional

from hogkit.errors import HogkitError, InvalidArgument, InvalidType
from hogkit.p3.propagation import Schedule, parse_schedule
from hogkit.validation import check_float, check_int

__all__ = ["run_live", "reference_losses", "demo_module", "PacedSender", "LinkClosed"]

#: kind, layer, index, iteration, offset, size, last chunk of its message
_HEADER = struct.Struct("<BIIIQQB")
#: float32 values per chunk on a link (256 KiB)
CHUNK = 1 << 16
_INIT, _PUSH, _PULL, _STOP, _FINAL, _CPU = range(6)
_WAIT_S = 60.0          # the longest a layer waits for its parameters before giving up


class LinkClosed(HogkitError):
    """The other end of the link went away (its process died or closed it)."""


def demo_module(width: int = 2048, classes: int = 10):
    """The demonstration model: small, compute-heavy convolutions at the input side and
    one very wide fully connected layer at the output side (4096 → ``width``: 8.4 M
    parameters at the default), the shape that makes P3 matter (a small VGG)."""
    import torch.nn as nn
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, width), nn.ReLU(), nn.Linear(width, classes))


class PacedSender:
    """One outgoing link of ``bandwidth`` bytes/s over a ``multiprocessing``
    connection: a thread sends queued messages one at a time in key order (smaller
    first). A message is streamed in chunks of :data:`CHUNK` float32 values, each
    handed to the connection when the link would have finished transmitting it, so a
    message arrives whole ``4 × size / bandwidth`` seconds after it started, and the
    copies on both ends overlap the transmission as a network card's would.

    ``put(key, kind, layer, index, iteration, offset, size, source)``: ``source(lo,
    hi, out)`` writes values ``[lo, hi)`` of the layer into the float32 array ``out``
    (a view of the outgoing frame: one copy), called as the chunk goes out (the
    caller's thread does not pay for it). A failure in the thread is kept in
    ``error`` and handed to ``on_error`` at once. ``close()`` lets the queue drain,
    then raises that failure, or if the thread does not end in time: the owner may
    write on the connection only after ``close()`` returned.
    """

    def __init__(self, conn, bandwidth: float, name: str = "link", on_error=None):
        self._conn = conn
        self._bw = bandwidth
        self._on_error = on_error
        self._cv = threading.Condition()
        self._queue, self._seq, self._closing = [], 0, False
        self.error: Optional[BaseException] = None
        self.sent = 0
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, key, kind, layer, index, iteration, offset, size, source) -> None:
        with self._cv:
            self._seq += 1
            heapq.heappush(self._queue, (key, self._seq, kind, layer, index, iteration,
                                         offset, size, source))
            self._cv.notify()

    def _loop(self):
        import numpy as np
        t_free = time.perf_counter()
        try:
            while True:
                with self._cv:
                    while not self._queue and not self._closing:
                        self._cv.wait(timeout=1.0)       # re-checks; put/close notify
                    if not self._queue:
                        return
                    _, _, kind, layer, index, it, offset, size, source = \
                        heapq.heappop(self._queue)
                t = t_start = max(time.perf_counter(), t_free)
                end = offset + size
                for lo in range(offset, end, CHUNK):
                    hi = min(end, lo + CHUNK)
                    t += 4 * (hi - lo) / self._bw
                    frame = bytearray(_HEADER.size + 4 * (hi - lo))
                    _HEADER.pack_into(frame, 0, kind, layer, index, it, lo, hi - lo, hi == end)
                    source(lo, hi, np.frombuffer(frame, np.float32, hi - lo, _HEADER.size))
                    delay = t - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    self._conn.send_bytes(frame)
                self.sent += 1
                self.busy_s += t - t_start
                t_free = t
        except BaseException as e:  # noqa: BLE001 - reported by the owner
            self.error = e
            if self._on_error is not None:
                self._on_error(e)

    def close(self, timeout: float = _WAIT_S) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        if self._thread.is_alive():
            raise HogkitError(f"link thread {self._thread.name} did not drain its queue "
                              f"within {timeout:g} s")


# --------------------------------------------------------------------------- the model

def _demo(seed, batch, width):
    """The demonstration's model (seeded), its four batches, and its layers in order."""
    import torch

    from hogkit.p3.profiles import forward_layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = demo_module(width)
    data = torch.Generator().manual_seed(seed + 1)
    xs = [torch.randn(batch, 3, 32, 32, generator=data) for _ in range(4)]
    ys = [torch.randint(0, 10, (batch,), generator=data) for _ in range(4)]
    return model, xs, ys, forward_layers(model, xs[0])


def reference_losses(*, iterations: int, batch: int = 32, width: int = 2048,
                     lr: float = 0.05, seed: int = 0) -> list:
    """The losses the live run must reproduce: the same model, data and SGD in one
    process, no links (the live parameter server applies every piece of every
    iteration's gradient once, before that layer's next forward pass: the same
    arithmetic)."""
    import torch
    model, xs, ys, _ = _demo(seed, batch, width)
    losses = []
    for i in range(iterations):
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xs[i % 4]), ys[i % 4])
        loss.backward()
        losses.append(float(loss.detach()))
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(p.grad * lr)
    return losses


# --------------------------------------------------------------------------- server

def _copier(values):
    def source(lo, hi, out):
        out[:] = values[lo:hi]
    return source


def _server(conn, cfg):
    """The parameter server: SGD on every pushed piece, the new values sent back."""
    import numpy as np
    params = {}
    failed = []
    link = PacedSender(conn, cfg["bandwidth"], "server-link", on_error=failed.append)
    schedule = cfg["schedule"]
    pieces = cfg["pieces"]
    lr = np.float32(cfg["lr"])
    cpu0 = time.process_time()
    try:
        while True:
            frame = conn.recv_bytes()            # EOF when the trainer goes away
            if failed:
                raise failed[0]
            kind, layer, index, it, off, size, last = _HEADER.unpack_from(frame)
            if kind == _INIT:
                params[layer] = np.frombuffer(frame, np.float32, size, _HEADER.size).copy()
            elif kind == _PUSH:                  # SGD chunk by chunk, as it arrives
                w = params[layer][off:off + size]
                w -= lr * np.frombuffer(frame, np.float32, size, _HEADER.size)
                if last:
                    m = pieces[layer][index]
                    link.put(schedule.key(m, it, 0), _PULL, layer, index, it, m.offset,
                             m.size, _copier(params[layer]))
            elif kind == _STOP:
                link.close()
                for layer in sorted(params):
                    conn.send_bytes(_HEADER.pack(_FINAL, layer, 0, 0, 0, params[layer].size,
                                                 1) + params[layer].tobytes())
                cpu = np.array([time.process_time() - cpu0], np.float64)
                conn.send_bytes(_HEADER.pack(_CPU, 0, 0, 0, 0, 2, 1) + cpu.tobytes())
                conn.send_bytes(_HEADER.pack(_STOP, 0, 0, 0, 0, 0, 1))
                return
    except EOFError:
        return                               # the trainer went away; it reports why


# --------------------------------------------------------------------------- trainer

class _Trainer:
    """The trainer's side: flat parameter buffers per layer, the hooks, the receiver."""

    def __init__(self, conn, cfg):
        import torch
        self.torch = torch
        self.conn, self.cfg = conn, cfg
        self.schedule: Schedule = cfg["schedule"]
        self.model, self.xs, self.ys, layers = _demo(cfg["seed"], cfg["batch"], cfg["width"])
        self.names = [n for n, _ in layers]
        self.layers = [m for _, m in layers]
        # one flat float32 buffer per layer; the parameters become views of it
        self.flat = []
        for m in self.layers:
            ps = list(m.parameters(recurse=False))
            flat = torch.cat([p.detach().reshape(-1) for p in ps]).contiguous()
            off = 0
            for p in ps:
                p.data = flat[off:off + p.numel()].view_as(p)
                off += p.numel()
            self.flat.append(flat)
        self.sizes = [f.numel() for f in self.flat]
        if self.sizes != cfg["sizes"]:           # the server cuts by the parent's plan
            raise HogkitError(f"the trainer's layer sizes {self.sizes} differ from the "
                              f"plan's {cfg['sizes']}")
        self.pieces = cfg["pieces"]
        self.cv = threading.Condition()
        self.ver = [-1] * len(self.layers)
        self.seen = [set() for _ in self.layers]
        self.finals = {}
        self.stopped = False
        self.error: Optional[BaseException] = None
        self.it = 0
        self.wait_s = [0.0] * len(self.layers)
        self.counting = False
        self.server_cpu_s = float("nan")

    def fail(self, error):
        """Record the first failure (from the receiver or the sender thread) and wake
        every wait; a broken connection, seen on either side of the link, is the
        server gone."""
        if isinstance(error, (EOFError, ConnectionError)):
            error = _closed(error)
        with self.cv:
            if self.error is None:
                self.error = error
            self.cv.notify_all()

    # ---- receiver thread
    def receive(self):
        import numpy as np
        try:
            while True:
                frame = self.conn.recv_bytes()
                kind, layer, index, it, off, size, last = _HEADER.unpack_from(frame)
                body = np.frombuffer(frame, np.float32, size, _HEADER.size)
                if kind == _PULL:
                    self.flat[layer].numpy()[off:off + size] = body
                    if not last:
                        continue
                    with self.cv:
                        if it != self.ver[layer] + 1 or index in self.seen[layer]:
                            raise HogkitError(
                                f"piece {index} of layer {layer} came back for iteration "
                                f"{it} while iteration {self.ver[layer] + 1} was expected "
                                f"(or twice)")
                        self.seen[layer].add(index)
                        if len(self.seen[layer]) == len(self.pieces[layer]):
                            self.seen[layer].clear()
                            self.ver[layer] = it
                            self.cv.notify_all()
                elif kind == _FINAL:
                    self.finals[layer] = body.copy()
                elif kind == _CPU:
                    self.server_cpu_s = float(np.frombuffer(body.tobytes(), np.float64)[0])
                elif kind == _STOP:
                    with self.cv:
                        self.stopped = True
                        self.cv.notify_all()
                    return
        except BaseException as e:  # noqa: BLE001
            self.fail(e)

    def wait_for(self, layer, it):
        """Block until layer ``layer`` is back from iteration ``it``; returns the wait."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + _WAIT_S
        with self.cv:
            while self.ver[layer] < it and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HogkitError(f"layer {layer} ({self.names[layer]}) waited "
                                      f"{_WAIT_S:.0f} s for its parameters from iteration "
                                      f"{it}; the parameter server is not answering")
                self.cv.wait(timeout=left)
            if self.error is not None:
                raise self.error
        return time.perf_counter() - t0

    def run(self):
        """Train ``cfg["iterations"]`` iterations against the server; the figures."""
        profile = self.measure() if self.cfg["profile"] else None
        for layer, flat in enumerate(self.flat):
            self.send(_HEADER.pack(_INIT, layer, 0, 0, 0, flat.numel(), 1)
                      + flat.numpy().tobytes())
        link = PacedSender(self.conn, self.cfg["bandwidth"], "trainer-link",
                           on_error=self.fail)
        rx = threading.Thread(target=self.receive, name="trainer-rx", daemon=True)
        rx.start()
        params = [list(m.parameters(recurse=False)) for m in self.layers]
        left = [0] * len(self.layers)
        handles = self.hook(link, params, left)
        ends, losses, cpu = self.train(params, left)
        self.finish(link, rx, handles)
        return self.figures(ends, losses, cpu, link, profile)

    def send(self, frame):
        """A frame straight on the connection (before the link starts, after it is
        closed); a broken connection is the server gone (:class:`LinkClosed`)."""
        try:
            self.conn.send_bytes(frame)
        except (EOFError, ConnectionError) as e:
            raise _closed(e) from e

    def measure(self):
        """The model's layer profile, measured here (for the prediction)."""
        from hogkit.p3.profiles import from_module
        cross_entropy = self.torch.nn.functional.cross_entropy
        profile = from_module(self.model, self.xs[0], measure=True, repeats=5,
                              loss_fn=lambda out: cross_entropy(out, self.ys[0]),
                              name="p3-demo")
        names = [ly.name for ly in profile.layers]
        if names != self.names:                          # pragma: no cover - defensive
            raise HogkitError(f"profile order {names} != run order {self.names}")
        return profile

    def hook(self, link, params, left):
        """Layer l's forward pass waits for its parameters; its gradient, once every
        parameter's is accumulated (``left[l]`` counts down), goes out in pieces.
        Returns the hook handles."""
        def pre(layer):
            def fn(mod, inp):
                if self.it > 0:
                    w = self.wait_for(layer, self.it - 1)
                    if self.counting:
                        self.wait_s[layer] += w
            return fn

        def grad_done(layer):
            def fn(p):
                left[layer] -= 1
                if left[layer]:
                    return
                source = _gatherer([q.grad for q in params[layer]])
                for m in self.pieces[layer]:
                    link.put(self.schedule.key(m, self.it, 0), _PUSH, layer, m.index,
                             self.it, m.offset, m.size, source)
            return fn

        handles = []
        for layer, m in enumerate(self.layers):
            handles.append(m.register_forward_pre_hook(pre(layer)))
            for p in params[layer]:
                handles.append(p.register_post_accumulate_grad_hook(grad_done(layer)))
        return handles

    def train(self, params, left):
        """The iterations (the hooks exchange the parameters); ``(ends, losses, cpu)``:
        seconds since the start, the loss and the process CPU time after each."""
        loss_fn = self.torch.nn.functional.cross_entropy
        ends, losses, cpu = [], [], []
        t_start = time.perf_counter()
        for i in range(self.cfg["iterations"]):
            self.it = i
            self.counting = i > self.cfg["warmup"]
            for layer in range(len(self.layers)):
                left[layer] = len(params[layer])
            self.model.zero_grad(set_to_none=True)
            x, y = self.xs[i % 4], self.ys[i % 4]
            loss = loss_fn(self.model(x), y)
            loss.backward()
            losses.append(float(loss.detach()))
            ends.append(time.perf_counter() - t_start)
            cpu.append(time.process_time())
            if self.error is not None:
                raise self.error
        return ends, losses, cpu

    def finish(self, link, rx, handles):
        """The last replies, then the end of the run: the link drained, the server told
        to stop, its final parameters and CPU time received."""
        for layer in range(len(self.layers)):
            self.wait_for(layer, self.cfg["iterations"] - 1)
        for h in handles:
            h.remove()
        if self.error is not None:
            raise self.error
        link.close()
        self.send(_HEADER.pack(_STOP, 0, 0, 0, 0, 0, 1))
        rx.join(_WAIT_S)
        if self.error is not None:
            raise self.error
        if rx.is_alive() or not self.stopped:
            raise HogkitError(f"the parameter server did not confirm the end of the run "
                              f"within {_WAIT_S:.0f} s")

    def figures(self, ends, losses, cpu, link, profile) -> dict:
        """What :func:`run_live` returns (before the parent adds its settings)."""
        import numpy as np
        cfg = self.cfg
        agree = all(np.array_equal(self.finals.get(layer), self.flat[layer].numpy())
                    for layer in range(len(self.layers)))
        w = cfg["warmup"]
        steady = cfg["iterations"] - 1 - w
        iteration_s = (ends[-1] - ends[w]) / steady
        return {"iteration_s": iteration_s, "iterations_per_s": 1.0 / iteration_s,
                # CPU seconds per iteration (all threads): the trainer's in the steady
                # state, the server's over the whole run
                "trainer_cpu_s": (cpu[-1] - cpu[w]) / steady,
                "server_cpu_s": self.server_cpu_s / cfg["iterations"],
                "ends": ends, "losses": losses,
                "layer_wait_s": [x / steady for x in self.wait_s],
                "layers": self.names, "sizes": self.sizes,
                "messages_per_iteration": sum(len(p) for p in self.pieces),
                "link_busy_s": link.busy_s, "server_agrees": agree,
                "profile": profile.to_dict() if profile is not None else None}


def _closed(error) -> LinkClosed:
    return LinkClosed(f"the parameter server closed the link (it died or was killed): "
                      f"{type(error).__name__}")


def _gatherer(grads):
    """``source(lo, hi, out)``: values ``[lo, hi)`` of the layer's gradient (its
    parameters' gradients end to end) into ``out``."""
    flat = [g.reshape(-1).numpy() for g in grads]

    def source(lo, hi, out):
        pos = 0
        for g in flat:
            a, b = max(lo, pos), min(hi, pos + g.size)
            if a < b:
                out[a - lo:b - lo] = g[a - pos:b - pos]
            pos += g.size
    return source


def _set_process_name(name: str) -> None:
    """Name the process in /proc/<pid>/comm (what ``top`` and ``ps -o comm`` show)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(15, name.encode()[:15], 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _entry(role, conn, result, cfg, parent_pid):
    from hogkit.engine.entry import _die_with_parent, cap_threads
    cap_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    _set_process_name(f"p3-{role}")
    import torch
    torch.set_num_threads(1)
    try:
        if role == "server":
            _server(conn, cfg)
        else:
            result.send(("ok", _Trainer(conn, cfg).run()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        import traceback
        text = traceback.format_exc()
        if result is not None:
            result.send(("error", text))
        else:
            sys.stderr.write(f"hogkit p3 {role} failed:\n{text}")
            sys.stderr.flush()
        os._exit(1)


def run_live(schedule="p3", *, bandwidth: float = 200e6, iterations: int = 20,
             warmup: int = 3, batch: int = 32, width: int = 2048, lr: float = 0.05,
             seed: int = 0, profile: bool = True, predict: bool = True,
             timeout: float = 300.0) -> dict:
    """Train the demonstration model (:func:`demo_module`) for ``iterations``
    iterations with a trainer and a parameter server in two processes, each sending on
    a link of ``bandwidth`` bytes/s, in ``schedule`` order (a
    :class:`~hogkit.p3.propagation.Schedule` or ``"fifo"``, ``"slicing[:SIZE]"``,
    ``"priority"``, ``"p3[:SIZE]"``).

    Returns the trainer's figures: ``iteration_s`` (steady state: iterations
    ``warmup + 1`` to the last), ``layer_wait_s``, ``losses`` (equal to
    :func:`reference_losses`: every piece applied once), ``server_agrees`` (the
    server's final parameters equal the trainer's), CPU seconds per iteration of both
    processes, its measured ``profile`` (``profile=True``) and, with
    ``predict=True``, ``predicted_iteration_s`` from
    :func:`hogkit.p3.comm.simulate_comm` on that profile, bandwidth and schedule.
    Everything stops within ``timeout`` seconds (plus a few for the shutdown); a
    process that dies is reported with its exit code."""
    cfg, timeout = _live_config(schedule, bandwidth, iterations, warmup, batch, width, lr,
                                seed, profile, predict, timeout)
    schedule = cfg["schedule"]
    status = _spawn_and_wait(cfg, timeout)
    if status[0] != "ok":
        raise HogkitError(f"live P3 run ({schedule.spec}) failed:\n{status[1]}")
    out = status[1]
    out.update(schedule=schedule.spec, **{k: cfg[k] for k in (
        "bandwidth", "batch", "width", "iterations", "warmup", "seed", "lr")})
    if predict:
        out.update(_prediction(out, schedule, cfg["bandwidth"], cfg["iterations"],
                               cfg["warmup"]))
    return out


def _live_config(schedule, bandwidth, iterations, warmup, batch, width, lr, seed, profile,
                 predict, timeout):
    """:func:`run_live`'s arguments checked: ``(cfg, timeout)``, ``cfg`` what both
    processes follow (the settings, the layer sizes, the schedule's pieces of them)."""
    schedule = parse_schedule(schedule)
    bandwidth = check_float("bandwidth", bandwidth, min_value=0.0, exclude_min=True,
                            fix="bytes per second, e.g. 200e6")
    iterations = check_int("iterations", iterations, min_value=3)
    warmup = check_int("warmup", warmup, min_value=0, max_value=iterations - 2,
                       fix="at least one steady iteration must follow the warm-up")
    batch = check_int("batch", batch, min_value=1)
    width = check_int("width", width, min_value=1)
    lr = check_float("lr", lr, min_value=0.0, exclude_min=True)
    seed = check_int("seed", seed, min_value=0, max_value=2**31 - 2)
    timeout = check_float("timeout", timeout, min_value=0.0, exclude_min=True)
    for name, flag in (("profile", profile), ("predict", predict)):
        if not isinstance(flag, bool):
            raise InvalidType(f"{name}={flag!r} must be True or False")
    if predict and not profile:
        raise InvalidArgument("predict=True needs profile=True (the prediction runs on the "
                              "measured profile)")
    import torch

    from hogkit.p3.profiles import forward_layers
    with torch.device("meta"):                  # sizes only: no memory, no RNG use
        layers = forward_layers(demo_module(width), torch.empty(1, 3, 32, 32))
    sizes = [sum(p.numel() for p in m.parameters(recurse=False)) for _, m in layers]
    return {"schedule": schedule, "bandwidth": bandwidth, "iterations": iterations,
            "warmup": warmup, "batch": batch, "width": width, "lr": lr, "seed": seed,
            "profile": profile, "sizes": sizes, "pieces": schedule.plan(sizes, 1)}, timeout


def _spawn_and_wait(cfg, timeout):
    """Start the server and the trainer, wait for the trainer's result (or a death, or
    the timeout), then end both. ``("ok", figures)`` or ``("error", text)``."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe(duplex=True)
    res_r, res_w = ctx.Pipe(duplex=False)
    server = ctx.Process(target=_entry, args=("server", b, None, cfg, os.getpid()),
                         name="p3-server", daemon=True)
    trainer = ctx.Process(target=_entry, args=("trainer", a, res_w, cfg, os.getpid()),
                          name="p3-trainer", daemon=True)
    procs = [server, trainer]
    try:
        for p in procs:
            p.start()
        a.close()
        b.close()
        res_w.close()
        status = _wait_result(res_r, procs, trainer, timeout)
        if status[0] == "ok":
            for p in procs:
                p.join(10.0)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5.0)
            if p.is_alive():                              # pragma: no cover
                p.kill()
                p.join()
        res_r.close()
    return status


def _wait_result(res_r, procs, trainer, timeout):
    """The trainer's ``("ok", figures)`` or ``("error", text)`` from ``res_r``; an
    error when a process dies first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if res_r.poll(0.2):
            try:
                return res_r.recv()
            except EOFError:
                trainer.join(5.0)
                return ("error", f"{trainer.name} (exit {trainer.exitcode}) ended "
                                 f"without a result")
        dead = [f"{p.name} (exit {p.exitcode})" for p in procs
                if not p.is_alive() and p.exitcode != 0]
        if dead and not res_r.poll(0.5):
            return ("error", f"{', '.join(dead)} died before the run finished")
        if time.monotonic() > deadline:
            return ("error", f"the live run did not finish within {timeout:g} s")


def _prediction(out, schedule, bandwidth, iterations, warmup) -> dict:
    """:func:`hogkit.p3.comm.simulate_comm` on the measured profile: the predicted
    iteration time and layer waits, and the error against the measured time."""
    from hogkit.p3.comm import Network, simulate_comm
    from hogkit.p3.profiles import Profile
    prof = Profile.from_dict(out["profile"])
    sim = simulate_comm(prof, schedule, Network(bandwidth), workers=1, servers=1,
                        iterations=iterations, warmup=warmup + 1)
    return {"predicted_iteration_s": sim.iteration_s,
            "predicted_layer_wait_s": sim.layer_wait_s, "compute_s": prof.compute_s,
            "prediction_error": sim.iteration_s / out["iteration_s"] - 1.0}
