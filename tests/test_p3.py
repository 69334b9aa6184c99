"""P3: propagation schedules, layer profiles, the communication model and the live
two-process demonstration.

The model's properties are the issue's: no piece is sent twice or lost; with unlimited
bandwidth every schedule gives the compute-only iteration; P3 does not wait longer than
FIFO for layer 1 (up to the one slice in flight on each hop: P3 preempts at slice
boundaries). Hand-worked timelines pin the arithmetic."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hogkit.p3.comm import GBPS, Network, gains, simulate_comm
from hogkit.errors import HogkitError, InvalidArgument, InvalidType
from hogkit.p3.profiles import Profile, from_module
from hogkit.p3.propagation import (BIG_ARRAY, REFERENCE_SLICE, Schedule, fifo, p3,
                                parse_schedule, priority, slicing)
from hogkit.testing import layer_profiles, propagation_schedules

bounds = st.sampled_from([0, 1, 2, None])


# --------------------------------------------------------------------------- schedules

_cheap_schedules = st.one_of(st.just(fifo()), st.just(priority()),
                             st.integers(1000, 300_000).map(slicing),
                             st.integers(1000, 300_000).map(p3))


@given(st.lists(st.integers(1, 3_000_000), min_size=1, max_size=6), st.integers(1, 5),
       _cheap_schedules)
def test_plan_covers_every_parameter_once(sizes, servers, schedule):
    plan = schedule.plan(sizes, servers)
    assert len(plan) == len(sizes)
    uids = [m.uid for layer in plan for m in layer]
    assert uids == list(range(len(uids)))
    for layer, (n, msgs) in enumerate(zip(sizes, plan)):
        pos = 0
        for j, m in enumerate(msgs):
            assert (m.layer, m.index, m.offset) == (layer, j, pos) and m.size >= 1
            assert 0 <= m.server < servers
            if schedule.slice_size is not None:
                assert m.size <= schedule.slice_size
            pos += m.size
        assert pos == n
        if schedule.slice_size is None:       # whole layers: one piece, or one per shard
            big = n > BIG_ARRAY and servers > 1
            assert len(msgs) == (min(servers, n) if big else 1)


def test_slices_go_round_robin_over_shards_and_big_layers_split_evenly():
    plan = p3(4).plan([10, 3], servers=3)
    assert [(m.size, m.server) for m in plan[0]] == [(4, 0), (4, 1), (2, 2)]
    assert [(m.size, m.server) for m in plan[1]] == [(3, 0)]
    whole = fifo().plan([5, BIG_ARRAY + 2, 7], servers=2)
    assert [(m.size, m.server) for m in whole[1]] == [((BIG_ARRAY + 2) // 2, 0),
                                                    ((BIG_ARRAY + 2) // 2, 1)]
    assert [m.server for m in whole[0] + whole[2]] == [0, 1]


def test_priority_orders_input_side_first_fifo_by_generation():
    plan = p3(2).plan([4, 4], 1)
    late_layer0, early_layer1 = plan[0][1], plan[1][0]
    assert p3().key(late_layer0, 0, 9) < p3().key(early_layer1, 0, 1)
    assert p3().key(early_layer1, 0, 1) < p3().key(late_layer0, 1, 0)   # older first
    assert fifo().key(late_layer0, 0, 9) > fifo().key(early_layer1, 0, 1)


@pytest.mark.parametrize("text,expect", [
    ("fifo", fifo()), ("P3", p3()), ("p3:500", p3(500)), ("slicing:7", slicing(7)),
    ("priority", priority())])
def test_parse_schedule(text, expect):
    assert parse_schedule(text) == expect
    assert parse_schedule(expect) is expect


@pytest.mark.parametrize("bad,match", [
    ("lifo", "not one of"), ("fifo:100", "takes no slice size"),
    ("p3:abc", "not an int"), ("p3:0", "slice_size=0 must be >= 1"),
    ("p3:", "not an int")])
def test_parse_schedule_errors(bad, match):
    with pytest.raises(InvalidArgument, match=match):
        parse_schedule(bad)


def test_plan_rejects_bad_layer_sizes():
    with pytest.raises(InvalidArgument, match="empty"):
        fifo().plan([], 1)
    with pytest.raises(InvalidArgument, match=r"layer_sizes\[1\]=0 must be >= 1"):
        fifo().plan([3, 0], 1)
    with pytest.raises(InvalidType):
        Schedule("x", slice_size=2.5)


# --------------------------------------------------------------------------- the model

@given(layer_profiles(), propagation_schedules(), st.integers(1, 3), st.integers(1, 3),
       bounds, st.floats(1e3, 1e7), st.floats(0, 1e-3))
def test_no_piece_is_sent_twice_or_lost(prof, schedule, W, S, bound, bw, lat):
    its = 3
    r = simulate_comm(prof, schedule, Network(bw, latency=lat), workers=W, servers=S,
                      bound=bound, iterations=its, warmup=0, record=True)
    plan = schedule.plan(prof.sizes, S)
    pieces = [m for layer in plan for m in layer]
    pushes = Counter(m for w in range(W) for m in r.sent[f"worker{w}"])
    pulls = Counter(m for s in range(S) for m in r.sent[f"server{s}"])
    want_push = Counter((0, w, m.uid, i) for w in range(W) for m in pieces for i in range(its))
    want_pull = Counter((1, w, m.uid, i) for w in range(W) for m in pieces for i in range(its))
    assert pushes == want_push and pulls == want_pull
    for s in range(S):                     # a shard answers only for its own pieces
        assert all(pieces[uid].server == s for _, _, uid, _ in r.sent[f"server{s}"])


@given(layer_profiles(), propagation_schedules(), st.integers(1, 4), bounds)
def test_unlimited_bandwidth_gives_the_compute_only_iteration(prof, schedule, W, bound):
    r = simulate_comm(prof, schedule, Network(math.inf), workers=W, bound=bound,
                      iterations=4, warmup=1)
    assert r.iteration_s == pytest.approx(prof.compute_s, rel=1e-9, abs=1e-12)
    assert all(w == pytest.approx(0.0, abs=1e-12) for w in r.layer_wait_s)
    assert not r.comm_bound


@given(layer_profiles(), st.integers(1, 2000), st.integers(1, 3), st.integers(1, 3),
       st.floats(1e4, 1e7), st.floats(0, 1e-3))
def test_p3_never_waits_longer_than_fifo_for_layer_1(prof, size, W, S, bw, lat):
    """BSP, the paper's setting: the last worker's wait for layer 1 under P3 is at most
    FIFO's plus one slice's link time on each of the two hops (the slice in flight
    when layer 1's gradient is queued: a link picks only at message boundaries)."""
    net = Network(bw, latency=lat)
    kw = dict(workers=W, servers=S, bound=0, iterations=4, warmup=0)
    a = simulate_comm(prof, "fifo", net, **kw)
    b = simulate_comm(prof, p3(size), net, **kw)
    slack = 2 * net.seconds(min(size, max(prof.sizes)))
    assert (max(w[0] for w in b.worker_wait_s)
            <= max(w[0] for w in a.worker_wait_s) + slack + 1e-12)


def test_one_layer_one_worker_by_hand():
    """Forward 1, backward 2, 1000 parameters at 4000 B/s (1 s per direction), latency
    0.25: iteration = 1 + 2 + (1 + 0.25) + (1 + 0.25) = 5.5, layer 1 waits 2.5."""
    prof = Profile.of([1000], [1.0], [2.0])
    for sched in ("fifo", "priority"):
        r = simulate_comm(prof, sched, Network(4000.0, latency=0.25), iterations=4,
                          warmup=1)
        assert r.iteration_s == pytest.approx(5.5)
        assert r.layer_wait_s == [pytest.approx(2.5)]
    # slicing pipelines push and pull: 10 slices of 0.1 s, each back 0.6 s after it
    # left; the last leaves at 1.0 and is back at 1.1 + 0.25 + 0.25 = 1.6
    r = simulate_comm(prof, "p3:100", Network(4000.0, latency=0.25), iterations=4, warmup=1)
    assert r.iteration_s == pytest.approx(3.0 + 1.6)


def test_two_layers_p3_overlaps_the_big_layer_with_the_next_forward():
    """Layer 0: 10 params; layer 1: 1000 params (1 s a direction at 4000 B/s), every
    compute step 0.5 s. FIFO: layer 1 is sent first, layer 0 queues behind it on both
    links, so F_0 waits for everything. P3 (slices of 100): layer 0 overtakes at a
    slice boundary, and F_0 overlaps layer 1's transfer."""
    prof = Profile.of([10, 1000], [0.5, 0.5], [0.5, 0.5])
    net = Network(4000.0)
    a = simulate_comm(prof, "fifo", net, iterations=5, warmup=2)
    b = simulate_comm(prof, "p3:100", net, iterations=5, warmup=2)
    # FIFO: B_1 ends at 1.5 (iteration start 0); layer 1 up 1.5-2.5, down 2.5-3.5;
    # layer 0 (B_0 ends 2.0) up 2.5-2.51, down 3.5-3.51: F_0 at 3.51, 1.51 after B_0
    assert a.iteration_s == pytest.approx(3.51)
    assert a.layer_wait_s[0] == pytest.approx(1.51)
    # P3: layer 0 (queued at 2.0) goes up as soon as the slice in flight ends, and
    # comes down after the layer-1 slice the shard is sending: 0.1 + 0.01 + 0.1 = 0.21
    # (one slice in flight on each hop); layer 1 is back 0.4 s into the next forward,
    # before F_1 needs it
    assert b.layer_wait_s[0] == pytest.approx(0.21)
    assert b.iteration_s == pytest.approx(2.0 + 0.21)
    g = gains(prof, net, schedules=["fifo", p3(100)], iterations=5, warmup=2)
    assert g["gain"]["fifo"] == 1.0 and g["gain"]["p3:100"] == pytest.approx(
        a.iteration_s / b.iteration_s)
    g = gains(prof, net, schedules=[p3(100), p3(1000)], baseline=p3(100), iterations=5,
              warmup=2)
    assert g["gain"]["p3:100"] == 1.0
    assert g["gain"]["p3:1000"] == pytest.approx(b.iteration_s / a.iteration_s)


def test_bsp_waits_for_the_slowest_worker_and_async_does_not():
    prof = Profile.of([100, 100], [0.1, 0.1], [0.2, 0.2])
    net = Network(math.inf)
    bsp = simulate_comm(prof, "p3", net, workers=2, bound=0, speeds=[1.0, 3.0],
                        iterations=6, warmup=2)
    asy = simulate_comm(prof, "p3", net, workers=2, bound=None, speeds=[1.0, 3.0],
                        iterations=6, warmup=2)
    slow = 3.0 * prof.compute_s
    ends = bsp.ends
    assert ends[0][-1] - ends[0][-2] == pytest.approx(slow)    # the fast one waits
    assert asy.ends[0][-1] - asy.ends[0][-2] == pytest.approx(prof.compute_s)
    # bounded staleness: the fast worker runs ahead of the slow one by exactly the
    # bound (it is 3x faster, so it reaches it), never more
    for bound in range(4):
        ssp = simulate_comm(prof, "p3", net, workers=2, bound=bound, speeds=[1.0, 3.0],
                            iterations=14, warmup=2)
        lead = [sum(1 for t in ssp.ends[0] if t <= e) - (k + 1)
                for k, e in enumerate(ssp.ends[1])]
        assert max(lead) == bound


def test_same_arguments_same_result():
    prof = Profile.of([5000, 300, 9000], [1e-3, 2e-3, 1e-3], [2e-3, 1e-3, 3e-3])
    kw = dict(workers=3, servers=2, bound=1, speeds=[1.0, 1.3, 0.7], iterations=5)
    a = simulate_comm(prof, "p3:700", Network(2e6, latency=1e-4), **kw)
    b = simulate_comm(prof, "p3:700", Network(2e6, latency=1e-4), **kw)
    assert a.to_dict() == b.to_dict() and a.ends == b.ends


def test_simulate_comm_rejects_bad_input():
    prof = Profile.of([10], [0.1], [0.1])
    with pytest.raises(InvalidType, match="Profile"):
        simulate_comm([10], "fifo")
    with pytest.raises(InvalidType, match="speeds"):
        simulate_comm(prof, "fifo", speeds=1.0)
    with pytest.raises(InvalidArgument, match=r"speeds\[0\]=0.0 must be > 0"):
        simulate_comm(prof, "fifo", speeds=[0.0])
    with pytest.raises(InvalidType, match="must be an int"):
        Profile.of([2.7], [0.1], [0.1])
    with pytest.raises(InvalidArgument, match="batch=0"):
        Profile.of([2], [0.1], [0.1], batch=0)
    with pytest.raises(InvalidArgument, match="listed twice"):
        gains(prof, schedules=["p3", "p3"])
    with pytest.raises(InvalidArgument, match="bandwidth=0.0 must be > 0"):
        Network(0.0)
    with pytest.raises(InvalidArgument, match="speeds has 1 entries for 2 workers"):
        simulate_comm(prof, "fifo", workers=2, speeds=[1.0])
    with pytest.raises(InvalidArgument, match="bound=-1"):
        simulate_comm(prof, "fifo", bound=-1)
    with pytest.raises(InvalidArgument, match="warmup=3 must be <= 2"):
        simulate_comm(prof, "fifo", iterations=3, warmup=3)
    with pytest.raises(InvalidArgument, match="one entry per layer"):
        Profile.of([1, 2], [0.1], [0.1, 0.1])
    assert Network.gbps(8).bandwidth == 8 * GBPS


# --------------------------------------------------------------------------- profiles

def _small_net():
    import torch.nn as nn
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.BatchNorm1d(4))


def test_profile_from_flops_counts_parameters_and_operations():
    import torch
    net = _small_net()
    prof = from_module(net, torch.zeros(5, 8), flops_per_s=1e9)
    assert [ly.name for ly in prof.layers] == ["0", "2", "3"]
    assert prof.sizes == [8 * 16 + 16, 16 * 4 + 4, 8]
    assert prof.layers[0].flops == 2 * 5 * 16 * 8            # 2 per multiply-add
    assert prof.layers[0].forward_s == pytest.approx(prof.layers[0].flops / 1e9)
    assert prof.layers[0].backward_s == pytest.approx(2 * prof.layers[0].forward_s)
    assert prof.batch == 5 and prof.params == sum(p.numel() for p in net.parameters())
    assert Profile.from_dict(prof.to_dict()) == prof


def test_profile_measured_times_every_layer_in_forward_order():
    import torch
    torch.manual_seed(0)
    net = _small_net()
    prof = from_module(net, torch.randn(64, 8), measure=True, repeats=3)
    assert [ly.name for ly in prof.layers] == ["0", "2", "3"]
    assert all(ly.forward_s >= 0 and ly.backward_s >= 0 for ly in prof.layers)
    assert prof.compute_s > 0 and prof.source.startswith("measured")
    assert all(p.grad is None for p in net.parameters())       # left as it was found


def test_profile_errors():
    import torch
    import torch.nn as nn
    with pytest.raises(InvalidArgument, match="no parameters"):
        from_module(nn.ReLU(), torch.zeros(2, 2))
    with pytest.raises(InvalidArgument, match="never called"):
        from_module(_Unused(), torch.zeros(2, 2))
    with torch.device("meta"):
        m = nn.Linear(3, 3)
    with pytest.raises(InvalidArgument, match="meta device cannot be timed"):
        from_module(m, torch.zeros(2, 3, device="meta"), measure=True)
    with pytest.raises(InvalidType):
        from_module(object(), torch.zeros(2))


class _Unused(__import__("torch").nn.Module):
    def __init__(self):
        super().__init__()
        import torch.nn as nn
        self.used, self.spare = nn.Linear(2, 2), nn.Linear(2, 2)

    def forward(self, x):
        return self.used(x)


@pytest.mark.parametrize("name,params,largest", [
    ("vgg19", 143_667_240, 102_764_544), ("resnet50", 25_557_032, 2_359_296)])
def test_reference_profiles_are_the_published_architectures(name, params, largest):
    from hogkit.p3.profiles import reference
    prof = reference(name)
    assert prof.params == params and max(prof.sizes) == largest
    gflops = sum(ly.flops for ly in prof.layers) / prof.batch / 1e9
    assert gflops == pytest.approx({"vgg19": 39.3, "resnet50": 8.2}[name], rel=0.02)


@pytest.mark.slow
def test_simulated_gain_shape_on_the_reference_profiles():
    """The issue's claim, on the model: where FIFO is communication-bound P3's gain is
    larger for VGG-19 than for ResNet-50, and it tends to 1 at high bandwidth."""
    from hogkit.p3.profiles import reference
    vgg, res = reference("vgg19"), reference("resnet50")
    for g in (5, 10):
        gv = gains(vgg, Network.gbps(g), workers=4, schedules=["p3"], iterations=5)
        gr = gains(res, Network.gbps(g), workers=4, schedules=["p3"], iterations=5)
        assert gv["baseline"]["iteration_s"] > 1.01 * vgg.compute_s
        assert gv["gain"]["p3"] > gr["gain"]["p3"] > 1.0
    hi = gains(vgg, Network.gbps(100), workers=4, schedules=["p3"], iterations=5)
    assert hi["gain"]["p3"] == pytest.approx(1.0, abs=1e-6)


# --------------------------------------------------------------------------- live

def test_run_live_rejects_bad_input_before_spawning():
    from hogkit.p3.live import run_live
    with pytest.raises(InvalidArgument, match="bandwidth=0.0 must be > 0"):
        run_live("p3", bandwidth=0.0)
    with pytest.raises(InvalidArgument, match="not one of"):
        run_live("lifo")
    with pytest.raises(InvalidArgument, match="warmup=5"):
        run_live("p3", iterations=4, warmup=5)
    with pytest.raises(InvalidArgument, match="predict=True needs profile=True"):
        run_live("p3", profile=False)
    with pytest.raises(InvalidArgument, match="seed=-1"):
        run_live("p3", seed=-1)
    with pytest.raises(InvalidType, match="profile=1"):
        run_live("p3", profile=1)


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.parametrize("schedule", ["fifo", "p3:5000"])
def test_live_trainer_and_server_exchange_every_piece(schedule):
    """Two real processes on a throttled link: the server's final parameters equal the
    trainer's (every piece went up once and its update came back), the loss is
    finite, the model predicted the run, and nothing is left behind (conftest)."""
    from hogkit.p3.live import run_live
    from hogkit.p3.live import reference_losses
    r = run_live(schedule, bandwidth=20e6, iterations=4, warmup=1, width=64, batch=4,
                 timeout=120)
    assert r["server_agrees"]
    # every piece of every gradient applied exactly once, before its layer's next
    # forward pass: the losses are plain SGD's (a piece lost or applied twice differs)
    assert r["losses"] == pytest.approx(
        reference_losses(iterations=4, batch=4, width=64, seed=0), rel=1e-5)
    plan = parse_schedule(schedule).plan(r["sizes"], 1)
    assert r["messages_per_iteration"] == sum(len(x) for x in plan)
    assert r["prediction_error"] == pytest.approx(
        r["predicted_iteration_s"] / r["iteration_s"] - 1.0)
    assert len(r["layer_wait_s"]) == len(r["sizes"]) == 5
    prof = Profile.from_dict(r["profile"])
    assert prof.sizes == r["sizes"]


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.faults
@pytest.mark.parametrize("victim", ["server", "trainer"])
def test_a_killed_process_ends_the_live_run_with_an_error(victim):
    """SIGKILL the server or the trainer mid-run (found by the name each process gives
    itself): the run ends with an error saying so, within seconds, and leaves no
    process behind (conftest)."""
    import os
    import signal
    import threading
    import time

    from helpers.procs import children
    from hogkit.p3.live import run_live
    box = {}

    def target():
        try:
            box["result"] = run_live("p3", bandwidth=2e6, iterations=400, warmup=1,
                                     width=256, batch=4, timeout=120, profile=False,
                                     predict=False)
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    deadline = time.monotonic() + 60
    def named():
        out = {}
        for pid, _ in children(os.getpid()):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    out[f.read().strip()] = pid
            except OSError:
                pass
        return out

    kids = {}
    while time.monotonic() < deadline and len(kids.keys() & {"p3-server", "p3-trainer"}) < 2:
        kids = named()
        time.sleep(0.2)
    assert {"p3-server", "p3-trainer"} <= kids.keys()
    time.sleep(3.0)                                 # both are up and exchanging
    os.kill(kids[f"p3-{victim}"], signal.SIGKILL)
    t.join(90)
    assert not t.is_alive()
    assert "error" in box and isinstance(box["error"], HogkitError)
    text = str(box["error"])
    assert "live P3 run (p3:40000) failed" in text
    if victim == "trainer":
        assert "p3-trainer (exit -9)" in text
    else:                                  # the trainer saw its link close, or the death
        assert "closed the link" in text or "p3-server (exit -9)" in text
