"""Training an EAGLE-style draft head in numpy, and measuring it on held-out topics.

The head reads the target's final hidden state h_t and the embedding of the token the target
chose after it, x_{t+1}, and predicts the next hidden state and, through a reduced copy of the
target's LM head, x_{t+2}:

    x = [h_t * s_h ; E(x_{t+1}) * s_e]          (2 d)
    z = SiLU(x W1 + b1)                          (H)
    f = h_t + z W2 + b2                          (d: the predicted h_{t+1})
    logits = f Wout^T + bout                     (V: the reduced vocabulary)

Chained for k > 1 it feeds its own f back as the next h. Training matches how it drafts: each
batch unrolls DEPTH steps from a row, feeding the head's own f forward ("training-time
test", as HASS and EAGLE-3 do), with cross-entropy on the target's greedy token at every step
and a regression of f on the true next hidden state. Adam, cosine learning rate, a time budget,
and a checkpoint every minute so that an interrupted run resumes.

A Medusa-style baseline (a residual block on h_t alone per position, no token input) is trained
beside it for the report.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_spec.headtrain.data import Corpus

log = logging.getLogger(__name__)

DEPTH = 2  # unrolled steps per training example
DEPTH_WEIGHTS = (1.0, 0.6)
EVAL_DEPTH = 4
REG_WEIGHT = 0.5
BATCH = 512
LR, LR_MIN = 2e-3, 5e-5
BETAS = (0.9, 0.98)
WEIGHT_DECAY = 1e-5
CHECKPOINT_EVERY_S = 60.0


@dataclass
class Params:
    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray
    Wout: np.ndarray
    bout: np.ndarray
    s_h: float
    s_e: float

    NAMES = ("W1", "b1", "W2", "b2", "Wout", "bout")

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in self.NAMES}


def init_params(
    n_embd: int, hidden_size: int, out_rows: np.ndarray, s_h: float, s_e: float, seed: int
) -> Params:
    rng = np.random.default_rng(seed)
    d = n_embd
    return Params(
        W1=(rng.standard_normal((2 * d, hidden_size)) / math.sqrt(2 * d)).astype(np.float32),
        b1=np.zeros(hidden_size, np.float32),
        W2=(rng.standard_normal((hidden_size, d)) * 0.02 / math.sqrt(hidden_size)).astype(
            np.float32
        ),
        b2=np.zeros(d, np.float32),
        Wout=out_rows.astype(np.float32).copy(),
        bout=np.zeros(len(out_rows), np.float32),
        s_h=s_h,
        s_e=s_e,
    )


def forward(p: Params, h: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(logits, f, cache) for a batch of hidden states and next-token embeddings."""
    x = np.concatenate([h * p.s_h, e * p.s_e], axis=1)
    a = x @ p.W1 + p.b1
    sg = 1.0 / (1.0 + np.exp(-a))
    z = a * sg
    f = h + z @ p.W2 + p.b2
    logits = f @ p.Wout.T + p.bout
    return logits, f, (x, a, sg, z, f)


def backward(
    p: Params, cache: tuple, dlogits: np.ndarray, df_extra: np.ndarray, grads: dict
) -> np.ndarray:
    """Accumulates parameter gradients into `grads`; returns d loss / d h (the step's input)."""
    x, a, sg, z, f = cache
    d = p.W2.shape[1]
    grads["Wout"] += dlogits.T @ f
    grads["bout"] += dlogits.sum(0)
    df = dlogits @ p.Wout + df_extra
    grads["W2"] += z.T @ df
    grads["b2"] += df.sum(0)
    da = (df @ p.W2.T) * (sg * (1.0 + a * (1.0 - sg)))
    grads["W1"] += x.T @ da
    grads["b1"] += da.sum(0)
    return (da @ p.W1[:d].T) * p.s_h + df


def _softmax_grad(
    logits: np.ndarray, labels: np.ndarray, weight: float
) -> tuple[float, np.ndarray]:
    """Cross-entropy summed over rows whose label is in the reduced vocabulary (label >= 0),
    over the batch size (rows outside count as nothing), and its gradient times weight."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probs = exp / exp.sum(axis=1, keepdims=True)
    valid = labels >= 0
    rows = np.nonzero(valid)[0]
    loss = float(-np.log(probs[rows, labels[rows]] + 1e-12).sum()) / len(labels)
    grad = probs
    grad[rows, labels[rows]] -= 1.0
    grad[~valid] = 0.0
    return loss, grad * (weight / len(labels))


def loss_and_grads(
    p: Params,
    h: np.ndarray,
    embeds: list[np.ndarray],
    labels: list[np.ndarray],
    nexts: list[np.ndarray],
    weights: tuple[float, ...],
    reg_scale: float,
) -> tuple[float, dict[str, np.ndarray]]:
    """The unrolled loss -- per step j, weights[j] * (cross-entropy on labels[j] + REG_WEIGHT *
    reg_scale * mean squared error of f against nexts[j]), each step reading the previous
    step's f as its hidden state -- and its gradient for every parameter."""
    grads = {k: np.zeros_like(v) for k, v in p.arrays().items()}
    caches, dregs, loss = [], [], 0.0
    for j, weight in enumerate(weights):
        logits, f, cache = forward(p, h, embeds[j])
        ce, dlogits = _softmax_grad(logits, labels[j], weight)
        diff = f - nexts[j]
        loss += weight * ce + REG_WEIGHT * weight * reg_scale * float((diff * diff).mean())
        dregs.append(diff * (2.0 * REG_WEIGHT * weight * reg_scale / diff.size))
        caches.append((cache, dlogits))
        h = f
    dh = np.zeros_like(h)
    for j in reversed(range(len(weights))):
        cache, dlogits = caches[j]
        dh = backward(p, cache, dlogits, dregs[j] + dh, grads)
    return loss, grads


class Trainer:
    """Adam over Params with a cosine schedule; state can be saved and restored."""

    def __init__(self, params: Params, total_steps: int) -> None:
        self.params = params
        self.total_steps = max(total_steps, 1)
        self.step = 0
        self.m = {k: np.zeros_like(v) for k, v in params.arrays().items()}
        self.v = {k: np.zeros_like(v) for k, v in params.arrays().items()}

    def lr(self) -> float:
        progress = min(self.step / self.total_steps, 1.0)
        warm = min(1.0, (self.step + 1) / 50)
        return warm * (LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * progress)))

    def apply(self, grads: dict[str, np.ndarray]) -> None:
        self.step += 1
        lr, (b1, b2) = self.lr(), BETAS
        for name, value in self.params.arrays().items():
            g = grads[name]
            self.m[name] = b1 * self.m[name] + (1 - b1) * g
            self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
            m_hat = self.m[name] / (1 - b1**self.step)
            v_hat = self.v[name] / (1 - b2**self.step)
            value -= lr * (m_hat / (np.sqrt(v_hat) + 1e-8) + WEIGHT_DECAY * value)

    def save(self, path: Path) -> None:
        arrays = {f"p_{k}": v for k, v in self.params.arrays().items()}
        arrays |= {f"m_{k}": v for k, v in self.m.items()}
        arrays |= {f"v_{k}": v for k, v in self.v.items()}
        tmp = path.with_suffix(".tmp.npz")
        np.savez(
            tmp,
            step=self.step,
            total_steps=self.total_steps,
            s_h=self.params.s_h,
            s_e=self.params.s_e,
            **arrays,
        )
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Trainer:
        with np.load(path) as data:
            params = Params(
                **{k: data[f"p_{k}"].copy() for k in Params.NAMES},
                s_h=float(data["s_h"]),
                s_e=float(data["s_e"]),
            )
            trainer = cls(params, int(data["total_steps"]))
            trainer.step = int(data["step"])
            trainer.m = {k: data[f"m_{k}"].copy() for k in Params.NAMES}
            trainer.v = {k: data[f"v_{k}"].copy() for k in Params.NAMES}
        return trainer


class Batches:
    """Training examples from a corpus: chains of `depth` steps from random rows."""

    def __init__(
        self,
        corpus: Corpus,
        embed: Callable[[np.ndarray], np.ndarray],
        label_index: dict[int, int],
        depth: int,
        seed: int,
    ) -> None:
        self.corpus, self.embed, self.depth = corpus, embed, depth
        self.rows = corpus.sample_rows(depth)
        self.rng = np.random.default_rng(seed)
        lookup = np.full(int(corpus.top_ids.max()) + 1, -1, dtype=np.int64)
        for token, row in label_index.items():
            if token < len(lookup):
                lookup[token] = row
        self.labels = lookup[corpus.top_ids[:, 0]]  # reduced index of each row's argmax

    def sample(self, n: int) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], list]:
        """(h_0, [E(x) per step], [reduced label per step], [true next hidden per step])."""
        rows = self.rng.choice(self.rows, size=n, replace=False)
        return self.at(rows)

    def at(self, rows: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], list]:
        c = self.corpus
        h0 = c.hidden[rows].astype(np.float32)
        embeds, labels, nexts = [], [], []
        for j in range(1, self.depth + 1):
            embeds.append(self.embed(c.tokens[rows + j]))
            labels.append(self.labels[rows + j])
            nexts.append(c.hidden[rows + j].astype(np.float32))
        return h0, embeds, labels, nexts


def train_steps(
    trainer: Trainer,
    batches: Batches,
    *,
    weights: tuple[float, ...],
    reg_scale: float,
    deadline: float,
    checkpoint: Path | None = None,
    on_step: Callable[[int, float], None] = lambda step, loss: None,
    token_input: bool = True,
) -> None:
    """Runs Adam steps until trainer.total_steps or the deadline."""
    p = trainer.params
    last_save = time.monotonic()
    while trainer.step < trainer.total_steps and time.monotonic() < deadline:
        h, embeds, labels, nexts = batches.sample(BATCH)
        if not token_input:
            embeds = [np.zeros_like(e) for e in embeds]
        loss, grads = loss_and_grads(p, h, embeds, labels, nexts, weights, reg_scale)
        trainer.apply(grads)
        on_step(trainer.step, loss)
        if checkpoint is not None and time.monotonic() - last_save > CHECKPOINT_EVERY_S:
            trainer.save(checkpoint)
            last_save = time.monotonic()
    if checkpoint is not None:
        trainer.save(checkpoint)


@dataclass(frozen=True)
class Acceptance:
    """Held-out greedy acceptance of a chained draft: per position j, the share of rows where
    draft token j is the target's greedy token given that tokens 1..j-1 were (conditional), and
    of all rows (cumulative); top-3 at position 1; rows evaluated."""

    conditional: tuple[float, ...]
    cumulative: tuple[float, ...]
    top3_first: float
    n_rows: int

    def expected_tokens(self, k: int) -> float:
        """Tokens a step yields with a k-token draft: 1 + the cumulative acceptances."""
        return 1.0 + sum(self.cumulative[:k])


def evaluate(
    params: Params, batches: Batches, vocab_ids: np.ndarray, *, token_input: bool = True
) -> Acceptance:
    """Chained greedy drafts from every generated row of the held-out greedy answers."""
    corpus = batches.corpus
    rows = corpus.sample_rows(batches.depth, generated_only=True)
    true_ids = [corpus.top_ids[rows + j, 0] for j in range(1, batches.depth + 1)]
    correct = np.zeros((len(rows), batches.depth), dtype=bool)
    top3 = np.zeros(len(rows), dtype=bool)
    for lo in range(0, len(rows), 2048):
        chunk = rows[lo : lo + 2048]
        h, embeds, _, _ = batches.at(chunk)
        for j in range(batches.depth):
            e = embeds[j] if token_input else np.zeros_like(embeds[j])
            logits, f, _ = forward(params, h, e)
            pred = vocab_ids[logits.argmax(axis=1)]
            correct[lo : lo + len(chunk), j] = pred == true_ids[j][lo : lo + len(chunk)]
            if j == 0:
                best3 = vocab_ids[np.argpartition(logits, -3, axis=1)[:, -3:]]
                top3[lo : lo + len(chunk)] = (best3 == true_ids[0][lo : lo + len(chunk), None]).any(
                    1
                )
            h = f
    return _acceptance(correct, top3)


def _acceptance(correct: np.ndarray, top3: np.ndarray) -> Acceptance:
    alive = np.ones(len(correct), dtype=bool)
    conditional, cumulative = [], []
    for j in range(correct.shape[1]):
        n_alive = int(alive.sum())
        hits = alive & correct[:, j]
        conditional.append(float(hits.sum() / n_alive) if n_alive else 0.0)
        cumulative.append(float(hits.mean()))
        alive = hits
    return Acceptance(tuple(conditional), tuple(cumulative), float(top3.mean()), len(correct))
