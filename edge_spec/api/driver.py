"""One generation, from the prompt's token ids to its last delta: the decode loop's steps
(decode/engine.py) become text deltas (stop strings, whole UTF-8 characters, accepted-draft
spans, logprobs), and the last delta carries the GenerationResult with its statistics.
EdgeSpec (spec.py) chooses the sources and the policy and holds the lock around it."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edge_spec.api.config import (
    FinishReason,
    GenerationConfig,
    GenerationResult,
    TextDelta,
    TokenLogprob,
)
from edge_spec.backend import LlamaModel
from edge_spec.constrain.matcher import GrammarConstraint
from edge_spec.constrain.tools import CallFormat
from edge_spec.decode.engine import Prefill, Step, run_steps
from edge_spec.decode.logprobs import PromptScores, RowLogprobs
from edge_spec.decode.stats import StatsCollector
from edge_spec.decode.text import Span, TextAssembler
from edge_spec.drafts import DraftSource
from edge_spec.modes import DraftMode
from edge_spec.policy.types import KPolicy, SourceName


@dataclass(frozen=True)
class Generation:
    """What one generation runs with, chosen by EdgeSpec."""

    target: LlamaModel
    sources: Mapping[SourceName, DraftSource]
    policy: KPolicy
    cfg: GenerationConfig
    mode: DraftMode
    call_format: CallFormat
    constraint: GrammarConstraint | None = None
    target_name: str = ""
    draft_name: str | None = None  # what drafted in the learned-draft slot
    known_scores: PromptScores | None = None  # the last scored prompt's rows (its prefix kept)


def deltas(run: Generation, prompt_ids: list[int]) -> Iterator[TextDelta]:
    """The text deltas of one generation; the last carries the result."""
    cfg, target = run.cfg, run.target
    t_start = time.perf_counter()
    stats = StatsCollector({slot: source.name for slot, source in run.sources.items()})
    text = TextAssembler(cfg.stop)
    token_ids: list[int] = []
    new_ids: list[int] = []
    scored: list[TokenLogprob] = []  # with cfg.logprobs: one per token of token_ids
    prompt_scored: tuple[TokenLogprob, ...] | None = None  # cfg.prompt_logprobs
    unsent = None  # the prompt's logprobs until the first delta carries them
    end_scored: TokenLogprob | None = None  # the end-of-generation token's
    finish: FinishReason | None = None
    steps = run_steps(
        target,
        run.sources,
        run.policy,
        prompt_ids,
        k_max=max((cfg.k or 0) + (cfg.tree_nodes or 0), cfg.k_max),
        max_tokens=cfg.max_tokens,
        sampling=cfg.sampling,
        constraint=run.constraint,
        logprobs=cfg.logprobs,
        scored_prompt=cfg.prompt_logprobs,
        known_scores=run.known_scores,
    )
    try:
        for event in steps:
            if isinstance(event, Prefill):
                stats.prefill(event)
                if cfg.prompt_logprobs is not None:
                    first = TokenLogprob(prompt_ids[0], target.token_bytes(prompt_ids[0]), None)
                    prompt_scored = (first, *_scored(target, event.logprobs))
                    unsent = prompt_scored
                continue
            stats.step(event)
            new_ids, finish = _take(target, event, len(token_ids), text, cfg.max_tokens)
            token_ids.extend(new_ids)
            scored.extend(_scored(target, event.logprobs[: len(new_ids)]))
            if finish == "eos" and len(event.logprobs) > len(new_ids):
                end_scored = _scored(target, event.logprobs[len(new_ids) :][:1])[0]
            if finish is not None:
                break
            spans = text.take_ready_spans()
            new_scored = tuple(scored[len(token_ids) - len(new_ids) :])
            yield TextDelta(
                _join(spans), tuple(new_ids), None, None, tuple(spans), new_scored, unsent
            )
            new_ids, unsent = [], None
    finally:
        steps.close()
    if finish is None:  # the loop ran out: max_tokens reached or the context is full
        finish = "length" if len(token_ids) >= cfg.max_tokens else "context"
    tail = text.finish_spans()
    content, calls = text.text, []
    if cfg.tool_mode != "none":
        content, calls = run.call_format.parse(text.text, cfg.tools)
        # Only whole calls parse: an answer cut inside its first call finishes "length"; one
        # cut inside a later call returns its whole calls (agent loops go on with them, where
        # "length" would stop them).
        finish = "tool_calls" if calls else finish
    elapsed_s = time.perf_counter() - t_start
    constraint = run.constraint
    result = GenerationResult(
        text=text.text,
        finish_reason=finish,
        token_ids=tuple(token_ids),
        prompt_token_ids=tuple(prompt_ids),
        target=run.target_name,
        draft=run.draft_name,
        draft_mode=run.mode,
        policy=run.policy.name,
        k=cfg.k,
        stats=stats.result(
            len(prompt_ids),
            len(token_ids),
            elapsed_s,
            constraint.mask_s if constraint is not None else 0.0,
        ),
        draft_vocab=_draft_vocab(run.sources),
        tool_calls=tuple(calls),
        content=content,
        constraint_complete=constraint.complete if constraint is not None else None,
        logprobs=tuple(scored) if cfg.logprobs is not None else None,
        stop_string=text.matched if finish == "stop" else None,
        prompt_logprobs=prompt_scored,
        end_logprob=end_scored,
    )
    last = tuple(scored[len(token_ids) - len(new_ids) :])
    yield TextDelta(_join(tail), tuple(new_ids), finish, result, tuple(tail), last, unsent)


def _take(
    target: LlamaModel, step: Step, n_before: int, text: TextAssembler, max_tokens: int
) -> tuple[list[int], FinishReason | None]:
    """The step's tokens up to the first end condition, and that condition if one was met."""
    taken: list[int] = []
    for i, token in enumerate(step.tokens):
        if target.is_eog(token):
            return taken, "eos"
        taken.append(token)
        if text.feed(target.token_bytes(token), from_draft=i < step.n_accepted):
            return taken, "stop"
        if n_before + len(taken) >= max_tokens:
            return taken, "length"
    return taken, None


def _scored(target: LlamaModel, rows: Sequence[RowLogprobs]) -> list[TokenLogprob]:
    """The engine's logprobs with each token's bytes."""

    def scored(token: int, logprob: float, top: tuple[Any, ...] = ()) -> TokenLogprob:
        return TokenLogprob(token, target.token_bytes(token), logprob, top)

    return [scored(r.token, r.logprob, tuple(scored(t, lp) for t, lp in r.top)) for r in rows]


def _draft_vocab(sources: Mapping[SourceName, DraftSource]) -> str | None:
    return getattr(sources["model"], "vocabulary", None) if "model" in sources else None


def _join(spans: Sequence[Span]) -> str:
    return "".join(text for text, _ in spans)
