"""Layer profiles: what a model sends and how long its layers compute.

A :class:`Profile` is the per-layer description the communication model
(:mod:`hogkit.p3.comm`) needs: for each layer with parameters, in forward order (0 = input
side), its parameter count and its forward and backward compute times. Two ways to get
one from a real ``torch.nn.Module``:

- :func:`from_module` ``(module, example_input, measure=True)``: run the module and time
  every layer with hooks (forward: from one layer's start to the next's, so the
  parameter-free operations after a layer count with it; backward: between the moments
  the layers' gradients are complete, which is exactly when a schedule can send them);
  medians over ``repeats`` runs after a warm-up.
- :func:`from_module` ``(..., measure=False, flops_per_s=F)``: count each layer's
  floating-point operations from the shapes seen in one forward pass (on the ``meta``
  device when the module lives there: no memory, no compute) and divide by a stated
  device speed; backward = ``backward_factor`` (2) × forward, the usual estimate
  (gradients with respect to the input and to the weights).

The reference profiles of the P3 paper's models are built the same way, from torch
modules constructed from their architectures on the ``meta`` device
(:func:`vgg19_module`, :func:`resnet50_module`, :func:`sockeye_module`); the parameter
counts come from the modules (VGG-19: 143.7 M, fc6 102.8 M; ResNet-50: 25.6 M), the
times from their FLOPs at :data:`DEVICE_FLOPS`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Optional

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.validation import check_float, check_int

__all__ = ["Layer", "Profile", "from_module", "forward_layers", "reference",
           "REFERENCE_PROFILES",
           "DEVICE_FLOPS", "vgg19_module", "resnet50_module", "sockeye_module"]

#: The stated device speed of the reference profiles: 5 TFLOP/s sustained, a mid-range
#: 2018 GPU's (P3's era) realistic fp32 rate. Every gain is a function of the ratio of
#: compute to communication, so the bandwidth sweep covers other speeds: doubling the
#: device speed is the same as halving the bandwidth.
DEVICE_FLOPS = 5e12


@dataclass(frozen=True)
class Layer:
    """One layer with parameters: ``params`` parameters, ``forward_s``/``backward_s``
    seconds of compute per iteration, ``flops`` forward floating-point operations (0
    when measured)."""
    name: str
    params: int
    forward_s: float
    backward_s: float
    flops: float = 0.0


@dataclass(frozen=True)
class Profile:
    """A model's layers in forward order (0 = input side), for one batch."""
    name: str
    layers: tuple
    batch: int
    source: str

    def __post_init__(self):
        check_int("batch", self.batch, min_value=1)
        if not self.layers:
            raise InvalidArgument(f"profile {self.name!r} has no layer with parameters")
        for i, ly in enumerate(self.layers):
            if not isinstance(ly, Layer):
                raise InvalidType(f"profile layers[{i}] must be a hogkit.p3.profiles.Layer, "
                                  f"got {type(ly).__name__}")
            check_int(f"layers[{i}].params", ly.params, min_value=1)
            check_float(f"layers[{i}].forward_s", ly.forward_s, min_value=0.0)
            check_float(f"layers[{i}].backward_s", ly.backward_s, min_value=0.0)

    @property
    def sizes(self) -> list:
        return [ly.params for ly in self.layers]

    @property
    def params(self) -> int:
        return sum(self.sizes)

    @property
    def compute_s(self) -> float:
        """One iteration's compute time, forward plus backward."""
        return sum(ly.forward_s + ly.backward_s for ly in self.layers)

    def scaled(self, factor: float) -> "Profile":
        """The same model on a device ``factor`` times slower (compute times × factor)."""
        factor = check_float("factor", factor, min_value=0.0)
        layers = tuple(Layer(ly.name, ly.params, ly.forward_s * factor,
                             ly.backward_s * factor, ly.flops) for ly in self.layers)
        return Profile(self.name, layers, self.batch, f"{self.source} x{factor:g}")

    def to_dict(self) -> dict:
        return {"name": self.name, "batch": self.batch, "source": self.source,
                "params": self.params, "compute_s": self.compute_s,
                "layers": [asdict(ly) for ly in self.layers]}

    @classmethod
    def from_dict(cls, d) -> "Profile":
        return cls(d["name"], tuple(Layer(**ly) for ly in d["layers"]), int(d["batch"]),
                   d["source"])

    @classmethod
    def of(cls, sizes, forward_s, backward_s, *, name="custom", batch=1) -> "Profile":
        """A profile from plain lists (parameters, forward and backward seconds per
        layer, input side first)."""
        sizes, forward_s, backward_s = list(sizes), list(forward_s), list(backward_s)
        if not (len(sizes) == len(forward_s) == len(backward_s)):
            raise InvalidArgument(f"sizes, forward_s and backward_s must have one entry "
                                  f"per layer, got {len(sizes)}, {len(forward_s)}, "
                                  f"{len(backward_s)}")
        layers = tuple(Layer(f"layer{i}", check_int(f"sizes[{i}]", n, min_value=1),
                             check_float(f"forward_s[{i}]", f, min_value=0.0),
                             check_float(f"backward_s[{i}]", b, min_value=0.0))
                       for i, (n, f, b) in enumerate(zip(sizes, forward_s, backward_s)))
        return cls(name, layers, batch, "given")


# --------------------------------------------------------------------------- from a module

def _param_layers(module):
    """Modules owning parameters directly (weights and biases of one layer together)."""
    return [(name, m) for name, m in module.named_modules()
            if any(True for _ in m.parameters(recurse=False))]


def _own_params(m) -> int:
    return sum(p.numel() for p in m.parameters(recurse=False))


def _flops(m, inputs, output) -> float:
    """Forward FLOPs of one call of a layer (2 per multiply-add)."""
    import torch.nn as nn
    out = output[0] if isinstance(output, (tuple, list)) else output
    n_out = out.numel()
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        k = 1
        for s in m.kernel_size:
            k *= s
        return 2.0 * n_out * (m.in_channels // m.groups) * k
    if isinstance(m, nn.Linear):
        return 2.0 * n_out * m.in_features
    if isinstance(m, nn.Embedding):
        return float(n_out)                           # a gather: one op per element
    if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm,
                      nn.GroupNorm)):
        return 4.0 * n_out
    # a layer of unknown kind: a matrix-vector product per output row
    rows = max(1, n_out // max(1, out.shape[-1])) if out.dim() else 1
    return 2.0 * _own_params(m) * rows


def _order_and_flops(module, example_input, layers):
    """Forward order (first call) of the parameter layers and their FLOPs (summed over
    calls: an RNN cell used at every time step counts every step)."""
    import torch
    order, flops, handles = [], {}, []

    def hook(name):
        def fn(m, inputs, output):
            if name not in flops:
                order.append(name)
                flops[name] = 0.0
            flops[name] += _flops(m, inputs, output)
        return fn

    try:
        for name, m in layers:
            handles.append(m.register_forward_hook(hook(name)))
        with torch.no_grad():
            _call(module, example_input)
    finally:
        for h in handles:
            h.remove()
    return order, flops


def forward_layers(module, example_input) -> list:
    """``[(name, module)]`` of the modules owning parameters, in the order one forward
    pass on ``example_input`` first calls them (the order of the layers on the wire);
    on the meta device this costs nothing."""
    owners = dict(_param_layers(module))
    order, _ = _order_and_flops(module, example_input, list(owners.items()))
    return [(n, owners[n]) for n in order]


def _call(module, example_input):
    if isinstance(example_input, tuple):
        return module(*example_input)
    return module(example_input)


def _batch_of(example_input) -> int:
    x = example_input[0] if isinstance(example_input, tuple) else example_input
    return int(x.shape[0]) if getattr(x, "dim", lambda: 0)() else 1


def from_module(module, example_input, *, measure: bool = False,
                flops_per_s: Optional[float] = None, backward_factor: float = 2.0,
                loss_fn=None, repeats: int = 5, name: Optional[str] = None) -> Profile:
    """The :class:`Profile` of ``module`` on ``example_input`` (a tensor or a tuple of
    tensors; its first axis is the batch).

    measure : True: time every layer on this machine (hooks; medians of ``repeats``
        runs after one warm-up; ``loss_fn(output)`` gives the scalar to differentiate,
        default ``output.float().sum()``). False: estimate from FLOPs at
        ``flops_per_s`` (default :data:`DEVICE_FLOPS`), backward = ``backward_factor`` ×
        forward. A module on the ``meta`` device can only be estimated.

    Layers are the modules that own parameters, in the order the forward pass first
    calls them; a layer never called is refused (its gradient would never be sent).
    """
    import torch
    if not isinstance(module, torch.nn.Module):
        raise InvalidType(f"module must be a torch.nn.Module, got {type(module).__name__}")
    layers = _param_layers(module)
    if not layers:
        raise InvalidArgument(f"{type(module).__name__} has no parameters: nothing to send")
    on_meta = any(p.is_meta for p in module.parameters())
    if measure and on_meta:
        raise InvalidArgument("a module on the meta device cannot be timed; use "
                              "measure=False with flops_per_s=..., or build it on the cpu")
    repeats = check_int("repeats", repeats, min_value=1)
    backward_factor = check_float("backward_factor", backward_factor, min_value=0.0)
    flops_per_s = check_float("flops_per_s", DEVICE_FLOPS if flops_per_s is None
                              else flops_per_s, min_value=0.0, exclude_min=True)
    order, flops = _order_and_flops(module, example_input, layers)
    by_name = dict(layers)
    missing = [n for n, _ in layers if n not in flops]
    if missing:
        raise InvalidArgument(f"layers {missing[:5]} own parameters but the forward pass "
                              f"never called them; remove them or give an input that "
                              f"reaches them")
    batch = _batch_of(example_input)
    label = name or type(module).__name__
    if not measure:
        out = tuple(Layer(n, _own_params(by_name[n]), flops[n] / flops_per_s,
                          backward_factor * flops[n] / flops_per_s, flops[n])
                    for n in order)
        return Profile(label, out, batch, f"flops at {flops_per_s:.3g} FLOP/s")
    fwd, bwd = _measure(module, example_input, order, by_name, loss_fn, repeats)
    out = tuple(Layer(n, _own_params(by_name[n]), fwd[i], bwd[i], 0.0)
                for i, n in enumerate(order))
    return Profile(label, out, batch, f"measured (median of {repeats})")


def _measure(module, example_input, order, by_name, loss_fn, repeats):
    """Per-layer forward and backward seconds (medians over ``repeats``)."""
    import torch
    L = len(order)
    index = {n: i for i, n in enumerate(order)}
    marks_f, marks_b, handles = {}, {}, []

    def pre(i):
        def fn(m, inputs):
            marks_f.setdefault(i, time.perf_counter())
        return fn

    def grad_done(i, left):
        def fn(p):
            left[i] -= 1
            if left[i] == 0:
                marks_b[i] = time.perf_counter()
        return fn

    left = [0] * L
    try:
        for n in order:
            i = index[n]
            handles.append(by_name[n].register_forward_pre_hook(pre(i)))
            for p in by_name[n].parameters(recurse=False):
                if p.requires_grad:
                    handles.append(p.register_post_accumulate_grad_hook(grad_done(i, left)))
        samples_f, samples_b = [[] for _ in range(L)], [[] for _ in range(L)]
        for rep in range(repeats + 1):
            marks_f.clear()
            marks_b.clear()
            for i, n in enumerate(order):
                left[i] = sum(1 for p in by_name[n].parameters(recurse=False)
                              if p.requires_grad)
            module.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            out = _call(module, example_input)
            loss = loss_fn(out) if loss_fn is not None else out.float().sum()
            t1 = time.perf_counter()
            loss.backward()
            if rep == 0:
                continue                              # warm-up
            # work before the first layer (input handling) counts with the first layer
            starts = [t0] + [marks_f.get(i, t0) for i in range(1, L)] + [t1]
            for i in range(L):
                samples_f[i].append(max(0.0, starts[i + 1] - starts[i]))
            # backward: the time since the previous layer (in reverse forward order)
            # completed its gradients; in a graph with branches (a ResNet shortcut) the
            # completion order can differ and a layer is then charged 0
            prev = t1
            for i in reversed(range(L)):
                done = marks_b.get(i, prev)
                samples_b[i].append(max(0.0, done - prev))
                prev = done
    finally:
        for h in handles:
            h.remove()
        module.zero_grad(set_to_none=True)
    return ([statistics.median(s) for s in samples_f], [statistics.median(s) for s in samples_b])


# --------------------------------------------------------------------------- reference models

_VGG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
          512, 512, 512, 512, "M"]


def vgg19_module(num_classes: int = 1000):
    """VGG-19 (configuration E of Simonyan & Zisserman) as a torch module: 16 3×3
    convolutions and three fully connected layers (fc6 25088→4096, fc7, fc8)."""
    import torch.nn as nn
    feats, c = [], 3
    for v in _VGG19:
        if v == "M":
            feats.append(nn.MaxPool2d(2))
        else:
            feats += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU()]
            c = v
    return nn.Sequential(*feats, nn.Flatten(),
                         nn.Linear(512 * 7 * 7, 4096), nn.ReLU(),
                         nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, num_classes))


def _bottleneck(nn, cin, width, stride):
    import torch

    class Bottleneck(nn.Module):
        def __init__(self):
            super().__init__()
            cout = width * 4
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = torch.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    return Bottleneck()


def resnet50_module(num_classes: int = 1000):
    """ResNet-50 (He et al.): a 7×7 stem, bottleneck stages of 3, 4, 6, 3 blocks
    (widths 64..512, expansion 4), global pooling, fc 2048→1000."""
    import torch.nn as nn
    layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
              nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(_bottleneck(nn, cin, width, stride if b == 0 else 1))
            cin = width * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(2048, num_classes))


def sockeye_module(vocab: int = 32_000, embed: int = 512, hidden: int = 512,
                   enc_layers: int = 2, dec_layers: int = 2):
    """A Sockeye-like RNN translation model (Sockeye's 2018 RNN architecture, sizes
    assumed): source embedding, a bidirectional LSTM layer then ``enc_layers-1``
    LSTM layers, target embedding, ``dec_layers`` LSTM layers fed with the previous
    attention vector (input feeding), dot attention with a ``2·hidden → hidden``
    attention layer, and the output layer ``hidden → vocab``. Its input is a pair
    ``(source, target)`` of int64 token tensors ``(batch, time)``. Cells are written
    with ``nn.Linear`` so that every layer's FLOPs are counted per time step."""
    import torch
    import torch.nn as nn

    class Cell(nn.Module):
        def __init__(self, n_in, n_h):
            super().__init__()
            self.ih = nn.Linear(n_in, 4 * n_h)
            self.hh = nn.Linear(n_h, 4 * n_h, bias=False)

        def forward(self, x, state):
            h, c = state
            i, f, g, o = (self.ih(x) + self.hh(h)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            return torch.sigmoid(o) * torch.tanh(c), c

    def unroll(cell, xs, n_h, reverse=False):
        B = xs.shape[0]
        h = xs.new_zeros(B, n_h)
        c = xs.new_zeros(B, n_h)
        steps = range(xs.shape[1] - 1, -1, -1) if reverse else range(xs.shape[1])
        out = [None] * xs.shape[1]
        for t in steps:
            h, c = cell(xs[:, t], (h, c))
            out[t] = h
        return torch.stack(out, 1)

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.src_embed = nn.Embedding(vocab, embed)
            self.enc_fwd = Cell(embed, hidden // 2)
            self.enc_bwd = Cell(embed, hidden // 2)
            self.enc = nn.ModuleList(Cell(hidden, hidden) for _ in range(enc_layers - 1))
            self.tgt_embed = nn.Embedding(vocab, embed)
            self.dec = nn.ModuleList(Cell(embed + hidden if i == 0 else hidden, hidden)
                                     for i in range(dec_layers))
            self.attention = nn.Linear(2 * hidden, hidden)
            self.output = nn.Linear(hidden, vocab)

        def forward(self, src, tgt):
            x = self.src_embed(src)
            h = torch.cat([unroll(self.enc_fwd, x, hidden // 2),
                           unroll(self.enc_bwd, x, hidden // 2, reverse=True)], -1)
            for cell in self.enc:
                h = unroll(cell, h, hidden)
            y = self.tgt_embed(tgt)
            B, T = tgt.shape
            states = [(y.new_zeros(B, hidden), y.new_zeros(B, hidden)) for _ in self.dec]
            att = y.new_zeros(B, hidden)
            logits = []
            for t in range(T):
                z = torch.cat([y[:, t], att], -1)
                for k, cell in enumerate(self.dec):
                    states[k] = cell(z, states[k])
                    z = states[k][0]
                w = torch.softmax(torch.einsum("bh,bsh->bs", z, h), -1)
                ctx = torch.einsum("bs,bsh->bh", w, h)
                att = torch.tanh(self.attention(torch.cat([z, ctx], -1)))
                logits.append(self.output(att))
            return torch.stack(logits, 1)

    return Seq2Seq()


#: the reference models :func:`reference` builds, and what each assumes
REFERENCE_PROFILES = {
    "vgg19": "VGG-19, ImageNet 224x224, batch 32",
    "resnet50": "ResNet-50, ImageNet 224x224, batch 32",
    "sockeye": "Sockeye-like RNN seq2seq, vocab 32k, 512 units, batch 64, 30+30 tokens",
}


def reference(name: str, *, flops_per_s: float = DEVICE_FLOPS, batch: Optional[int] = None
              ) -> Profile:
    """The profile of a reference model (``"vgg19"``, ``"resnet50"``, ``"sockeye"``),
    built on the meta device from its architecture, times from FLOPs at
    ``flops_per_s``."""
    import torch
    if not isinstance(name, str) or name not in REFERENCE_PROFILES:
        raise InvalidArgument(f"reference profile {name!r} is not one of "
                              f"{sorted(REFERENCE_PROFILES)}")
    if batch is not None:
        batch = check_int("batch", batch, min_value=1)
    with torch.device("meta"):
        if name == "vgg19":
            b = batch or 32
            module, x = vgg19_module(), torch.empty(b, 3, 224, 224)
        elif name == "resnet50":
            b = batch or 32
            module, x = resnet50_module(), torch.empty(b, 3, 224, 224)
        else:
            b = batch or 64
            module = sockeye_module()
            x = (torch.zeros(b, 30, dtype=torch.long), torch.zeros(b, 30, dtype=torch.long))
    return from_module(module, x, measure=False, flops_per_s=flops_per_s, name=name)
