"""`edge-spec head train`: collect, train, measure, export -- within a time budget, resumable.

The work directory (`heads/<sha>/work/` in the model cache) keeps the collected shards, the
reduced vocabulary and the training checkpoint, so a run that was stopped picks up where it
was: collection skips the prompts it has, training continues from its checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from edge_spec.errors import EdgeSpecError, InvalidRequestError
from edge_spec.files import atomic_output
from edge_spec.headtrain import data as data_mod
from edge_spec.headtrain.export import export_onnx
from edge_spec.headtrain.train import (
    BATCH,
    DEPTH,
    DEPTH_WEIGHTS,
    EVAL_DEPTH,
    Acceptance,
    Batches,
    Trainer,
    evaluate,
    forward,
    init_params,
    train_steps,
)
from edge_spec.models.heads import (
    GRAPH_NAME,
    INFO_NAME,
    HeadInfo,
    TargetEmbeddings,
    head_dir,
    load_info,
)

log = logging.getLogger(__name__)

REDUCED_VOCAB = 4096
HIDDEN_PER_EMBD = 2  # H = 2 d
MIN_TRAIN_SHARE = 0.2  # of the budget, at least, for training
MEDUSA_SHARE = 0.1  # of the training time, for the baseline
MAX_EPOCHS = 8
RESERVE_S = 15.0  # evaluation and export at the end


@dataclass(frozen=True)
class TrainReport:
    head_dir: Path
    n_train_rows: int
    n_eval_rows: int
    vocab_coverage: float  # share of training labels inside the reduced vocabulary
    collect_s: float
    train_s: float
    total_s: float
    steps: int
    eagle: Acceptance
    medusa_first: float  # the Medusa-style baseline's top-1 at position 1
    exported: bool = True  # False: the head already there measured better and was kept


def train_head(
    target_path: Path,
    *,
    minutes: float = 30.0,
    max_rows: int = 2_000_000,
    seed: int = 0,
    n_threads: int | None = None,
    eval_prompts: int = data_mod.EVAL_PROMPTS,
    progress: Callable[[str, int, int], None] = lambda stage, done, total: None,
) -> TrainReport:
    """Collect self-distillation data and train a head for this target within `minutes` (wall
    time from now, collection included); export it to the model cache. Raises
    InvalidRequestError when the budget left too little data to train on."""
    from edge_spec.files import file_sha256

    t_start = time.monotonic()
    deadline = t_start + minutes * 60.0
    sha = file_sha256(target_path)
    out_dir = head_dir(sha)
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)

    # Collect while the time left would still train MAX_EPOCHS over what is collected (and
    # at least MIN_TRAIN_SHARE of the budget is left for training).
    embeddings = TargetEmbeddings(target_path)
    step_s = _step_seconds(embeddings.n_embd)

    def collect_deadline(n_rows: int) -> float:
        train_s = MAX_EPOCHS * n_rows / BATCH * step_s / (1.0 - MEDUSA_SHARE)
        train_s = max(train_s, MIN_TRAIN_SHARE * minutes * 60.0)
        return deadline - RESERVE_S - train_s

    data_mod.collect(
        target_path,
        work,
        max_rows=max_rows,
        deadline=collect_deadline,
        on_rows=lambda n: progress("collect", n, max_rows),
        n_threads=n_threads,
        eval_prompts=eval_prompts,
    )
    collect_s = time.monotonic() - t_start
    train_corpus, eval_corpus = data_mod.load(work)

    checkpoint = work / "checkpoint.npz"
    resume = checkpoint.exists() and _unfinished(checkpoint)
    vocab_ids, coverage = _reduced_vocab(work, train_corpus, resume)
    embed = _embedding_table(embeddings, train_corpus, eval_corpus)
    label_index = {int(t): i for i, t in enumerate(vocab_ids)}
    hidden = train_corpus.hidden[:: max(1, train_corpus.n_rows // 20000)].astype(np.float32)
    s_h = float(1.0 / np.sqrt((hidden**2).mean()))
    sample_e = embed(train_corpus.tokens[:: max(1, train_corpus.n_rows // 20000)])
    s_e = float(1.0 / np.sqrt((sample_e**2).mean() + 1e-12))
    reg_scale = s_h**2
    d = embeddings.n_embd

    train_batches = Batches(train_corpus, embed, label_index, DEPTH, seed)
    if len(train_batches.rows) < BATCH:
        raise InvalidRequestError(
            f"{len(train_batches.rows)} training rows collected, at least {BATCH} needed: "
            "give more --minutes or --tokens"
        )
    eval_batches = Batches(eval_corpus, embed, label_index, EVAL_DEPTH, seed)
    t_train = time.monotonic()
    train_budget_s = max(deadline - t_train - RESERVE_S, 10.0)
    epoch_steps = max(len(train_batches.rows) // BATCH, 1)

    # The baseline: Medusa-style, h_t alone -> x_{t+2}, a small share of the time.
    medusa = Trainer(
        init_params(d, d, embeddings.output_rows(vocab_ids), s_h, s_e, seed + 1),
        MAX_EPOCHS * epoch_steps,
    )
    medusa_deadline = t_train + MEDUSA_SHARE * train_budget_s
    train_steps(
        medusa,
        train_batches,
        weights=(1.0,),
        reg_scale=reg_scale,
        deadline=medusa_deadline,
        token_input=False,
    )

    # A finished run is not resumed (resume is False): it trains again, on the data now.
    trainer = Trainer.load(checkpoint) if resume else None
    if trainer is not None and trainer.params.Wout.shape != (len(vocab_ids), d):
        trainer = None
    if trainer is not None:
        train_batches.rng = np.random.default_rng(seed + trainer.step)  # not the same batches
    else:
        params = init_params(
            d, HIDDEN_PER_EMBD * d, embeddings.output_rows(vocab_ids), s_h, s_e, seed
        )
        trainer = Trainer(params, 10**9)
        # Size the cosine schedule to the time left: three timed steps first.
        t0 = time.monotonic()
        trainer.total_steps = 3
        train_steps(
            trainer, train_batches, weights=DEPTH_WEIGHTS, reg_scale=reg_scale, deadline=deadline
        )
        per_step = max((time.monotonic() - t0) / max(trainer.step, 1), 1e-3)
        left = deadline - time.monotonic() - RESERVE_S
        trainer.total_steps = int(min(MAX_EPOCHS * epoch_steps, max(left / per_step, 10)))
    total = trainer.total_steps
    train_steps(
        trainer,
        train_batches,
        weights=DEPTH_WEIGHTS,
        reg_scale=reg_scale,
        deadline=deadline - RESERVE_S,
        checkpoint=checkpoint,
        on_step=lambda step, loss: progress("train", step, total),
    )
    train_s = time.monotonic() - t_train

    eagle = evaluate(trainer.params, eval_batches, vocab_ids)
    medusa_eval = evaluate(
        medusa.params,
        Batches(eval_corpus, embed, label_index, 1, seed),
        vocab_ids,
        token_input=False,
    )
    report = TrainReport(
        head_dir=out_dir,
        n_train_rows=train_corpus.n_rows,
        n_eval_rows=eagle.n_rows,
        vocab_coverage=coverage,
        collect_s=collect_s,
        train_s=train_s,
        total_s=time.monotonic() - t_start,
        steps=trainer.step,
        eagle=eagle,
        medusa_first=medusa_eval.cumulative[0],
    )
    info = HeadInfo(
        target_sha256=sha,
        kind="eagle",
        n_embd=d,
        hidden_size=HIDDEN_PER_EMBD * d,
        vocab_ids=tuple(int(i) for i in vocab_ids),
        trained=_summary(report, target_path),
    )
    previous = _previous_first_position(out_dir)
    if previous is not None and previous > eagle.conditional[0]:
        log.warning(
            "kept the head already in %s: its held-out acceptance at position 1 (%.3f) beats "
            "this run's (%.3f)",
            out_dir,
            previous,
            eagle.conditional[0],
        )
        return replace(report, exported=False)
    export_onnx(trainer.params, out_dir / GRAPH_NAME)
    with atomic_output(out_dir / INFO_NAME) as tmp:
        tmp.write_text(json.dumps(info.to_json()))
    return report


def _unfinished(checkpoint: Path) -> bool:
    with np.load(checkpoint) as data:
        return int(data["step"]) < int(data["total_steps"])


def _previous_first_position(out_dir: Path) -> float | None:
    """The held-out position-1 acceptance of the head already exported there, if any."""
    if not (out_dir / INFO_NAME).is_file():
        return None
    try:
        return float(load_info(out_dir).trained["eagle"]["conditional"][0])
    except (EdgeSpecError, KeyError, IndexError, TypeError, ValueError):
        return None


def _step_seconds(n_embd: int) -> float:
    """One training step's time here, timed on random data of this width (a few steps)."""
    rng = np.random.default_rng(0)
    d = n_embd
    params = init_params(
        d, HIDDEN_PER_EMBD * d, rng.standard_normal((REDUCED_VOCAB, d)), 1.0, 1.0, 0
    )
    h = rng.standard_normal((BATCH, d)).astype(np.float32)
    t0 = time.perf_counter()
    for _ in range(2):
        for _ in range(DEPTH):
            forward(params, h, h)
    # A step is DEPTH forwards and as many backwards, about twice a forward's work each.
    return (time.perf_counter() - t0) / 2 * 3


def _reduced_vocab(work: Path, corpus: data_mod.Corpus, resume: bool) -> tuple[np.ndarray, float]:
    """The REDUCED_VOCAB most frequent greedy labels of the training rows (kept in the work
    directory so that a resumed run trains the same rows; chosen again on a fresh start), and
    the share of labels covered."""
    path = work / "vocab.npy"
    labels = corpus.top_ids[:, 0]
    if resume and path.exists():
        vocab = np.load(path)
    else:
        ids, counts = np.unique(labels, return_counts=True)
        vocab = ids[np.argsort(-counts, kind="stable")[:REDUCED_VOCAB]].astype(np.int64)
        np.save(path, vocab)
    return vocab, float(np.isin(labels, vocab).mean())


def _embedding_table(
    embeddings: TargetEmbeddings, *corpora: data_mod.Corpus
) -> Callable[[np.ndarray], np.ndarray]:
    """E(x) for every token the corpora hold, dequantized once."""
    ids = np.unique(np.concatenate([c.tokens for c in corpora]))
    table = embeddings.rows(ids)
    index = np.zeros(int(ids.max()) + 1, dtype=np.int64)
    index[ids] = np.arange(len(ids))
    return lambda tokens: table[index[tokens]]


def report_dict(report: TrainReport) -> dict:
    data = asdict(report)
    data["head_dir"] = str(report.head_dir)
    return data


def _summary(report: TrainReport, target_path: Path) -> dict:
    data = report_dict(report)
    data["target"] = target_path.name
    data["trained_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return data
