"""The real decode loop (engine.run_steps) and the real ModelDraft / NgramDraft, on scripted fake
models: greedy output equals the target's own greedy decoding exactly (a fake has no batching
noise), and sampled output follows the target's distribution."""

from __future__ import annotations

import numpy as np
import pytest
from fake_model import (
    N_VOCAB,
    FakeLlama,
    in_parallel,
    make_draft,
    make_head,
    make_target,
    n_chunks,
    runs_for,
    tv_bound,
    tv_bound_for,
)

from edge_spec.decode.engine import Prefill, Step, run_steps
from edge_spec.decode.logprobs import PromptScores
from edge_spec.drafts import LazyModelDraft, ModelDraft, NgramDraft, NoDraft
from edge_spec.policy.simple import FixedK
from edge_spec.sampling.transform import SamplingParams, argmax

PREFIX = [1, 2, 3]


def steps(
    source,
    target: FakeLlama,
    prompt,
    k,
    max_tokens,
    sampling,
    tree_nodes=0,
    logprobs=None,
    scored_prompt=None,
):
    """run_steps with one draft source (plus "none") under a fixed-k policy (n-gram drafts
    with up to tree_nodes branch tokens as a token tree). A head drafts in the policy's
    learned-draft slot, "model", as the API puts it."""
    sources = {("model" if source.name == "head" else source.name): source, "none": NoDraft()}
    policy = FixedK(k, tree_nodes=tree_nodes)
    k_max = k + tree_nodes
    return run_steps(
        target,
        sources,
        policy,
        prompt,
        k_max=k_max,
        max_tokens=max_tokens,
        sampling=sampling,
        logprobs=logprobs,
        scored_prompt=scored_prompt,
    )


def generate(source, target: FakeLlama, prompt, k, max_tokens, sampling) -> list[int]:
    out: list[int] = []
    for event in steps(source, target, prompt, k, max_tokens, sampling):
        if isinstance(event, Step):
            assert 1 <= len(event.tokens) <= event.n_drafted + 1
            assert event.n_accepted <= event.n_drafted <= k
            out.extend(event.tokens)
    return out


def greedy_reference(prompt: list[int], n: int) -> list[int]:
    model = make_target()
    out: list[int] = []
    for _ in range(n):
        out.append(argmax(model.logits(prompt + out)))
    return out


@pytest.mark.parametrize("k", [0, 1, 2, 4, 7])
@pytest.mark.parametrize("mode", ["model", "ngram", "none", "head"])
def test_greedy_equals_target_alone_exactly(k: int, mode: str) -> None:
    target = FakeLlama(make_target())
    draft_llama = FakeLlama(make_draft(target.model))
    source = {
        "model": ModelDraft(draft_llama),
        "ngram": NgramDraft(),
        "none": NoDraft(),
        "head": make_head(draft_llama.model),
    }[mode]
    n_accepted = 0
    for prompt in (PREFIX, [4, 0, 4, 0, 4, 0, 4], [2]):
        got: list[int] = []
        for event in steps(source, target, prompt, k, 40, SamplingParams()):
            if isinstance(event, Step):
                got.extend(event.tokens)
                n_accepted += event.n_accepted
        assert got == greedy_reference(prompt, 40)
        # Invariant between requests: the target's KV holds context[:-1].
        assert target.tokens == (prompt + got)[:-1]
    if mode in ("model", "head"):  # drafts were really verified (and some kept)
        assert (n_accepted > 0) == (k > 0)


def test_model_draft_reuses_its_cache() -> None:
    target = FakeLlama(make_target())
    draft_llama = FakeLlama(make_draft(target.model))
    out = generate(ModelDraft(draft_llama), target, PREFIX, 4, 60, SamplingParams())
    # Re-decoding only what changed: about one draft decode per drafted token plus the
    # corrections, far below re-decoding the whole context each step.
    assert draft_llama.n_decoded < 3 * len(out)


class ModelLater(FixedK):
    """Plain steps first, then the model: a policy that did not expect to draft with it."""

    def __init__(self, k: int, plain_steps: int) -> None:
        super().__init__(k, "model")
        self.plain_steps = plain_steps
        self.lags: list[int] = []

    def wants_model(self, model_lag: int = 1, model_load_s: float = 0.0) -> bool:
        return False

    def begin(self, model_lag: int = 1, model_load_s: float = 0.0) -> None:
        self.lags.append(model_lag)
        self.n_steps = 0

    def plan(self, sources, k_cap, ngram):
        self.n_steps += 1
        if self.n_steps <= self.plain_steps:
            return FixedK(0).plan(sources, k_cap, ngram)
        return super().plan(sources, k_cap, ngram)


def test_a_draft_model_the_policy_does_not_expect_is_not_prefilled() -> None:
    """The time to first token stays the target's own; a later model draft catches up and the
    output is still the target's."""
    target = FakeLlama(make_target())
    draft_llama = FakeLlama(make_draft(target.model))
    sources = {"model": ModelDraft(draft_llama), "none": NoDraft()}
    prompt = [4, 0, 4, 0, 1, 2, 3]
    policy = ModelLater(k=3, plain_steps=5)
    events = run_steps(
        target, sources, policy, prompt, k_max=3, max_tokens=30, sampling=SamplingParams()
    )
    assert isinstance(next(events), Prefill)
    assert draft_llama.n_decoded == 0 and policy.lags == [len(prompt)]
    out = [t for event in events for t in event.tokens]
    assert out == greedy_reference(prompt, 30)
    assert draft_llama.n_decoded > 0  # it drafted after all
    # The next request starts where the draft's cache left off.
    list(
        run_steps(
            target,
            sources,
            policy,
            prompt + out + [1],
            k_max=3,
            max_tokens=3,
            sampling=SamplingParams(),
        )
    )
    assert policy.lags[-1] < 5


def test_a_short_request_does_not_load_a_lazy_draft_model_for_a_bet_it_cannot_cover() -> None:
    """Under the cost policy a draft model that loads on first use, and that the policy did
    not want at the request's start (its last requests gained nothing from it), is loaded
    mid-request only when the request's ledger covers its expected load: a 12-token answer
    leaves it unloaded (and is the target's), where a load expected to cost nothing is
    made."""
    from edge_spec.policy.cost import CostModelK
    from edge_spec.policy.types import CostCurve

    target = FakeLlama(make_target())
    costs = CostCurve((0.01,) * 10, draft_token_s=0.001)  # flat: the model would pay
    prompt = [4, 0, 4, 0, 1, 2, 3]
    for expected_load_s, loads_it in ((0.0, True), (0.5, False)):
        lazy = LazyModelDraft(lambda: ModelDraft(FakeLlama(make_target())), "shared")
        lazy.expected_load_s = expected_load_s
        policy = CostModelK(costs, k_max=3, prior_alpha={"model": 0.95})
        for _ in range(4):  # requests in which the model's steps saved nothing
            policy.begin()
        events = run_steps(
            target,
            {"model": lazy, "none": NoDraft()},
            policy,
            prompt,
            k_max=3,
            max_tokens=12,
            sampling=SamplingParams(),
        )
        tokens = [t for event in events for t in getattr(event, "tokens", ())]
        assert tokens == greedy_reference(prompt, 12)
        assert (lazy.loaded is not None) == loads_it


def test_a_lazy_draft_model_loads_on_the_first_draft_and_a_failed_load_steps_aside() -> None:
    """Nothing loads while the policy takes plain steps; the first model draft loads it once
    and the output is the target's. A draft that cannot load is set aside: the target answers
    alone, the load is not retried, and the next request is answered too."""
    target = FakeLlama(make_target())
    draft_llama = FakeLlama(make_draft(target.model))
    loads: list[int] = []

    def load() -> ModelDraft:
        loads.append(1)
        return ModelDraft(draft_llama)

    lazy = LazyModelDraft(load, "shared")
    prompt = [4, 0, 4, 0, 1, 2, 3]
    policy = ModelLater(k=3, plain_steps=5)
    events = run_steps(
        target,
        {"model": lazy, "none": NoDraft()},
        policy,
        prompt,
        k_max=3,
        max_tokens=30,
        sampling=SamplingParams(),
    )
    head = [t for _, event in zip(range(6), events) for t in getattr(event, "tokens", ())]
    assert loads == [] and lazy.loaded is None and lazy.decode_s == 0.0  # five plain steps
    assert head + [t for event in events for t in event.tokens] == greedy_reference(prompt, 30)
    assert loads == [1] and lazy.loaded is not None and draft_llama.n_decoded > 0

    def broken() -> ModelDraft:
        loads.append(1)
        raise MemoryError("no room for the draft")

    lazy = LazyModelDraft(broken, "shared")
    for _ in range(2):
        events = list(
            run_steps(
                target,
                {"model": lazy, "none": NoDraft()},
                FixedK(3, "model"),
                prompt,
                k_max=3,
                max_tokens=12,
                sampling=SamplingParams(),
            )
        )
        assert [t for e in events[1:] for t in e.tokens] == greedy_reference(prompt, 12)
        aside = [name for e in events for name, _ in e.set_aside]
        assert aside == ["model"]
    assert len(loads) == 2  # one failed load, not retried by the second request


def test_max_tokens_and_context_limits_are_respected() -> None:
    target = FakeLlama(make_target(), n_ctx=20)
    draft_llama = FakeLlama(make_draft(target.model), n_ctx=20)
    out = generate(ModelDraft(draft_llama), target, PREFIX, 5, 1000, SamplingParams())
    assert len(PREFIX) + len(out) == 20 + 1  # FakeLlama asserts no decode overran n_ctx
    for n in range(0, 9):
        target.tokens.clear()
        assert len(generate(NgramDraft(), target, PREFIX, 3, n, SamplingParams())) == n


def test_prefill_reports_reused_prompt_cache() -> None:
    target = FakeLlama(make_target())
    list(steps(NoDraft(), target, PREFIX + [0, 1], 0, 1, SamplingParams()))
    events = list(steps(NoDraft(), target, PREFIX + [0, 2], 0, 1, SamplingParams()))
    assert isinstance(events[0], Prefill) and events[0].n_cached == 4


# The engine-level distribution tests check the plumbing around verification (keys,
# positions, trees, heads, sources) at 12,000 runs: a TV bound near 0.045 on 25 cells
# (0.035 at 20,000 runs, before the suite had to fit in 10 minutes); test_verify.py holds
# verification itself to its exact joint's bound, 0.022-0.025 at 30,000 runs.
N_RUNS = 12_000


@pytest.mark.parametrize(
    ("mode", "params"),
    [
        ("model", SamplingParams(temperature=1.0, seed=11)),
        ("model", SamplingParams(temperature=0.7, top_k=4, top_p=0.9, seed=12)),
        ("ngram", SamplingParams(temperature=0.8, seed=13)),
        ("tree", SamplingParams(temperature=0.8, seed=14)),
        ("head", SamplingParams(temperature=0.7, top_k=3, seed=16)),
        ("head-tree", SamplingParams(temperature=0.8, seed=17)),
    ],
)
def test_sampled_output_follows_the_target_through_the_engine(mode: str, params) -> None:
    """The first two tokens of N_RUNS generations through run_steps, against the exact target
    joint distribution; the bound is derived in fake_model.tv_bound. "tree": n-gram drafts
    verified as token trees; "head": a draft head over a reduced vocabulary (p_draft zero for
    one token) on the target's hidden states."""
    target_model = make_target()
    prompt = _PROMPTS.get(mode, _PROMPTS["*"])
    p_first = target_model.probs(prompt, params)
    exact = np.concatenate(
        [p_first[x] * target_model.probs(prompt + [x], params) for x in range(N_VOCAB)]
    )
    # As strict as the worst-case bound at N_RUNS, in as few runs as the exact distribution
    # allows (fake_model.runs_for).
    bound = tv_bound(N_RUNS, N_VOCAB**2)
    n_runs = runs_for(exact, bound, N_RUNS)
    rng_seeds = np.random.default_rng(params.seed).integers(0, 2**62, size=n_runs)
    parts = in_parallel(
        _first_two_tokens, [(mode, params, s) for s in np.array_split(rng_seeds, n_chunks())]
    )
    cells = np.concatenate([c for c, _, _ in parts])
    n_drafted = sum(d for _, d, _ in parts)
    n_trees = sum(n for _, _, n in parts)
    empirical = np.bincount(cells, minlength=N_VOCAB**2) / n_runs
    tv = 0.5 * float(np.abs(empirical - exact).sum())
    assert n_drafted > n_runs // 2  # speculation really happened
    assert (n_trees > n_runs // 4) == (mode in ("tree", "head-tree"))
    assert tv < tv_bound_for(n_runs, exact) <= bound, tv


_PROMPTS = {
    "*": [1, 2, 1, 2, 1],  # repetitive, so the n-gram source does propose
    "tree": [1, 2, 3, 0, 1, 2, 4, 0, 1, 2],  # (1, 2) went on two ways: a tree
}


def _first_two_tokens(mode: str, params: SamplingParams, seeds: np.ndarray):
    """(the first two tokens of a generation per seed as one cell id, tokens drafted, steps
    that verified a tree), for the distribution test (module level: it runs in a worker)."""
    target_model = make_target()
    target = FakeLlama(target_model)
    draft_llama = FakeLlama(make_draft(target_model))
    source = ModelDraft(draft_llama) if mode == "model" else NgramDraft(max_ngram=2)
    if mode.startswith("head"):  # drafts from the second step on (no hidden state before)
        source = make_head(draft_llama.model)
    prompt = _PROMPTS.get(mode, _PROMPTS["*"])
    # "head-tree": the head's runner-ups verified beside its chain as one-token branches.
    tree_nodes = {"tree": 3, "head-tree": 2}.get(mode, 0)
    cells = np.empty(len(seeds), dtype=np.int64)
    n_drafted = n_trees = 0
    for run, seed in enumerate(seeds):
        out: list[int] = []
        sampling = SamplingParams(
            params.temperature, params.top_k, params.top_p, params.min_p, seed=int(seed)
        )
        for event in steps(source, target, prompt, 2, 3 + tree_nodes, sampling, tree_nodes):
            if isinstance(event, Step):
                out.extend(event.tokens)
                n_drafted += event.n_drafted
                n_trees += event.n_branch_nodes > 0
        cells[run] = out[0] * N_VOCAB + out[1]
    return cells, n_drafted, n_trees


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, seed=3)])
def test_token_trees_give_exactly_the_targets_own_output(params: SamplingParams) -> None:
    """Greedy, and sampled with a seed: the same tokens with token trees, with chains and with
    no draft at all; and trees were really verified, some accepted along a branch."""
    target = FakeLlama(make_target())
    prompts = ([1, 2, 3, 1, 2, 4, 0, 1, 2, 3, 1, 2], [4, 0, 4, 1, 4, 0, 4, 2, 4, 0], [2, 2])
    n_trees = n_branch_wins = 0
    for prompt in prompts:
        alone = generate(NoDraft(), target, prompt, 0, 60, params)
        assert generate(NgramDraft(max_ngram=2), target, prompt, 3, 60, params) == alone
        source = NgramDraft(max_ngram=2)
        got: list[int] = []
        for event in steps(source, target, prompt, 3, 60, params, tree_nodes=4):
            if isinstance(event, Step):
                got.extend(event.tokens)
                n_trees += event.n_branch_nodes > 0
                n_branch_wins += event.n_branch_accepted > 0
        assert got == alone
        assert target.tokens == (prompt + got)[:-1]
    assert n_trees > 10 and n_branch_wins > 0


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, seed=4)])
def test_head_trees_of_runner_ups_give_exactly_the_targets_own_output(params) -> None:
    """A draft head's chain with its runner-up candidates as one-token branches: the same
    tokens as the target alone; branches were verified and some accepted, and the head kept
    reading the hidden state of the row that chose the newest token (_CheckedHead)."""
    target = FakeLlama(make_target())
    n_trees = n_branch_wins = 0
    for prompt in (PREFIX, [4, 0, 4, 0, 4, 0, 4], [2]):
        alone = generate(NoDraft(), target, prompt, 0, 40, params)
        head = make_head(FakeLlama(make_draft(target.model)).model)
        got: list[int] = []
        for event in steps(head, target, prompt, 3, 40, params, tree_nodes=3):
            if isinstance(event, Step):
                got.extend(event.tokens)
                n_trees += event.n_branch_nodes > 0
                n_branch_wins += event.n_branch_accepted > 0
                assert event.n_branch_accepted <= 1  # one-token branches
        assert got == alone
        assert target.tokens == (prompt + got)[:-1]
    assert n_trees > 10 and n_branch_wins > 0


def test_ngram_index_answers_like_the_plain_scan() -> None:
    from edge_spec.drafts.ngram import NgramIndex, lookup

    rng = np.random.default_rng(5)
    n_branches = 0
    for _ in range(30):
        index = NgramIndex(max_ngram=3)
        context = rng.integers(0, 6, size=3).tolist()
        for _ in range(60):
            k = int(rng.integers(0, 6))
            assert index.lookup(context, k, 1) == lookup(context, k, 3, 1), context
            assert index.lookup(context, k, 2) == lookup(context, k, 3, 2)
            with_branches = index.lookup(context, k, 1, branches=True)
            assert with_branches == lookup(context, k, 3, 1, branches=True), context
            n_branches += bool(with_branches.branches)
            context += rng.integers(0, 6, size=int(rng.integers(1, 4))).tolist()
        # A context that is not an extension (a new request) is re-indexed, not mixed up.
        other = rng.integers(0, 6, size=20).tolist()
        assert index.lookup(other, 4, 1) == lookup(other, 4, 3, 1)
    assert n_branches > 100  # the random contexts did fork


def test_ngram_index_answers_like_the_plain_scan_on_long_copies() -> None:
    """Text that copies long stretches of itself (matches past MAX_MATCH, the 8- and 16-grams
    indexed beside 1..max_ngram) with a few edits: the index's shortcuts for long matches
    and its bisection over n-gram sizes give the plain scan's answers."""
    from edge_spec.drafts.ngram import MAX_MATCH, NgramIndex, lookup

    rng = np.random.default_rng(11)
    longest = 0
    for _ in range(8):
        index = NgramIndex(max_ngram=3)
        block = rng.integers(0, 50, size=int(rng.integers(20, 60))).tolist()
        context = block[:5]
        while len(context) < 4 * len(block):
            step = block[len(context) % len(block) :][: int(rng.integers(1, 5))] or block[:1]
            if rng.random() < 0.05:  # an edit the copy does not share
                step = [int(rng.integers(0, 50))]
            context += step
            k = int(rng.integers(1, 9))
            for min_ngram in (1, 2, 3):
                got = index.lookup(context, k, min_ngram, branches=min_ngram == 1)
                assert got == lookup(context, k, 3, min_ngram, branches=min_ngram == 1)
                longest = max(longest, got.match_len)
    assert longest == MAX_MATCH  # the long-copy path ran


def test_ngram_session_index_answers_like_the_plain_scan_over_earlier_requests() -> None:
    from edge_spec.drafts.ngram import NgramIndex, lookup

    rng = np.random.default_rng(9)
    index = NgramIndex(max_ngram=3, session_tokens=150)
    history: list[list[int]] = []
    for _ in range(12):  # requests; the oldest fall out of the 150-token session
        index.new_document()
        context = rng.integers(0, 8, size=4).tolist()
        for _ in range(25):
            k = int(rng.integers(1, 6))
            assert index.lookup(context, k, 1) == lookup(context, k, 3, 1, history)
            forked = index.lookup(context, k, 1, branches=True)
            assert forked == lookup(context, k, 3, 1, history, branches=True)
            context += rng.integers(0, 8, size=int(rng.integers(1, 4))).tolist()
        index.lookup(context, 1, 1)
        history.append(context[:-1])
        while sum(map(len, history)) + 0 > 150 and len(history) > 1:
            history.pop(0)


@pytest.mark.parametrize("vocab", [50, 49152])
def test_ngram_index_bytes_estimate_is_at_least_what_it_allocates(vocab: int) -> None:
    import tracemalloc

    from edge_spec.drafts.ngram import NgramIndex

    rng = np.random.default_rng(vocab)
    docs = [(rng.integers(0, vocab, 2000) + 300).tolist() for _ in range(6)]
    tracemalloc.start()
    try:
        index = NgramIndex(3, session_tokens=10**9)
        for doc in docs:
            index.new_document()
            index.lookup(list(doc), 4, 1)
        allocated, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert index.n_tokens == 6 * 1999
    assert allocated <= index.bytes_estimate() <= 2 * allocated


def test_ngram_sessions_stay_within_their_byte_bound_oldest_first() -> None:
    from edge_spec.drafts.ngram import NgramDraft

    rng = np.random.default_rng(3)
    bound = 12_000_000
    draft = NgramDraft(session_tokens=10**6, max_sessions=64, session_bytes=bound)
    for i in range(12):  # conversations of 3 requests of 1,000 tokens
        for _ in range(3):
            draft.select(f"c{i}")
            draft.begin([])
            draft.candidate(rng.integers(0, 5000, 1000).tolist(), 4)
            assert draft.bytes_estimate() <= bound + 1_000 * 2_000  # + the live request
    kept = list(draft._sessions)
    assert kept == [f"c{i}" for i in range(12 - len(kept), 12)]  # the least recent went
    assert 1 < len(kept) < 12
    # One conversation alone over the bound keeps its newest requests.
    draft.select("c11")
    for _ in range(20):
        draft.begin([])
        draft.candidate(rng.integers(0, 5000, 1000).tolist(), 4)
        draft.select("c11")
    assert list(draft._sessions) == ["c11"] and draft.bytes_estimate() <= bound


def test_ngram_draft_reuses_an_earlier_request_and_prefers_the_longest_match() -> None:
    from edge_spec.drafts.ngram import NgramDraft

    earlier = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    for session_tokens, expected in ((0, ()), (1000, (6, 7, 8))):
        draft = NgramDraft(max_ngram=2, session_tokens=session_tokens)
        draft.begin(earlier)
        draft.candidate(earlier, 3)
        draft.begin([3, 4, 5])  # a new request repeating the first one's text
        assert draft.candidate([3, 4, 5], 3).tokens == expected
    # Two occurrences of the 2-gram (4, 5): the one agreeing further back wins, not the latest.
    draft = NgramDraft(max_ngram=2)
    draft.begin([])
    candidate = draft.candidate([1, 2, 3, 4, 5, 6, 9, 9, 4, 5, 7, 0, 2, 3, 4, 5], 2)
    assert candidate.tokens == (6, 9) and candidate.match_len == 4


def test_ngram_candidate_reports_how_the_occurrences_continued() -> None:
    from edge_spec.drafts.ngram import NgramDraft

    draft = NgramDraft(max_ngram=3)
    draft.begin([])
    # (1, 2) occurred three times, followed by 9, 9 and 7; none agrees further back, so the
    # latest is copied (7) and two of the three occurrences disagree with it.
    split = draft.candidate([1, 2, 9, 1, 2, 9, 1, 2, 7, 5, 1, 2], 2)
    assert (split.tokens, split.match_len) == ((7, 5), 2)
    assert (split.n_occurrences, split.n_agreeing, split.consensus) == (3, 1, "split")
    draft.begin([])
    unanimous = draft.candidate([1, 2, 9, 4, 1, 2, 9, 5, 1, 2], 1)
    assert (unanimous.tokens, unanimous.n_occurrences, unanimous.consensus) == ((9,), 2, "all")
    draft.begin([])
    single = draft.candidate([3, 1, 2, 9, 4, 1, 2], 1)
    assert (single.tokens, single.match_len, single.consensus) == ((9,), 2, "one")
    none = draft.candidate([5, 6], 3)
    assert (none.tokens, none.match_len, none.n_occurrences) == ((), 0, 0)


def test_ngram_candidate_branches_are_the_other_ways_the_occurrences_went() -> None:
    from edge_spec.drafts.candidates import Branch
    from edge_spec.drafts.ngram import NgramDraft

    draft = NgramDraft(max_ngram=2)
    draft.begin([])
    # (1, 2) occurred four times, going on 9 8 7 / 9 8 6 / 5 5 5 / 9 8 7 ... and the proposal
    # copies the one agreeing furthest back (after 0 1 2: 9 8 7).
    context = [0, 1, 2, 9, 8, 7, 3, 1, 2, 9, 8, 6, 4, 1, 2, 5, 5, 5, 4, 1, 2, 9, 8, 6, 0, 1, 2]
    candidate = draft.candidate(context, 3, branches=True)
    assert candidate.tokens == (9, 8, 7) and candidate.match_len == 3
    assert candidate.n_occurrences == 4
    # Two of four went 9 8 6 (a fork at depth 2), one went 5 5 5 (a fork at depth 0).
    assert candidate.branches == (
        Branch(depth=2, tokens=(6,), weights=(0.5,)),
        Branch(depth=0, tokens=(5, 5, 5), weights=(0.25, 0.25, 0.25)),
    )
    assert draft.candidate(context, 3).branches == ()  # only when asked for


def test_ngram_proposal_goes_around_a_loop_that_reaches_the_end_of_the_context() -> None:
    from edge_spec.drafts.ngram import NgramDraft, lookup

    loop = [5, 1, 2, 3, 1, 2, 3, 1, 2]  # period 3: the latest (3, 1, 2) is followed by 3, 1, 2
    draft = NgramDraft(max_ngram=3)
    draft.begin([])
    candidate = draft.candidate(loop, 7)
    assert candidate.tokens == (3, 1, 2, 3, 1, 2, 3)
    assert lookup(loop, 7, 3, 1) == candidate
    # An earlier request's document really ended: nothing is invented past its end.
    session = NgramDraft(max_ngram=3, session_tokens=100)
    session.begin([])
    session.candidate([7, 8, 9, 4], 1)
    session.begin([])
    assert session.candidate([0, 7, 8], 5).tokens == (9,)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_same_seed_same_text_whatever_was_drafted(temperature: float) -> None:
    """Sampled tokens are keyed by (seed, position): the target alone, the n-gram source with
    and without a session (and after unrelated earlier requests), and the model draft at any k
    all produce the same text for one seed. A fake has no batching noise, so exactly."""
    target_model = make_target()
    prompt = [1, 2, 1, 2, 1, 3]
    sampling = SamplingParams(temperature=temperature, top_p=0.95, seed=2024)

    def run(source, k: int, *, warm_up: tuple[list[int], ...] = ()) -> list[int]:
        target = FakeLlama(target_model)
        for earlier in warm_up:  # unrelated requests first, through the same source
            generate(source, target, earlier, k, 20, SamplingParams(temperature=1.0))
        return generate(source, target, prompt, k, 40, sampling)

    reference = run(NoDraft(), 0)
    session = NgramDraft(max_ngram=2, session_tokens=1000)
    got = {
        "ngram": run(NgramDraft(max_ngram=2), 3),
        "ngram-session": run(session, 3, warm_up=([4, 0, 4, 0, 2], [3, 3, 1, 0])),
        "ngram-session-again": run(session, 5, warm_up=(prompt,)),
    }
    for k in (1, 2, 5):
        got[f"model-k{k}"] = run(ModelDraft(FakeLlama(make_draft(target_model))), k)
    for name, tokens in got.items():
        assert tokens == reference, name
    other = generate(
        NoDraft(),
        FakeLlama(target_model),
        prompt,
        0,
        40,
        SamplingParams(temperature=temperature, top_p=0.95, seed=2025),
    )
    assert temperature == 0.0 or other != reference  # the seed does matter


def test_ngram_sessions_are_kept_apart_by_name() -> None:
    """A named session drafts from its own earlier requests only; None drafts from the request
    alone; the least recently used session goes first beyond max_sessions."""
    earlier = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    draft = NgramDraft(max_ngram=2, session_tokens=1000, max_sessions=2)

    def request(session: str | None, prompt: list[int]) -> tuple[int, ...]:
        draft.select(session)
        draft.begin(prompt)
        return draft.candidate(prompt, 3).tokens

    request("a", earlier)
    assert request("a", [3, 4, 5]) == (6, 7, 8)  # a's own earlier request
    assert request("b", [3, 4, 5]) == ()  # b never saw it
    assert request(None, [3, 4, 5]) == ()  # no session: this request alone
    assert request("a", [3, 4, 5]) == (6, 7, 8)  # "a" is now the most recently used
    request("c", [0])  # a third session: "b", the least recently used, is dropped
    assert request("a", [3, 4, 5]) == (6, 7, 8)
    assert request("b", [3, 4, 5]) == ()
    draft.clear_session("a")
    assert request("a", [3, 4, 5]) == ()


def _logprobs_of(source, target, prompt, k, params, tree_nodes=0):
    """(tokens, their logprobs), n_accepted of one run with logprobs (top 3) asked for."""
    tokens, scored, n_accepted = [], [], 0
    for event in steps(source, target, prompt, k, 40, params, tree_nodes, logprobs=3):
        if isinstance(event, Step):
            assert [r.token for r in event.logprobs] == list(event.tokens)
            tokens.extend(event.tokens)
            scored.extend(event.logprobs)
            n_accepted += event.n_accepted
    return (tokens, scored), n_accepted


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, seed=5)])
def test_logprobs_are_the_targets_own_whatever_was_drafted(params: SamplingParams) -> None:
    """Each token's logprob (and its row's top 3) is the log-softmax of the target's own logits
    at its position: the same with model drafts, n-gram chains and token trees as with no
    draft (a fake has no batching noise), and what the reference computes from the logits."""
    model = make_target()
    prompt = [1, 2, 3, 1, 2, 4, 0, 1, 2, 3, 1, 2]
    alone, _ = _logprobs_of(NoDraft(), FakeLlama(model), prompt, 0, params)
    for source, tree_nodes in (
        (ModelDraft(FakeLlama(make_draft(model))), 0),
        (NgramDraft(max_ngram=2), 0),
        (NgramDraft(max_ngram=2), 4),
    ):
        got, n_accepted = _logprobs_of(source, FakeLlama(model), prompt, 3, params, tree_nodes)
        assert got == alone and n_accepted > 0
    tokens, scored = alone
    for i, (token, row) in enumerate(zip(tokens, scored)):
        logits = model.logits(prompt + tokens[:i]).astype(np.float64)
        log_p = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        assert row.logprob == pytest.approx(log_p[token], abs=1e-5)  # float32
        best = sorted(range(len(log_p)), key=lambda t: (-log_p[t], t))[:3]
        assert [t for t, _ in row.top] == best
        if params.greedy:
            assert row.top[0][0] == token


@pytest.mark.parametrize("piece_bytes", [1 << 30, 3 * 4 * 5])  # one piece; pieces of 3 rows
def test_prompt_logprobs_are_the_targets_own_and_change_nothing_after(
    piece_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring the prompt gives each token after the first its logprob under the target (and
    its row's top 2), read from the prompt's own rows in however many pieces; the cache is
    left as the loop wants it, so the answer is the one without scoring."""
    import edge_spec.decode.logprobs as logprobs_module

    monkeypatch.setattr(logprobs_module, "SCORE_PIECE_BYTES", piece_bytes)
    model = make_target()
    prompt = [1, 2, 3, 1, 2, 4, 0, 1, 2, 3, 1, 2]
    target = FakeLlama(model)
    target.sync(prompt[:5])  # a cached prefix from an earlier request: its rows are gone
    events = list(
        steps(NgramDraft(max_ngram=2), target, prompt, 3, 12, SamplingParams(), 0, None, 2)
    )
    prefill = events[0]
    assert isinstance(prefill, Prefill) and prefill.n_cached == 0
    assert [r.token for r in prefill.logprobs] == prompt[1:]
    for i, row in enumerate(prefill.logprobs):
        logits = model.logits(prompt[: i + 1]).astype(np.float64)
        log_p = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        assert row.logprob == pytest.approx(log_p[prompt[i + 1]], abs=1e-5)
        assert [t for t, _ in row.top] == sorted(range(len(log_p)), key=lambda t: (-log_p[t], t))[
            :2
        ]
    answer = [t for e in events if isinstance(e, Step) for t in e.tokens]
    assert answer == generate(NoDraft(), FakeLlama(model), prompt, 0, 12, SamplingParams())


def test_a_prompt_sharing_the_last_scored_ones_start_decodes_only_what_follows() -> None:
    """lm-evaluation-harness scores one question's context with each of its choices: the rows
    of the shared context are kept from the last scored prompt (where the cache still holds
    it), so only the new tail is decoded; every row is still the target's own, and another
    number of alternatives, or a cache that lost the context, scores from the start."""
    model = make_target()
    context = [1, 2, 3, 1, 2, 4, 0, 1, 2, 3]
    known = PromptScores()

    def score(prompt: list[int], target: FakeLlama, top_n: int = 2) -> Prefill:
        events = run_steps(
            target,
            {"none": NoDraft()},
            FixedK(0),
            prompt,
            k_max=0,
            max_tokens=1,
            sampling=SamplingParams(),
            scored_prompt=top_n,
            known_scores=known,
        )
        prefill = next(events)
        events.close()
        assert isinstance(prefill, Prefill)
        for i, row in enumerate(prefill.logprobs):
            logits = model.logits(prompt[: i + 1]).astype(np.float64)
            log_p = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
            assert row.token == prompt[i + 1]
            assert row.logprob == pytest.approx(log_p[prompt[i + 1]], abs=1e-5)
            assert len(row.top) == top_n
        return prefill

    target = FakeLlama(model)
    first = score([*context, 2, 4], target)
    assert first.n_cached == 0 and target.n_decoded == len(context) + 1
    before = target.n_decoded
    second = score([*context, 3, 0, 1], target)
    # The rows of the context but its last token (which now scores another choice) were
    # known and their cache kept; decoded: that token and the new choice's but its last.
    assert second.n_cached == len(context) - 1
    assert target.n_decoded - before == 3
    assert second.logprobs[: len(context) - 1] == first.logprobs[: len(context) - 1]
    assert score([*context, 4, 4], target, top_n=3).n_cached == 0  # other alternatives
    assert score([*context, 4, 1], FakeLlama(model), top_n=3).n_cached == 0  # a cold cache


PENALTIES = dict(repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2, repeat_last_n=8)


def _penalized_reference(model, prompt: list[int], n: int, params: SamplingParams) -> list[int]:
    """The penalized target alone, one token at a time (greedy)."""
    from edge_spec.sampling.penalties import penalize

    out: list[int] = []
    for _ in range(n):
        context = prompt + out
        out.append(argmax(penalize(model.logits(context), context, params)))
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(**PENALTIES),
        SamplingParams(temperature=0.9, seed=6, **PENALTIES),
        SamplingParams(logit_bias=((2, -100.0), (0, 2.5))),
    ],
)
def test_penalized_output_is_the_penalized_targets_own_whatever_was_drafted(params) -> None:
    """With repetition penalties (or a logit bias) every row of a verification batch is
    penalized with the tokens before it on its path: model drafts, n-gram chains and token
    trees give exactly the penalized target alone's tokens (greedy: the one-token-at-a-time
    reference), and the penalties really change the text."""
    model = make_target()
    prompt = [1, 2, 3, 1, 2, 4, 0, 1, 2, 3, 1, 2]
    alone = generate(NoDraft(), FakeLlama(model), prompt, 0, 40, params)
    if params.greedy:
        assert alone == _penalized_reference(model, prompt, 40, params)
        assert alone != greedy_reference(prompt, 40)
    for source, tree_nodes in (
        (ModelDraft(FakeLlama(make_draft(model))), 0),
        (NgramDraft(max_ngram=2), 0),
        (NgramDraft(max_ngram=2), 4),
    ):
        got: list[int] = []
        n_accepted = 0
        for event in steps(source, FakeLlama(model), prompt, 3, 40, params, tree_nodes):
            if isinstance(event, Step):
                got.extend(event.tokens)
                n_accepted += event.n_accepted
        assert got == alone and n_accepted > 0


def test_penalties_follow_llama_cpp() -> None:
    """Divided by repeat_penalty (multiplied when negative), then lowered by frequency per
    occurrence and presence once, over the last repeat_last_n tokens only."""
    from edge_spec.sampling.penalties import penalize

    row = np.array([2.0, -1.0, 0.5, 3.0], dtype=np.float32)
    params = SamplingParams(
        repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, repeat_last_n=3
    )
    got = penalize(row, [2, 0, 1, 0], params)  # token 2 falls out of the window
    assert got.tolist() == pytest.approx([2.0 / 2 - 1.0 - 0.25, -1.0 * 2 - 0.5 - 0.25, 0.5, 3.0])
    assert row.tolist() == [2.0, -1.0, 0.5, 3.0]  # the caller's row is untouched
    assert penalize(row, [0, 1], SamplingParams()) is row
    biased = penalize(row, [0, 1], SamplingParams(logit_bias=((3, -100.0),)))
    assert biased.tolist() == pytest.approx([2.0, -1.0, 0.5, -97.0])
    no_window = SamplingParams(repeat_penalty=2.0, repeat_last_n=0, logit_bias=((3, -100.0),))
    assert penalize(row, [0, 1], no_window).tolist() == pytest.approx([2.0, -1.0, 0.5, -97.0])
