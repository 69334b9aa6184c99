"""A character-level recurrent language model in torch: the stale-value RNN study's
workload.

Model (:class:`CharRNN`): an embedding, one Elman recurrent layer
``h_t = act(W_x e_t + W_h h_{t-1} + b)`` with ``act`` one of ``sigmoid | tanh | relu``
(written out step by step, the same code for the three, so a study of the activation
changes nothing else), and a linear read-out to the vocabulary. Training is truncated
back-propagation through time: each sample is a window of ``bptt + 1`` characters at
a random offset of the training text, the state starts at zero, and the loss is the
mean cross-entropy of the ``bptt`` next-character predictions.

Text (offline, no download; :mod:`hogkit.workloads.text`):

- ``text="markov"``: generated from a random order-``markov_order`` Markov source
  with a known entropy rate, so the floor the model can reach is known exactly;
- ``text="stdlib"``: the docstrings of a fixed list of Python standard-library
  modules (English prose about code, shipped with every Python).

The last ``val_fraction`` of the text is the validation split, never trained on.

Reported, in bits per character (``log2``): ``loss`` (the loss curve) on
``eval_rows`` windows of the training text; ``metrics`` adds ``val_bpc`` over
non-overlapping windows of the validation text, ``val_perplexity = 2**val_bpc``, the
training text's ``unigram_bits`` (what a model that ignores context reaches) and, for
the Markov text, its ``entropy_rate_bits`` (what the best model reaches).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from hogkit.validation import check_choice, check_float, check_int
from hogkit.workloads.base import check_dtype, check_keys, check_seed
from hogkit.workloads.module import ModuleWorkload, module_params

ACTIVATIONS = ("sigmoid", "tanh", "relu")
TEXTS = ("markov", "stdlib")
_LN2 = math.log(2.0)


class CharRNN(nn.Module):
    """Embedding, one Elman layer ``h_t = act(W_x e_t + W_h h_{t-1} + b)``, read-out."""

    def __init__(self, vocab, hidden, embed, activation):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.wx = nn.Linear(embed, hidden)
        self.wh = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, vocab)
        self.activation = activation

    def forward(self, x):
        act = getattr(torch, self.activation)
        e = self.wx(self.embed(x))                 # (B, T, H): inputs, projected once
        h = e.new_zeros(e.shape[0], e.shape[2])
        hs = []
        for t in range(e.shape[1]):
            h = act(e[:, t] + self.wh(h))
            hs.append(h)
        return self.out(torch.stack(hs, dim=1))    # (B, T, vocab) logits


class CharRNNWorkload(ModuleWorkload):
    """Character-level RNN language model; see the module docstring."""

    name = "rnn"
    default_lr = 0.5
    default_batch = 32
    default_steps = 6_000
    defaults_why = "SGD at the lr tuned on the Markov text, 32 sequences a step"
    eval_rows = 256
    train_keys = ("text",)
    #: the loss is reported in bits (the gradient is of the mean cross-entropy in nats)
    loss_scale = 1.0 / _LN2
    _fields = ("text", "activation", "hidden", "embed", "bptt", "chars", "val_fraction",
               "markov_order", "text_seed", "dtype")

    def __init__(self, *, text="stdlib", activation="tanh", hidden=128, embed=32, bptt=32,
                 chars=200_000, val_fraction=0.1, markov_order=2, text_seed=0,
                 dtype="float32"):
        self.text = check_choice("text", text, TEXTS)
        self.activation = check_choice("activation", activation, ACTIVATIONS)
        self.hidden = check_int("hidden", hidden, min_value=1, max_value=1 << 14)
        self.embed = check_int("embed", embed, min_value=1, max_value=1 << 14)
        self.bptt = check_int("bptt", bptt, min_value=1, max_value=4096,
                              fix="the truncated-BPTT window, e.g. 32 characters")
        self.chars = check_int("chars", chars, min_value=1000, max_value=1 << 28,
                               fix="characters of text to use, e.g. 200000")
        self.val_fraction = check_float("val_fraction", val_fraction, min_value=0.01,
                                        max_value=0.5)
        self.markov_order = check_int("markov_order", markov_order, min_value=1,
                                      max_value=4)
        self.text_seed = check_seed(text_seed, "text_seed")
        self.dtype = check_dtype(dtype)
        if int(self.chars * self.val_fraction) < 2 * (self.bptt + 1):
            from hogkit.errors import InvalidArgument
            raise InvalidArgument(f"chars={self.chars} with val_fraction="
                                  f"{self.val_fraction} leaves fewer than two windows of "
                                  f"bptt+1={self.bptt + 1} characters to validate on; use "
                                  f"more chars or a shorter bptt")
        self._corpus = None
        self._vocab = None

    # --- text ---------------------------------------------------------------------
    def corpus(self):
        """``(train codes, validation codes, vocabulary size, extra facts)``, made once
        per object (deterministic in the settings)."""
        if self._corpus is None:
            from hogkit.workloads import text as T
            facts = {}
            if self.text == "markov":
                src = T.markov_source(self.text_seed, order=self.markov_order)
                codes = src.sample(self.chars, np.random.default_rng([self.text_seed, 1]))
                vocab = src.alphabet
                facts["entropy_rate_bits"] = src.entropy_rate()
            else:
                codes, chars = T.encode(T.stdlib_docstrings(max_chars=self.chars))
                vocab = len(chars)
            train, val = T.split(codes, self.val_fraction)
            facts["unigram_bits"] = T.unigram_entropy(train, vocab)
            self._corpus = (train, val, vocab, facts)
        return self._corpus

    def __getstate__(self):
        state = super().__getstate__()
        state["_corpus"] = None              # workers read the text from the data store
        return state

    # --- the model ----------------------------------------------------------------
    def make_module(self):
        # a worker reads the vocabulary size off the parameters (setup); the parent
        # has the text
        vocab = self._vocab if self._corpus is None and self._vocab else self.corpus()[2]
        m = CharRNN(vocab, self.hidden, self.embed, self.activation)
        return m.to(getattr(torch, self.dtype))

    def make_batch(self, tensors, idx):
        offsets = torch.arange(self.bptt + 1)
        return {"x": tensors["text"][idx.unsqueeze(1) + offsets]}

    def n_rows(self, tensors):
        return int(tensors["text"].shape[0]) - self.bptt

    def step_loss(self, module, batch):
        from torch.nn.functional import cross_entropy
        x = batch["x"]
        logits = module(x[:, :-1])
        return cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))

    def build(self, seed):
        """``(params, {"text", "val"})``: the module's initial weights under ``seed``;
        the text does not depend on ``seed``."""
        train, val, _, _ = self.corpus()
        params = module_params(self._seeded_module(seed))
        return params, {"text": train.astype(np.int64), "val": val.astype(np.int64)}

    def setup(self, params, data, *, rank=0, seed=0):
        """The vocabulary size is read off the read-out layer (a worker does not
        rebuild the text), then :meth:`ModuleWorkload.setup` checks and binds."""
        check_keys("params", params, ("out.bias",), self.name)
        self._vocab = int(params["out.bias"].shape[0])
        return super().setup(params, data, rank=rank, seed=seed)

    def extra_metrics(self, module, tensors):
        """Validation bits/char and perplexity, and the text's reference entropies."""
        val = tensors["val"]
        T = self.bptt
        starts = torch.arange(0, int(val.shape[0]) - T, T + 1)[:512]
        total = 0.0
        for i in range(0, len(starts), 128):
            batch = {"x": val[starts[i:i + 128].unsqueeze(1) + torch.arange(T + 1)]}
            total += float(self.step_loss(module, batch)) * len(starts[i:i + 128])
        bpc = total / len(starts) / _LN2
        out = {"val_bpc": bpc, "val_perplexity": 2.0 ** bpc}
        out.update(self.corpus()[3])
        return out
