"""The decode loop: draft -> one batched target pass -> verify -> roll back -> repeat.

Invariant between steps: the target's KV cache holds context[:-1]; the last token (the
target's latest choice, or the prompt's last token) is decoded at the head of the next batch,
so every step asks the target for exactly k + 1 logit rows and nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edge_spec.backend import LlamaModel
from edge_spec.decode.constraint import StepConstraint
from edge_spec.decode.logprobs import (
    PromptScores,
    RowLogprobs,
    chosen_rows,
    prompt_logprobs,
    token_logprobs,
)
from edge_spec.decode.verify import (
    Verdict,
    verify_constrained,
    verify_greedy,
    verify_keyed,
    verify_tree,
)
from edge_spec.drafts import NO_DRAFT, Draft, DraftSource, LazyModelDraft, ModelDraft, NgramDraft
from edge_spec.drafts.candidates import NgramCandidate
from edge_spec.errors import ContextOverflowError, InvalidRequestError
from edge_spec.policy.trees import alternate_tree, token_tree
from edge_spec.policy.types import KPolicy, SourceName, StepOutcome, StepPlan
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.penalties import penalize_rows
from edge_spec.sampling.transform import SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """What one speculative step produced: the new tokens (accepted draft tokens, then one
    token chosen by the target), which source drafted, the k the policy planned, and where the
    time went."""

    tokens: tuple[int, ...]
    source: str  # a policy source ("model", "ngram", "none"), or "grammar": forced text alone
    k_planned: int
    n_drafted: int
    n_accepted: int
    draft_s: float  # planning and drafting
    verify_s: float  # the target pass, verification, rollback and policy feedback
    decode_s: float = 0.0  # of draft_s + verify_s, the time inside llama_decode (both models)
    n_branch_nodes: int = 0  # a token tree: its branch tokens (also counted in n_drafted)
    n_branch_accepted: int = 0  # accepted tokens that came from a branch
    depth: int = 0  # a token tree: its deepest draft position + 1 (a chain: n_drafted)
    # Under a grammar: the text it forced, drafted ahead of the source's own tokens (also
    # counted in n_drafted), and how much of it was accepted (in n_accepted).
    n_forced: int = 0
    n_forced_accepted: int = 0
    # Draft sources that failed in this step and are set aside for the rest of the request:
    # (source name, the error), the request going on without them.
    set_aside: tuple[tuple[str, str], ...] = ()
    # Asked for (run_steps' logprobs): each token's logprob under the target, and its row's top.
    logprobs: tuple[RowLogprobs, ...] = ()

    @property
    def n_positions(self) -> int:
        """How many draft positions (1, 2, ...) the step proposed a token for."""
        return self.depth if self.n_branch_nodes else self.n_drafted


@dataclass(frozen=True)
class Prefill:
    n_prompt: int
    n_cached: int  # prompt tokens whose KV was reused from the previous request
    prefill_s: float
    set_aside: tuple[tuple[str, str], ...] = ()  # draft sources that failed to begin
    # Asked for (run_steps' scored_prompt): the logprobs of prompt[1:] (decode.logprobs).
    logprobs: tuple[RowLogprobs, ...] = ()


class _Aside:
    """The request's draft sources that failed: each is set aside (reset, logged once) and the
    request goes on without it. A draft never fails a request the target alone would answer."""

    def __init__(self, sources: Mapping[str, DraftSource]) -> None:
        self.sources = sources
        self.failed: dict[str, str] = {}
        self.new: list[tuple[str, str]] = []

    def fail(self, name: str, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {exc}"[:300]
        self.failed[name] = reason
        self.new.append((name, reason))
        log.warning("draft source %s set aside for this request: %s", name, reason)
        reset = getattr(self.sources.get(name), "reset", None)
        if reset is not None:
            try:  # its caches may be half-written: start it clean for the next request
                reset()
            except Exception:  # noqa: BLE001 - already set aside; nothing more to do
                log.debug("resetting %s failed too", name, exc_info=True)

    def take(self) -> tuple[tuple[str, str], ...]:
        out, self.new = tuple(self.new), []
        return out


def run_steps(
    target: LlamaModel,
    sources: Mapping[SourceName, DraftSource],
    policy: KPolicy,
    prompt: Sequence[int],
    *,
    k_max: int,
    max_tokens: int,
    sampling: SamplingParams,
    constraint: StepConstraint | None = None,
    logprobs: int | None = None,
    scored_prompt: int | None = None,
    known_scores: PromptScores | None = None,
) -> Iterator[Prefill | Step]:
    """Yields one Prefill, then Steps until max_tokens tokens were produced or the context is
    full (the caller stops earlier at EOS or a stop string by closing the generator). With
    logprobs (the top alternatives wanted, 0 for none), each Step carries its tokens' logprobs;
    with scored_prompt, the Prefill carries the prompt's (its whole prefill is then decoded,
    but for the rows known_scores keeps from the last scored prompt).

    Requires a non-empty prompt that fits in the target's context, k_max >= 0, max_tokens >= 0,
    and "none" among the sources; the policy picks a source and k <= k_max for every step.
    With a constraint (in its initial state), every token is the grammar-masked target's own
    choice, and the text the grammar forces is drafted ahead of the sources' tokens.
    """
    if not prompt:
        raise InvalidRequestError("the prompt is empty")
    if k_max < 0:
        raise InvalidRequestError(f"k must be >= 0, got {k_max}")
    if len(prompt) > target.n_ctx:
        raise ContextOverflowError(
            f"prompt of {len(prompt)} tokens does not fit in the context of {target.n_ctx}"
        )
    keys = SampleKeys(sampling.seed)  # draws keyed by (seed, position): drafts change nothing
    context = list(prompt)
    names = tuple(sources)
    drafting = any(name != "none" for name in names)  # else the target alone: no forced drafts
    ngram = sources.get("ngram")
    # Token trees need a target that keeps one sequence per branch, and a policy that plans them.
    trees = policy.tree_nodes > 0 and target.max_tree_leaves > 1
    # Draft heads read the target's hidden state of the row that chose the newest token.
    heads = [(n, s) for n, s in sources.items() if getattr(s, "wants_hidden", False)]
    if heads and not target.hidden_states:
        raise InvalidRequestError("a draft head needs a target loaded with hidden_states=True")

    t0 = time.perf_counter()
    if scored_prompt is None:
        cached, scored = target.sync(context[:-1]), ()
    else:
        scored, cached = prompt_logprobs(target, context, scored_prompt, known_scores)
    model = sources.get("model")
    lag = model.lag(context) if isinstance(model, ModelDraft) else 1
    aside = _Aside(sources)
    for name, source in sources.items():
        # A draft model the policy does not expect to pay for its prefill (and its load) is not
        # prefilled: the time to first token stays the target's own, and a later first draft
        # catches up.
        if not isinstance(source, ModelDraft) or policy.wants_model(lag, _unloaded_s(source)):
            try:
                source.begin(context)
            except Exception as exc:  # noqa: BLE001 - a draft never fails the request
                aside.fail(name, exc)
    policy.begin(model.lag(context) if isinstance(model, ModelDraft) else 1, _unloaded_s(model))
    yield Prefill(len(prompt), cached, time.perf_counter() - t0, aside.take(), scored)

    models = [target, *sources.values()]  # what spends time inside llama_decode
    n_out = 0
    while n_out < max_tokens and len(context) <= target.n_ctx:
        # The batch [last, d_1..d_k] lands at positions len-1 .. len-1+k, all < n_ctx.
        k_cap = min(k_max, target.n_ctx - len(context), max_tokens - n_out - 1, target.n_batch - 1)
        t0 = time.perf_counter()
        decode0_s = sum(m.decode_s for m in models)
        # The grammar's forced text first (free to draft); the sources draft what follows it.
        forced = constraint.forced(k_cap) if constraint is not None and drafting else []
        ahead, cap = (context + forced, k_cap - len(forced)) if forced else (context, k_cap)
        candidate = None
        if isinstance(ngram, NgramDraft) and "ngram" not in aside.failed:
            try:
                candidate = ngram.candidate(ahead, cap, branches=trees and not forced)
            except Exception as exc:  # noqa: BLE001 - a draft never fails the request
                aside.fail("ngram", exc)
        live = tuple(name for name in names if name not in aside.failed)
        plan = policy.plan(live, cap, candidate)
        load_s = 0.0
        try:
            load_s = _load(sources.get(plan.source))  # charged to the ledger, not as drafting
            t0 += load_s
            draft, branch_weights = _propose(
                plan,
                sources,
                candidate,
                ahead,
                sampling,
                keys,
                policy,
                target.max_tree_leaves if trees and not forced else 1,
                cap,
            )
            draft, branch_weights = _in_vocab(draft, branch_weights, target.n_vocab)
        except Exception as exc:  # noqa: BLE001 - a draft never fails the request
            aside.fail(plan.source, exc)
            draft, branch_weights = NO_DRAFT, ()
        if constraint is not None:
            draft, branch_weights = _allowed(constraint, forced, draft, branch_weights)
        n_forced = min(len(forced), len(draft.tokens))
        t1 = time.perf_counter()
        verdict, hidden, step_logprobs = _target_pass(
            target, draft, context, sampling, keys, bool(heads), constraint, logprobs
        )
        n_forced_accepted = min(n_forced, verdict.n_accepted)
        context.extend(verdict.tokens)
        for name, head in heads:
            if name not in aside.failed:
                try:
                    head.observe(len(context), hidden)
                except Exception as exc:  # noqa: BLE001 - a draft never fails the request
                    aside.fail(name, exc)
        n_out += len(verdict.tokens)
        t2 = time.perf_counter()
        match_len = candidate.match_len if candidate and plan.source == "ngram" else 0
        n_main = len(draft.tokens) - len(branch_weights)  # tree: main chain, then branches
        n_branch_accepted = sum(i >= n_main for i in verdict.path)
        # The policy's own draft is what followed the forced text (never reached if the
        # target took another way through that text).
        reached = n_forced_accepted == n_forced
        policy.update(
            StepOutcome(
                plan.source,
                len(draft.tokens) - n_forced if reached else 0,
                verdict.n_accepted - n_forced if reached else 0,
                draft.confidences,
                match_len,
                t1 - t0,
                t2 - t1,
                tokens=verdict.tokens[n_forced:] if reached else (),
                n_branch_nodes=len(branch_weights),
                n_branch_accepted=n_branch_accepted,
                branch_weight=sum(branch_weights),
                load_s=load_s,
            )
        )
        yield Step(
            verdict.tokens,
            "grammar" if n_forced and plan.source == "none" else plan.source,
            plan.k,
            len(draft.tokens),
            verdict.n_accepted,
            t1 - t0,
            t2 - t1,
            sum(m.decode_s for m in models) - decode0_s,
            len(branch_weights),
            n_branch_accepted,
            _depth(draft),
            n_forced,
            n_forced_accepted,
            aside.take(),
            step_logprobs,
        )


def _unloaded_s(source: DraftSource | None) -> float:
    """What loading a draft model that loads on first use is expected to cost (0 once loaded,
    or for any other source)."""
    if not isinstance(source, LazyModelDraft) or source.loaded is not None:
        return 0.0
    return source.expected_load_s


def _load(source: DraftSource | None) -> float:
    """Seconds spent loading a source that loads on first use (LazyModelDraft), 0 otherwise."""
    if not isinstance(source, LazyModelDraft) or source.loaded is not None:
        return 0.0
    start_s = time.perf_counter()
    source.load()
    return time.perf_counter() - start_s


def _propose(
    plan: StepPlan,
    sources: Mapping[SourceName, DraftSource],
    candidate: NgramCandidate | None,
    context: list[int],
    sampling: SamplingParams,
    keys: SampleKeys,
    policy: KPolicy,
    max_leaves: int,
    plan_cap: int,
) -> tuple[Draft, tuple[float, ...]]:
    """The plan's draft -- nothing, the n-gram candidate's head (or a token tree of it and its
    branches), or a learned draft that the policy may stop early (or verify with some of its
    runner-up candidates as a token tree) -- and its branch tokens' weights. plan_cap: the most
    tokens the step's batch may draft."""
    if plan.k == 0 or plan.source == "none":
        return NO_DRAFT, ()
    if plan.source == "ngram" and candidate is not None:
        if plan.branches and max_leaves > 1:
            tree = token_tree(candidate, plan.k, plan.branches, max_leaves)
            if tree.branch_weights:
                return Draft(tree.tokens, parents=tree.parents), tree.branch_weights
        return Draft(candidate.tokens[: plan.k]), ()
    draft = sources[plan.source].propose(context, plan.k, sampling, keys, policy.keep_drafting)
    if draft.alternates and policy.tree_nodes > 0 and max_leaves > 1:
        # A learned draft's runner-ups, where the policy finds they pay: one-token branches.
        budget = plan_cap - len(draft.tokens)
        chosen = policy.alternates(draft.confidences, draft.alternates, budget, max_leaves)
        tree = alternate_tree(draft.tokens, draft.alternates, chosen)
        if tree.branch_weights:
            return Draft(tree.tokens, draft.confidences, tree.parents), tree.branch_weights
    return Draft(draft.tokens, draft.confidences), ()


def _in_vocab(
    draft: Draft, branch_weights: tuple[float, ...], n_vocab: int
) -> tuple[Draft, tuple[float, ...]]:
    """A draft holds only ids the target has: a chain is cut at its first id outside the
    vocabulary (a draft's vocabulary may be larger), a tree with one becomes its main chain."""
    if all(0 <= t < n_vocab for t in draft.tokens):
        return draft, branch_weights
    n_main = len(draft.tokens) - len(branch_weights)
    main = draft.tokens[:n_main]
    n = next((i for i, t in enumerate(main) if not 0 <= t < n_vocab), len(main))
    return Draft(main[:n], draft.confidences[:n]), ()


def _allowed(
    constraint: StepConstraint,
    forced: list[int],
    draft: Draft,
    branch_weights: tuple[float, ...],
) -> tuple[Draft, tuple[float, ...]]:
    """The forced tokens, then the draft, as far as the grammar allows: a chain is cut at its
    first refused token; a tree whose every node the grammar allows stays a tree, else it is
    verified as its main chain, cut the same way."""
    if draft.parents and not forced:
        if all(_path_allowed(constraint, draft, i) for i in range(len(draft.tokens))):
            return draft, branch_weights
        n_main = len(draft.tokens) - len(branch_weights)
        draft = Draft(draft.tokens[:n_main], draft.confidences[:n_main])
    tokens = [*forced, *draft.tokens]
    n = constraint.valid_prefix(tokens)
    if n == len(tokens) and not forced:
        return draft, ()
    kept = max(n - len(forced), 0)
    return Draft(tuple(tokens[:n]), draft.confidences[:kept]), ()


def _path_allowed(constraint: StepConstraint, draft: Draft, node: int) -> bool:
    """Whether the grammar allows the tree's path from its root to `node`."""
    path: list[int] = []
    while node >= 0:
        path.append(draft.tokens[node])
        node = draft.parents[node]
    return constraint.valid_prefix(path[::-1]) == len(path)


def _depth(draft: Draft) -> int:
    """A draft's deepest position + 1 (its length for a chain)."""
    if not draft.parents:
        return len(draft.tokens)
    depth: list[int] = []
    for parent in draft.parents:
        depth.append(depth[parent] + 1 if parent >= 0 else 1)
    return max(depth)


def _target_pass(
    target: LlamaModel,
    draft: Draft,
    context: list[int],
    sampling: SamplingParams,
    keys: SampleKeys,
    want_hidden: bool = False,
    constraint: StepConstraint | None = None,
    logprobs: int | None = None,
) -> tuple[Verdict, np.ndarray | None, tuple[RowLogprobs, ...]]:
    """One target pass over [last token, draft...] (a chain, or a token tree with one sequence
    per branch), verified (each row penalized first where the request has penalties); the
    cache keeps what was accepted. With want_hidden, also the hidden
    state of the row that chose the target's own token (the last accepted one's row); with
    logprobs, the produced tokens' logprobs."""
    batch = [context[-1], *draft.tokens]
    if draft.parents:
        logits = target.decode_tree(batch, (-1, *(p + 1 for p in draft.parents)))
        rows = penalize_rows(logits, context, draft.tokens, draft.parents, sampling)
        args = (draft.tokens, draft.parents, rows, sampling, keys, len(context))
        verdict = (
            verify_constrained(*args, constraint) if constraint is not None else verify_tree(*args)
        )
        hidden = target.hidden(verdict.path[-1] + 1 if verdict.path else 0) if want_hidden else None
        scored = _logprobs(logits, verdict, logprobs)
        target.keep_tree([i + 1 for i in verdict.path])
        return verdict, hidden, scored
    logits = target.decode(batch, range(len(batch)))  # (k + 1, n_vocab), a view
    rows = penalize_rows(logits, context, draft.tokens, (), sampling)  # logits where none
    if constraint is not None:
        verdict = verify_constrained(
            draft.tokens, (), rows, sampling, keys, len(context), constraint
        )
    else:
        verdict = _verify(draft, rows, sampling, keys, len(context))
    hidden = target.hidden(verdict.n_accepted) if want_hidden else None
    scored = _logprobs(logits, verdict, logprobs)
    target.truncate(len(context) + verdict.n_accepted)  # drop rejected drafts' KV
    return verdict, hidden, scored


def _logprobs(logits: np.ndarray, verdict: Verdict, top_n: int | None) -> tuple[RowLogprobs, ...]:
    """The verdict's tokens' logprobs from the rows that chose them (none unless asked for)."""
    if top_n is None:
        return ()
    rows = logits[chosen_rows(len(verdict.tokens), verdict.path)]
    return token_logprobs(rows, verdict.tokens, top_n)


def _verify(
    draft: Draft, logits: np.ndarray, sampling: SamplingParams, keys: SampleKeys, n_context: int
) -> Verdict:
    """The target's own choice at each row -- argmax, or its keyed sample for that position --
    with the draft kept while it agrees: the output never depends on what was drafted."""
    if sampling.greedy:
        return verify_greedy(draft.tokens, logits)
    return verify_keyed(draft.tokens, logits, sampling, keys, n_context)
