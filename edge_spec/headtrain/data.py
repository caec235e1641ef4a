"""Self-distillation data for a draft head, collected from the target and kept on disk.

The target answers the project's prompt set (edge_spec.headtrain.prompts): a chat model
through its own chat template, a base model by continuing a document opening. Held-out topics
are answered greedily and kept apart for evaluation; training prompts are answered greedily
(three in four, what a T = 0 request drafts against) or sampled at T = 0.8 (variety). Every
row gives the target's final hidden state and its most likely next tokens.

Shards are appended as the prompts finish (`shard-NNNN.npz` in the work directory), so an
interrupted collection resumes where it stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_spec.backend import LlamaModel
from edge_spec.backend.features import FeatureCollector, SequenceFeatures
from edge_spec.errors import InvalidRequestError
from edge_spec.files import atomic_output
from edge_spec.headtrain.prompts import HeadPrompt, head_prompts
from edge_spec.models.templates import choose_template, render_chat

log = logging.getLogger(__name__)

MAX_NEW_TOKENS = 320
N_PARALLEL = 32
SAMPLED_ONE_IN = 4  # training prompts answered at T = 0.8 instead of greedily
SAMPLE_TEMPERATURE = 0.8
EVAL_PROMPTS = 48  # held-out prompts collected first, for evaluation
SHARD_SEQUENCES = 32


@dataclass(frozen=True)
class Corpus:
    """Sequences concatenated: rows starts[s]..starts[s + 1] belong to sequence s."""

    tokens: np.ndarray  # int32 (n,)
    hidden: np.ndarray  # float16 (n, n_embd)
    top_ids: np.ndarray  # int32 (n, TOP)
    starts: np.ndarray  # int64 (n_seq + 1,)
    n_prompt: np.ndarray  # int32 (n_seq,)
    greedy: np.ndarray  # bool (n_seq,): answered greedily

    @property
    def n_rows(self) -> int:
        return len(self.tokens)

    def sample_rows(self, depth: int, *, generated_only: bool = False) -> np.ndarray:
        """Rows i from which a chain of `depth` head steps has labels: i + depth < the end of
        i's sequence (step j reads row i + j - 1's token after it and row i + j's argmax).
        generated_only: rows in the answer (not the prompt) of greedy sequences only."""
        out = []
        for s in range(len(self.starts) - 1):
            lo, hi = int(self.starts[s]), int(self.starts[s + 1])
            if generated_only:
                if not self.greedy[s]:
                    continue
                lo += max(int(self.n_prompt[s]) - 1, 0)
            if hi - depth > lo:
                out.append(np.arange(lo, hi - depth))
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def prompt_tokens(target_path: Path, prompts: list[HeadPrompt]) -> list[list[int]]:
    """Each prompt as the target will see it: through its chat template when it has one (the
    GGUF's own), else the document opening."""
    model = LlamaModel(target_path, n_ctx=64)
    try:
        info = model.info
        chat = info.chat_template is not None
        template = choose_template(None, info.chat_template, info.architecture)
        bos = model.token_text(info.bos_id).decode("utf-8", "replace")
        eos = model.token_text(info.eos_id).decode("utf-8", "replace")
        out = []
        for prompt in prompts:
            if chat:
                text = render_chat(
                    template.text,
                    [{"role": "user", "content": prompt.chat}],
                    bos_token=bos,
                    eos_token=eos,
                )
            else:
                text = prompt.text
            out.append(model.tokenize(text, add_special=True, parse_special=chat))
        return out
    finally:
        model.close()


def collect(
    target_path: Path,
    work_dir: Path,
    *,
    max_rows: int,
    deadline: Callable[[int], float],
    on_rows: Callable[[int], None] = lambda n: None,
    n_threads: int | None = None,
    eval_prompts: int = EVAL_PROMPTS,
) -> None:
    """Collect until the work directory holds max_rows training rows (besides the held-out
    evaluation set) or time.monotonic() passes deadline(training rows so far); the held-out set
    is always collected whole first. Resumes from existing shards."""
    work_dir.mkdir(parents=True, exist_ok=True)
    done, rows = _done(work_dir)
    on_rows(rows)
    held = head_prompts(held_out=True)[:eval_prompts]
    train = head_prompts(held_out=False)
    # Prompt indices: held-out ones first (-1 - i), then training ones (i).
    plan = [(-1 - i, p, 0.0) for i, p in enumerate(held)]
    plan += [
        (i, p, SAMPLE_TEMPERATURE if i % SAMPLED_ONE_IN == SAMPLED_ONE_IN - 1 else 0.0)
        for i, p in enumerate(train)
    ]
    todo = [(i, p, t) for i, p, t in plan if i not in done]
    # The held-out set is collected whole, whatever the budget: an evaluation on a part of it
    # would depend on how loaded the machine was (it is small and runs beside training rows).
    held_left = sum(1 for i, _, _ in todo if i < 0)
    if not todo or (held_left == 0 and time.monotonic() >= deadline(rows)):
        return
    tokens = prompt_tokens(target_path, [p for _, p, _ in todo])
    n_rows = rows

    def stop() -> bool:
        if held_left > 0:
            return False
        return n_rows >= max_rows or time.monotonic() >= deadline(n_rows)

    with FeatureCollector(target_path, n_parallel=N_PARALLEL, n_threads=n_threads) as collector:
        # Greedy first (the held-out set and most training rows), then the sampled ones.
        for temperature in (0.0, SAMPLE_TEMPERATURE):
            group = [(i, tok) for (i, _, t), tok in zip(todo, tokens) if t == temperature]
            pending: list[SequenceFeatures] = []
            for seq in collector.run(
                group, max_new_tokens=MAX_NEW_TOKENS, temperature=temperature, should_stop=stop
            ):
                pending.append(seq)
                if seq.prompt_index >= 0:
                    n_rows += len(seq.tokens)
                    on_rows(n_rows)
                else:
                    held_left -= 1
                if len(pending) == SHARD_SEQUENCES:
                    _write_shard(work_dir, pending, greedy=temperature == 0.0)
                    pending = []
            _write_shard(work_dir, pending, greedy=temperature == 0.0)
            if stop():
                return


def _shards(work_dir: Path) -> list[Path]:
    return sorted(work_dir.glob("shard-*.npz"))


def _done(work_dir: Path) -> tuple[set[int], int]:
    done: set[int] = set()
    rows = 0
    for shard in _shards(work_dir):
        with np.load(shard) as data:
            index = data["prompt_index"]
            done.update(int(i) for i in index)
            lengths = np.diff(data["starts"])
            rows += int(lengths[index >= 0].sum())
    return done, rows


def _write_shard(work_dir: Path, sequences: list[SequenceFeatures], *, greedy: bool) -> None:
    if not sequences:
        return
    n = len(_shards(work_dir))
    lengths = [len(s.tokens) for s in sequences]
    with atomic_output(work_dir / f"shard-{n:04d}.npz") as tmp:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                prompt_index=np.array([s.prompt_index for s in sequences], dtype=np.int32),
                starts=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                n_prompt=np.array([s.n_prompt for s in sequences], dtype=np.int32),
                greedy=np.full(len(sequences), greedy),
                tokens=np.concatenate([s.tokens for s in sequences]),
                hidden=np.concatenate([s.hidden for s in sequences]),
                top_ids=np.concatenate([s.top_ids for s in sequences]),
                top_logits=np.concatenate([s.top_logits for s in sequences]),
            )


def load(work_dir: Path) -> tuple[Corpus, Corpus]:
    """(training corpus, held-out corpus) from the work directory's shards."""
    parts: dict[bool, list[dict[str, np.ndarray]]] = {True: [], False: []}
    for shard in _shards(work_dir):
        with np.load(shard) as data:
            arrays = {key: data[key] for key in data.files}
        index, starts = arrays["prompt_index"], arrays["starts"]
        for s in range(len(index)):
            lo, hi = int(starts[s]), int(starts[s + 1])
            parts[bool(index[s] < 0)].append(
                {
                    "tokens": arrays["tokens"][lo:hi],
                    "hidden": arrays["hidden"][lo:hi],
                    "top_ids": arrays["top_ids"][lo:hi],
                    "n_prompt": arrays["n_prompt"][s],
                    "greedy": arrays["greedy"][s],
                }
            )
    return _corpus(parts[False]), _corpus(parts[True])


def _corpus(seqs: list[dict[str, np.ndarray]]) -> Corpus:
    if not seqs:
        raise InvalidRequestError(
            "no answers were collected within the budget: give more --minutes"
        )
    lengths = [len(s["tokens"]) for s in seqs]
    return Corpus(
        tokens=np.concatenate([s["tokens"] for s in seqs]),
        hidden=np.concatenate([s["hidden"] for s in seqs]),
        top_ids=np.concatenate([s["top_ids"] for s in seqs]),
        starts=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        n_prompt=np.array([s["n_prompt"] for s in seqs], dtype=np.int32),
        greedy=np.array([bool(s["greedy"]) for s in seqs]),
    )
