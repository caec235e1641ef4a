"""k policies on synthetic data: the cost model's formula and choices, early stop, probing,
the +2/-1 heuristic, decaying evidence and the online cost correction. Pure and fast."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_spec.drafts.candidates import Branch, NgramCandidate
from edge_spec.policy import make_policy
from edge_spec.policy.cost import DRAFT_FREE_RISK, CostModelK
from edge_spec.policy.estimators import AcceptanceEstimate, ConfidenceCalibration, OnlineCosts
from edge_spec.policy.simple import FixedK, HeuristicK
from edge_spec.policy.trees import alternate_tree, branch_lengths, token_tree
from edge_spec.policy.types import PLAIN, CostCurve, StepOutcome, StepPlan, expected_tokens
from edge_spec.simulate.replay import replay
from edge_spec.simulate.traces import PromptTrace

MS = 1e-3
MODEL_ONLY = ("model", "none")
# facts.md, this CPU: SmolLM2-135M F16 target, t(n)/t(1) at n = 1..5, 8, 16 (6, 7 interpolated).
SMOLLM2_F16_REL = (1.0, 1.46, 1.62, 1.77, 2.00, 2.10, 2.20, 2.30, 2.41, 2.51, 2.62, 2.72, 2.83)


def cpu_costs(c: float = 0.54) -> CostCurve:
    t1 = 16.4 * MS
    return CostCurve(tuple(t1 * r for r in SMOLLM2_F16_REL), draft_token_s=c * t1)


def flat_costs(c: float, n: int = 17) -> CostCurve:
    """A verifier for which n tokens cost as much as one (a GPU well under its compute)."""
    return CostCurve((10 * MS,) * n, draft_token_s=c * 10 * MS)


def outcome(source: str, drafted: int, accepted: int, costs: CostCurve, **kw) -> StepOutcome:
    draft_s = costs.draft_s(drafted) if source == "model" and drafted else 0.0
    return StepOutcome(
        source,  # type: ignore[arg-type]
        drafted,
        accepted,
        kw.pop("confidences", ()),
        kw.pop("match_len", 0),
        kw.pop("draft_s", draft_s),
        kw.pop("verify_s", costs.t(drafted + 1)),
        **kw,
    )


def synthetic_trace(
    model_agree: list[int], confidence: list[float], ngram_agree: list[int] | None = None
) -> PromptTrace:
    """A trace whose per-position facts are given; the n-gram lookup proposes 16 tokens with a
    3-token match where ngram_agree is given, nothing otherwise."""
    n = len(model_agree)
    tokens = tuple(range(n))
    ngram = ngram_agree or [0] * n
    proposals = tuple(
        tuple(tokens[pos : pos + a]) + (10**6,) * (16 - a) if ngram_agree else ()
        for pos, a in enumerate(ngram)
    )
    return PromptTrace(
        id="synthetic",
        category="synthetic",
        tokens=tokens,
        model_agree=tuple(min(a, n - pos) for pos, a in enumerate(model_agree)),
        model_confidence=tuple((c,) * min(16, n - pos) for pos, c in enumerate(confidence)),
        ngram_agree=tuple(min(a, n - pos) for pos, a in enumerate(ngram)),
        ngram_proposal=proposals,
        ngram_match_len=tuple(3 if p else 0 for p in proposals),
    )


# ---- the formula -----------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.82, 0.99])
@pytest.mark.parametrize("k", [0, 1, 4, 8])
def test_expected_tokens_matches_the_closed_form(alpha: float, k: int) -> None:
    closed = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert expected_tokens([alpha] * k) == pytest.approx(closed)


def test_expected_tokens_per_position() -> None:
    # 1 + a0 + a0*a1 + a0*a1*a2
    assert expected_tokens([0.5, 0.4, 1.0]) == pytest.approx(1 + 0.5 + 0.2 + 0.2)


def test_cost_curve_extrapolates_and_models_the_draft_batch() -> None:
    costs = CostCurve((1.0, 1.5, 2.0), draft_token_s=0.5)
    assert costs.t(5) == pytest.approx(3.0)  # slope of the last two points
    assert costs.c == pytest.approx(0.5)
    assert costs.draft_s(3, 1) == pytest.approx(0.5 * 3)  # k decodes, the first of 1 token
    assert costs.draft_s(3, 2) == pytest.approx(0.5 * (1.5 + 2))  # first decode: a batch of 2
    own = CostCurve((1.0, 1.5), draft_token_s=0.5, draft_verify_s=(0.4, 0.5, 0.7))
    assert own.draft_s(2, 3) == pytest.approx(0.7 + 0.4)


def test_a_long_catch_up_costs_at_least_the_curves_average_per_token() -> None:
    """A draft model re-decoding hundreds of prompt tokens: measured curves end noisy (this
    draft's was flat from 10 to 16 tokens, and a 440-token catch-up then looked like 38 ms
    instead of the 690 it took), so past the curve its average cost per token goes on."""
    flat_end = (0.011, 0.015, 0.018, 0.030, 0.039, 0.039, 0.0385)
    costs = CostCurve((0.017, 0.020), draft_token_s=0.011, draft_verify_s=flat_end)
    average = (0.0385 - 0.011) / 6
    assert costs.draft_s(1, 440) == pytest.approx(0.0385 + (440 - 7) * average)
    assert costs.draft_s(1, 7) == pytest.approx(0.0385)  # within the curve: as measured
    steep = CostCurve((0.017, 0.020), draft_token_s=0.011, draft_verify_s=(0.01, 0.02, 0.05))
    assert steep.draft_s(1, 10) == pytest.approx(0.05 + 7 * 0.03)  # the last slope, if steeper
    # Without a draft curve, the target's shape scaled to the draft's one-token cost.
    plain = CostCurve((0.010, 0.012, 0.013), draft_token_s=0.005)
    assert plain.draft_s(1, 100) == pytest.approx(0.005 * (0.013 + 97 * 0.0015) / 0.010)


# ---- what the cost model picks ---------------------------------------------------------------


def test_free_verifier_and_high_acceptance_pick_a_large_k() -> None:
    policy = CostModelK(flat_costs(c=0.05), k_max=8, prior_alpha={"model": 0.95}, risk_floor=None)
    k, rate = policy.options(MODEL_ONLY, 8, None)["model"]
    assert k == 8
    assert rate > 2 / flat_costs(0.05).t(1)
    assert policy.plan(MODEL_ONLY, 8, None) == StepPlan("model", 8)


def test_a_steep_curve_and_low_acceptance_pick_a_small_k() -> None:
    policy = CostModelK(cpu_costs(c=0.05), k_max=8, prior_alpha={"model": 0.6})
    k, _ = policy.options(MODEL_ONLY, 8, None)["model"]
    assert 1 <= k <= 3


def test_this_cpu_with_alpha_082_and_c_054_decodes_plainly() -> None:
    """facts.md: with alpha 0.82, c 0.54 and this CPU's curve no k pays."""
    costs = cpu_costs(c=0.54)
    policy = CostModelK(costs, k_max=8, prior_alpha={"model": 0.82})
    for k in range(1, 9):
        rate = expected_tokens([0.82] * k) / (k * costs.draft_token_s + costs.t(k + 1))
        assert rate < 1 / costs.t(1)
    assert policy.plan(MODEL_ONLY, 8, None) == PLAIN
    # Evidence at that rate (each token accepted with probability 0.82) keeps it there.
    rng = np.random.default_rng(0)
    for _ in range(200):
        accepted = next((i for i in range(8) if rng.random() >= 0.82), 8)
        policy.update(outcome("model", 8, accepted, costs))
        policy.begin()  # no lag: only the acceptance matters here
    assert policy.model.pooled() == pytest.approx(0.82, abs=0.08)
    assert policy.plan(MODEL_ONLY, 8, None) == PLAIN


def test_ngram_chosen_for_a_long_match_when_the_model_is_expensive() -> None:
    costs = cpu_costs(c=0.9)
    policy = CostModelK(costs, k_max=8, prior_alpha={"model": 0.8, "ngram": 0.6}, risk_floor=None)
    long_match = NgramCandidate(tuple(range(8)), match_len=3)
    plan = policy.plan(("model", "ngram", "none"), 8, long_match)
    assert plan.source == "ngram" and 1 <= plan.k <= 8
    # A 1-token match predicts worse (its prior is graded down): not worth verifying here.
    short = NgramCandidate(tuple(range(8)), match_len=1)
    assert policy.plan(("ngram", "none"), 8, short) == PLAIN


def test_the_draft_model_is_prefilled_only_while_its_steps_pay_for_the_prefill() -> None:
    # Flat to 16 tokens (a GPU), a prompt's worth of tokens still costs a prefill.
    costs = CostCurve((10 * MS,) * 16 + (20 * MS,), draft_token_s=0.5 * MS)
    policy = CostModelK(costs, k_max=8, prior_alpha={"model": 0.8}, risk_floor=None)
    # No request yet: the estimate alone decides.
    assert policy.wants_model(model_lag=2000)
    # A request in which the model never drafted saved nothing: prefilling 2,000 tokens
    # would be lost; nothing to prefill costs nothing.
    policy.begin(model_lag=2000)
    for _ in range(20):
        policy.update(outcome("ngram", 4, 4, costs))
    assert not policy.wants_model(model_lag=2000)
    assert policy.wants_model(model_lag=1)
    # Requests whose model steps saved more than the prefill costs: prefill again.
    for _ in range(3):
        policy.begin(model_lag=1)
        for _ in range(200):
            policy.update(outcome("model", 8, 8, costs))
    prefill_s = costs.draft_s(1, 2000) - costs.draft_s(1, 1)
    assert policy.wants_model(model_lag=2000) and prefill_s > 0
    # Probes are the policy's own questions, not gains: they leave the balance as it was.
    probe = CostModelK(costs, k_max=8, prior_alpha={"model": 0.8}, risk_floor=None)
    probe.begin(model_lag=1)
    probe.probes["model"].pending = True
    probe.update(outcome("model", 1, 1, costs))
    assert list(probe._model_gains) == [0.0]


def test_plans_respect_the_caps() -> None:
    policy = CostModelK(flat_costs(c=0.0), k_max=8, prior_alpha={"model": 0.99, "ngram": 0.7})
    assert policy.plan(MODEL_ONLY, 3, None) == StepPlan("model", 3)
    assert policy.plan(MODEL_ONLY, 0, None) == PLAIN
    two = NgramCandidate((5, 6), match_len=3)
    plan = policy.plan(("ngram", "none"), 8, two)
    assert plan.source == "ngram" and plan.k <= 2
    assert policy.plan(("none",), 8, two) == PLAIN


def test_the_draft_model_is_prefilled_only_where_it_is_expected_to_pay() -> None:
    assert not CostModelK(cpu_costs(c=0.54), prior_alpha={"model": 0.82}).wants_model()
    assert CostModelK(flat_costs(c=0.05), prior_alpha={"model": 0.8}).wants_model()
    assert FixedK(4).wants_model() and not FixedK(4, "ngram").wants_model()
    # A draft whose cache lags the prompt costs its catch-up: no plan drafts with it on a CPU.
    policy = CostModelK(cpu_costs(c=0.1), k_max=8, prior_alpha={"model": 0.9}, risk_floor=None)
    policy.begin(model_lag=1)
    assert policy.plan(MODEL_ONLY, 8, None).source == "model"
    policy.begin(model_lag=400)
    assert policy.plan(MODEL_ONLY, 8, None) == PLAIN


# ---- the risk ledger -------------------------------------------------------------------------


def test_a_request_starts_with_a_draft_whose_worst_case_is_half_a_step() -> None:
    """Shared evidence says long n-gram matches are right, but a new request may differ: on a
    CPU (t(2) = 1.4 t(1)) its first draft is one token; on a flat curve it may be long."""
    candidate = NgramCandidate(tuple(range(8)), match_len=6)
    cpu = CostModelK(cpu_costs(), k_max=8, prior_alpha={"ngram": 0.9})
    assert cpu.plan(("ngram", "none"), 8, candidate) == StepPlan("ngram", 1)
    unbounded = CostModelK(cpu_costs(), k_max=8, prior_alpha={"ngram": 0.9}, risk_floor=None)
    assert unbounded.plan(("ngram", "none"), 8, candidate).k > 1
    flat = CostModelK(flat_costs(c=0.0), k_max=8, prior_alpha={"ngram": 0.9})
    assert flat.plan(("ngram", "none"), 8, candidate) == StepPlan("ngram", 8)


def test_token_tree_layout_follows_the_branch_weights() -> None:
    branches = (Branch(2, (30, 31), (0.4, 0.2)), Branch(0, (20, 21, 22), (0.3, 0.3, 0.1)))
    candidate = NgramCandidate((1, 2, 3, 4), 3, 5, 2, branches)
    # The fixed policy's tree: whole branches, heaviest first, as many tokens as allowed.
    assert branch_lengths(candidate, 4, 4) == (2, 2)
    tree = token_tree(candidate, 4, (2, 2))
    # The chain, then the heavier branch from main token 1, then what fits of the other.
    assert tree.tokens == (1, 2, 3, 4, 30, 31, 20, 21)
    assert tree.parents == (-1, 0, 1, 2, 1, 4, -1, 6)
    assert tree.branch_weights == (0.4, 0.2, 0.3, 0.3) and tree.n_main == 4
    # A branch forking past the chain's end has nothing to hang from; leaves are capped.
    assert branch_lengths(candidate, 2, 8) == (0, 3)
    assert token_tree(candidate, 1, (2, 3)).tokens == (1, 20, 21, 22)
    assert token_tree(candidate, 4, (2, 3), max_leaves=2).tokens == (1, 2, 3, 4, 30, 31)


def test_token_trees_are_planned_where_verification_is_cheap_and_dropped_where_branches_fail() -> (
    None
):
    """Branches that one occurrence in five took: a nearly flat curve (3 % per extra token)
    takes them; this CPU's curve, where an extra verified token costs 10-46 % of a step, does
    not. Branches that keep failing teach the flat policy to stop adding them."""
    branches = (Branch(0, (20, 21, 22), (0.2, 0.2, 0.2)), Branch(1, (30,), (0.2,)))
    candidate = NgramCandidate(tuple(range(4)), 3, 5, 2, branches)
    gentle = CostCurve(tuple(10 * MS * (1 + 0.03 * n) for n in range(17)))
    flat = CostModelK(gentle, k_max=16, prior_alpha={"ngram": 0.6})
    plan = flat.plan(("ngram", "none"), 16, candidate)
    assert plan.source == "ngram" and plan.k == 4 and plan.branches == (3, 1)
    cpu = CostModelK(cpu_costs(), k_max=16, prior_alpha={"ngram": 0.6}, risk_floor=None)
    assert cpu.plan(("ngram", "none"), 16, candidate).tree_nodes == 0
    for _ in range(30):
        plan = flat.plan(("ngram", "none"), 16, candidate)
        tree = token_tree(candidate, plan.k, plan.branches)
        flat.update(
            outcome(
                "ngram",
                len(tree.tokens),
                plan.k,
                gentle,
                match_len=3,
                tokens=(*candidate.tokens[: plan.k], 9),
                n_branch_nodes=len(tree.branch_weights),
                branch_weight=sum(tree.branch_weights),
            )
        )
    assert flat.plan(("ngram", "none"), 16, candidate).tree_nodes == 0
    assert flat.branch_yield.value < 0.4  # learned down from its prior, 0.5


def test_runner_up_branches_are_taken_where_verification_is_cheap_and_dropped_where_they_fail() -> (
    None
):
    """A learned draft's runner-ups as one-token branches: on a gentle curve (6 % a token) the heavy
    ones are verified beside the chain, the light one is not; on this CPU's curve none are;
    runner-ups that keep failing teach the flat policy to stop adding them."""
    alternates = ((0, 50, 0.3), (1, 51, 0.05), (2, 52, 0.25))
    confidences = (0.6, 0.6, 0.6)
    gentle = CostCurve(tuple(10 * MS * (1 + 0.06 * n) for n in range(17)), draft_token_s=1e-5)
    flat = CostModelK(gentle, k_max=16)
    flat.plan(MODEL_ONLY, 16, None)
    picked = flat.alternates(confidences, alternates, 8)
    assert picked[:1] == (0,) and 1 not in picked
    assert flat.alternates(confidences, alternates, 0) == ()  # no room in the batch
    cpu = CostModelK(cpu_costs(c=0.03), k_max=16, risk_floor=None)
    cpu.plan(MODEL_ONLY, 16, None)
    assert cpu.alternates(confidences, alternates, 8) == ()
    for _ in range(30):
        flat.plan(MODEL_ONLY, 16, None)
        picked = flat.alternates(confidences, alternates, 8)
        flat.update(
            outcome(
                "model",
                3 + len(picked),
                1,
                gentle,
                confidences=confidences,
                n_branch_nodes=len(picked),
                branch_weight=sum(alternates[j][2] for j in picked),
            )
        )
    assert flat.alternates(confidences, alternates, 8) == ()
    assert flat.alternate_yield.value < 0.4  # learned down from its prior, 0.8


def test_runner_up_tree_layout_and_the_fixed_policys_pick() -> None:
    alternates = ((0, 50, 0.3), (1, 51, 0.05), (2, 52, 0.25), (3, 53, 0.9), (1, 6, 0.9))
    assert FixedK(3, tree_nodes=2).alternates((0.5,) * 3, alternates, 8) == (3, 4)
    assert FixedK(3, tree_nodes=8).alternates((0.5,) * 3, alternates, 8, max_leaves=3) == (3, 4)
    assert FixedK(3).alternates((0.5,) * 3, alternates, 8) == ()
    # Alternate j hangs beside chain token i; one past the chain or equal to it is left out.
    tree = alternate_tree((5, 6, 7), alternates, (0, 2, 3, 4))
    assert tree.tokens == (5, 6, 7, 50, 52) and tree.parents == (-1, 0, 1, -1, 1)
    assert tree.branch_weights == (0.3, 0.25) and tree.n_main == 3


def test_drafts_lengthen_as_they_pay_within_the_request() -> None:
    costs = cpu_costs()
    policy = CostModelK(costs, k_max=8, prior_alpha={"ngram": 0.9})
    candidate = NgramCandidate(tuple(range(8)), match_len=6)
    ks = []
    for _ in range(4):
        plan = policy.plan(("ngram", "none"), 8, candidate)
        ks.append(plan.k)
        policy.update(outcome("ngram", plan.k, plan.k, costs, match_len=6))
    assert ks[0] == 1 and ks[-1] == 8 and ks == sorted(ks)
    policy.begin()  # a new request starts over
    assert policy.plan(("ngram", "none"), 8, candidate).k == 1


def test_failing_drafts_cost_at_most_the_allowance_whatever_the_estimates_say() -> None:
    """Every draft of a 300-token request is rejected and verification costs 1.5x what the
    curve says, while the shared estimates stay sure (no decay) and the matches keep changing
    kind (each match length and consensus has its own estimate to disappoint): the request
    loses at most the floor plus the rate of its time, plus one step."""

    def run(risk: dict) -> tuple[float, float]:
        costs = cpu_costs()
        policy = CostModelK(costs, k_max=8, prior_alpha={"ngram": 0.95}, decay=1.0, **risk)
        spent_s = 0.0
        for i in range(300):
            match_len = (1, 2, 3, 6, 12)[i % 5]
            agreeing = (1, 2, 1)[(i // 5) % 3]  # one occurrence, all agreeing, split
            candidate = NgramCandidate(tuple(range(8)), match_len, 2 if i // 5 % 3 else 1, agreeing)
            plan = policy.plan(("ngram", "none"), 8, candidate)
            verify_s = costs.t(plan.k + 1) * (1.5 if plan.k else 1.0)
            spent_s += verify_s
            policy.update(
                outcome(plan.source, plan.k, 0, costs, match_len=match_len, verify_s=verify_s)
            )
        return spent_s - 300 * costs.t(1), 300 * costs.t(1)

    lost_s, plain_s = run({"risk_floor": 0.5})
    t1 = cpu_costs().t(1)
    assert lost_s > 0  # it did try
    assert lost_s <= 0.5 * t1 + 0.04 * plain_s + cpu_costs().t(9)
    unbounded_lost_s, _ = run({"risk_floor": None})
    assert unbounded_lost_s > 2 * lost_s  # what the estimates alone would have lost
    # The draft-free mode's tighter ledger (--draft-mode ngram: a per-request promise).
    free_lost_s, _ = run(DRAFT_FREE_RISK)
    assert 0 < free_lost_s <= 0.04 * plain_s + cpu_costs().t(9)


def test_the_draft_free_ledger_defers_a_requests_first_draft_on_a_cpu_curve() -> None:
    """With no floor, a rejected one-token draft (t(2) = 1.4 t(1)) must be covered by the
    request's own plain steps (4 % of each): the first draft waits about ten of them, so an
    answer shorter than that never drafts."""
    candidate = NgramCandidate(tuple(range(8)), match_len=6)
    costs = cpu_costs()
    policy = CostModelK(costs, k_max=8, prior_alpha={"ngram": 0.9}, **DRAFT_FREE_RISK)
    steps = 0
    while policy.plan(("ngram", "none"), 8, candidate) == PLAIN:
        policy.update(outcome("none", 0, 0, costs))
        steps += 1
        assert steps < 20
    assert steps >= 8


def test_a_draft_model_not_loaded_yet_drafts_only_once_the_ledger_covers_its_load() -> None:
    """A draft model that loads on first use costs its load before its first draft: the risk
    ledger charges that to the plan that would load it, so a short request never bets the
    load (plain steps run until 4 % of their time covers it), and the load it measured then
    counts as lost like any other drafting cost."""
    costs = flat_costs(c=0.1)  # a flat verifier, where the model pays from the first step
    t1 = costs.t(1)
    loaded = CostModelK(costs, k_max=8, prior_alpha={"model": 0.9})
    loaded.begin(1, model_load_s=0.0)
    assert loaded.plan(MODEL_ONLY, 8, None).source == "model"
    policy = CostModelK(costs, k_max=8, prior_alpha={"model": 0.9})
    policy.begin(1, model_load_s=0.2)
    steps = 0
    while (plan := policy.plan(MODEL_ONLY, 8, None)) == PLAIN:
        policy.update(outcome("none", 0, 0, costs))
        steps += 1
        assert steps < 1000
    assert plan.source == "model"
    # Half a step plus 4 % of the plain time so far covers the 0.2 s load (and the draft).
    assert abs(steps - (0.2 - 0.5 * t1) / (0.04 * t1)) <= 5
    # The measured load is lost: a load that took far longer than expected stops drafting.
    after = {}
    for load_s in (0.2, 10.0):
        twin = CostModelK(costs, k_max=8, prior_alpha={"model": 0.9})
        twin.begin(1, model_load_s=0.2)
        for _ in range(steps):
            twin.update(outcome("none", 0, 0, costs))
        k = twin.plan(MODEL_ONLY, 8, None).k
        twin.update(outcome("model", k, k, costs, load_s=load_s))
        after[load_s] = twin.plan(MODEL_ONLY, 8, None)
    assert after[0.2].source == "model" and after[10.0] == PLAIN


# ---- early stop ------------------------------------------------------------------------------


def test_early_stop_on_low_confidence() -> None:
    costs = cpu_costs(c=0.1)
    policy = CostModelK(costs, k_max=8, prior_alpha={"model": 0.9}, risk_floor=None)
    plan = policy.plan(MODEL_ONLY, 8, None)
    assert plan.source == "model" and plan.k >= 4
    assert policy.keep_drafting(0, 0.99)
    assert policy.keep_drafting(1, 0.97)
    assert not policy.keep_drafting(2, 0.05)


def test_calibration_learns_that_the_draft_is_underconfident() -> None:
    calibration = ConfidenceCalibration()
    assert calibration.p_accept(0.5) == pytest.approx(0.5)  # the prior: the confidence itself
    for _ in range(200):
        calibration.observe([0.5, 0.5], n_accepted=2)  # both accepted
    assert calibration.p_accept(0.5) > 0.95
    assert calibration.p_accept(0.1) == pytest.approx(0.1)  # other bins untouched


# ---- probing and regime change ---------------------------------------------------------------


def test_probes_after_k0_and_notices_a_regime_change() -> None:
    """The draft is useless for 300 positions, then always right: plain steps with rare
    probes, then the model again within the backoff's bound."""
    costs = flat_costs(c=0.5)
    n_bad, n_good = 300, 400
    trace = synthetic_trace([0] * n_bad + [16] * n_good, [0.1] * n_bad + [0.99] * n_good)
    policy = CostModelK(costs, k_max=8)
    steps: list[tuple[int, str]] = []  # (position, source)
    update = policy.update

    def spy(o: StepOutcome) -> None:
        pos = steps[-1][0] + 1 + steps[-1][2] if steps else 0  # type: ignore[misc]
        steps.append((pos, o.source, o.n_accepted))  # type: ignore[arg-type]
        update(o)

    policy.update = spy  # type: ignore[method-assign]
    replay(trace, costs, policy, k_max=8, sources=MODEL_ONLY)
    bad = [s for pos, s, _ in steps if pos < n_bad]
    probes = bad.count("model")
    assert bad[-50:].count("none") >= 45  # plain decoding once the draft proved useless
    assert 2 <= probes <= 12  # probing, with exponential backoff
    first_good = next(i for i, (pos, _, _) in enumerate(steps) if pos >= n_bad)
    after = [s for _, s, _ in steps[first_good:]]
    first_model = after.index("model")
    assert first_model <= 128 + 1  # the backoff's ceiling
    assert after[first_model:].count("model") >= 0.9 * len(after[first_model:])


def test_a_model_probe_is_skipped_while_the_draft_lags_far_on_a_cpu() -> None:
    costs = cpu_costs(c=0.54)
    # Without the risk ledger, which on a CPU keeps a request's first steps from a model draft
    # anyway (its worst case costs more than half a plain step).
    policy = CostModelK(costs, k_max=8, prior_alpha={"model": 0.82}, risk_floor=None)
    for _ in range(60):  # plain steps: the draft's cache falls 60 tokens behind
        assert policy.plan(MODEL_ONLY, 8, None) == PLAIN
        policy.update(outcome("none", 0, 0, costs))
    assert policy.n_fresh == 61
    policy.begin()  # a new request: the draft is in sync again, so a probe is cheap
    assert policy.plan(MODEL_ONLY, 8, None) == StepPlan("model", 1)


def test_model_probes_get_less_budget_while_its_steps_gained_nothing() -> None:
    """A probe at a request's start catches the draft up over the prompt: on a CPU it is
    afforded from the time since the model last drafted, a quarter as much once the last
    MODEL_GAIN_REQUESTS requests gained nothing from the model's own steps."""
    costs = cpu_costs(c=0.54)

    def first_plan(plain_per_request: tuple[int, ...], model_gained: bool = False) -> StepPlan:
        policy = CostModelK(costs, k_max=8, prior_alpha={"model": 0.82}, risk_floor=None)
        for i, n_plain in enumerate(plain_per_request):
            policy.begin(model_lag=1)
            if model_gained and i == 0:
                policy.update(outcome("model", 4, 4, costs))  # chosen, all accepted: a gain
            for _ in range(n_plain):
                policy.update(outcome("none", 0, 0, costs))
        policy.begin(model_lag=100)  # a probe now re-decodes 100 tokens
        return policy.plan(MODEL_ONLY, 8, None)

    # The same 450 plain steps since the model last drafted, over 2 or 3 earlier requests.
    assert first_plan((225, 225)) == StepPlan("model", 1)
    assert first_plan((150, 150, 150)) == PLAIN  # 4 requests without a gain: a quarter
    assert first_plan((150, 150, 150), model_gained=True) == StepPlan("model", 1)
    assert first_plan((600, 600, 600)) == StepPlan("model", 1)  # four times as long: affordable


def test_ngram_candidates_are_scored_on_the_produced_tokens() -> None:
    costs = cpu_costs(c=0.54)
    policy = CostModelK(costs, k_max=8, prior_alpha={"ngram": 0.3})
    candidate = NgramCandidate((1, 2, 3, 4), match_len=3)
    assert policy.plan(("ngram", "none"), 8, candidate) == PLAIN
    n_plain = 0
    while policy.plan(("ngram", "none"), 8, candidate).source != "ngram" and n_plain < 30:
        # A plain step produced token 1: the candidate's first token was right.
        policy.update(outcome("none", 0, 0, costs, tokens=(1,)))
        n_plain += 1
    assert 1 <= n_plain <= 5
    assert policy.ngram[3, "one"].alphas(1)[0] > 0.7


# ---- baselines -------------------------------------------------------------------------------


def test_heuristic_plus_two_minus_one() -> None:
    costs = cpu_costs()
    policy = HeuristicK(k_start=4, k_max=8, source="model")
    assert policy.plan(MODEL_ONLY, 8, None) == StepPlan("model", 4)
    policy.update(outcome("model", 4, 4, costs))
    assert policy.k == 6
    policy.update(outcome("model", 6, 6, costs))
    assert policy.k == 8
    policy.update(outcome("model", 8, 8, costs))
    assert policy.k == 8  # capped
    policy.update(outcome("model", 8, 3, costs))
    assert policy.k == 7
    for _ in range(10):
        policy.update(outcome("model", 1, 0, costs))
    assert policy.k == 1  # floor
    policy.update(outcome("none", 0, 0, costs))
    assert policy.k == 1  # plain steps say nothing
    assert policy.plan(MODEL_ONLY, 0, None) == PLAIN


def test_fixed_k_caps_and_sources() -> None:
    fixed = FixedK(5, "ngram")
    assert fixed.plan(("ngram", "none"), 8, NgramCandidate((1, 2, 3), 2)) == StepPlan("ngram", 3)
    assert fixed.plan(("ngram", "none"), 2, NgramCandidate((1, 2, 3), 2)) == StepPlan("ngram", 2)
    assert fixed.plan(("ngram", "none"), 8, None) == PLAIN
    assert fixed.plan(MODEL_ONLY, 8, None) == PLAIN  # its source is not available
    auto = FixedK(4)
    assert auto.plan(("model", "ngram", "none"), 8, None) == StepPlan("model", 4)
    assert auto.plan(("ngram", "none"), 8, NgramCandidate((1,) * 9, 3)) == StepPlan("ngram", 4)
    assert FixedK(0).plan(MODEL_ONLY, 8, None) == PLAIN
    assert fixed.keep_drafting(3, 0.0)


def test_make_policy() -> None:
    assert isinstance(make_policy("fixed", None, 4, 8), FixedK)
    assert make_policy("heuristic", None, 4, 8).plan(MODEL_ONLY, 8, None) == StepPlan("model", 4)
    assert isinstance(make_policy("cost", cpu_costs(), 4, 8), CostModelK)
    with pytest.raises(ValueError):
        make_policy("cost", None, 4, 8)
    with pytest.raises(ValueError):
        make_policy("oracle", None, 4, 8)


# ---- evidence decays; costs heal -------------------------------------------------------------


def test_decay_makes_old_evidence_fade() -> None:
    fading = AcceptanceEstimate(prior=0.5, n_positions=4, decay=0.9)
    keeping = AcceptanceEstimate(prior=0.5, n_positions=4, decay=1.0)
    for estimate in (fading, keeping):
        for _ in range(60):
            estimate.observe(n_drafted=1, n_accepted=0)
        for _ in range(60):
            estimate.observe(n_drafted=1, n_accepted=1)
    assert fading.alphas(1)[0] > 0.95
    assert keeping.alphas(1)[0] == pytest.approx(0.5, abs=0.02)


def test_lazy_fading_equals_fading_every_unobserved_step() -> None:
    """A clocked estimate fades when read, for the steps that did not observe it; the same
    evidence as one faded on every such step."""
    from edge_spec.policy.estimators import ForgetClock

    rng = np.random.default_rng(3)
    clock = ForgetClock(0.99)
    lazy = AcceptanceEstimate(prior=0.4, n_positions=6, decay=0.9, clock=clock)
    eager = AcceptanceEstimate(prior=0.4, n_positions=6, decay=0.9)
    for _ in range(3000):  # long enough for the scale to be folded in (1e-200) more than once
        if rng.random() < 0.02:
            n_drafted = int(rng.integers(1, 7))
            n_accepted = int(rng.integers(0, n_drafted + 1))
            lazy.observe(n_drafted, n_accepted)
            eager.observe(n_drafted, n_accepted)
            lazy.seen()
        else:
            eager.forget(0.99)
        clock.now += 1
        if rng.random() < 0.1:
            assert lazy.alphas(8) == pytest.approx(eager.alphas(8), rel=1e-9)
    assert lazy.state()["reached"] == pytest.approx(eager.state()["reached"], rel=1e-9)


def test_online_costs_curve_and_caps_match_their_definitions() -> None:
    """The corrected curve built once per measurement, and the risk ledger's caps found by
    bisection, against t(n) and the ledger's first-exceeding k computed from scratch."""
    rng = np.random.default_rng(4)
    profile = CostCurve((10 * MS, 14 * MS, 17 * MS, 21 * MS), draft_token_s=4 * MS)
    policy = CostModelK(profile, k_max=12)
    costs = policy.costs
    for _ in range(300):
        n_drafted = int(rng.integers(0, 13))
        slow = float(rng.uniform(0.5, 3.0))
        source = "ngram" if n_drafted else "none"
        verify_s = slow * profile.t(n_drafted + 1)
        outcome = StepOutcome(source, n_drafted, 0, (), 0, 1e-5, verify_s)
        costs.observe(outcome, 1)
        ratios = [costs._log_ratio(n) for n in range(1, 14)]
        for n in range(1, 14):
            measured = [m for m in range(1, min(n, 13) + 1) if costs._verify[m].n]
            log_ratio = costs._verify[measured[-1]].value if measured else costs._verify_all.value
            assert ratios[n - 1] == log_ratio
            assert costs.t(n) == profile.t(n) * math.exp(log_ratio)
        policy._lost_s = float(rng.uniform(-0.1, 0.05))
        policy._plain_s = float(rng.uniform(0, 1.0))
        k_cap = int(rng.integers(0, 13))
        allowance = policy._allowance()
        expected = {}
        for source in ("model", "ngram"):
            k = 0
            while k < k_cap:
                extra = costs.t(k + 2) - costs.t(1)
                extra += costs.draft_s(k + 1, policy.n_fresh) if source == "model" else 0.0
                if extra > allowance:
                    break
                k += 1
            expected[source] = k
        assert policy._risk_caps(k_cap) == expected


def test_the_prior_fades_as_evidence_comes_in() -> None:
    estimate = AcceptanceEstimate(prior=0.2, n_positions=4, decay=0.95)
    assert estimate.alphas(3) == pytest.approx([0.2] * 3)
    for _ in range(40):
        estimate.observe(n_drafted=4, n_accepted=4)
    assert min(estimate.alphas(4)) > 0.85


def test_online_costs_heal_a_stale_profile_and_shrug_off_outliers() -> None:
    profile = CostCurve((10 * MS, 12 * MS, 14 * MS), draft_token_s=5 * MS)
    costs = OnlineCosts(profile, n_sizes=9)
    for _ in range(40):  # the device is twice as slow as the profile says
        costs.observe(outcome("none", 0, 0, profile, verify_s=20 * MS), n_fresh=1)
        costs.observe(outcome("model", 2, 2, profile, verify_s=28 * MS, draft_s=20 * MS), 1)
    assert costs.t(1) == pytest.approx(20 * MS, rel=0.05)
    assert costs.t(3) == pytest.approx(28 * MS, rel=0.05)
    assert costs.t(2) == pytest.approx(24 * MS, rel=0.05)  # unmeasured: borrows t(1)'s ratio
    assert costs.draft_s(2, 1) == pytest.approx(20 * MS, rel=0.05)
    before = costs.t(1)
    costs.observe(outcome("none", 0, 0, profile, verify_s=5.0), n_fresh=1)  # a 250x hiccup
    assert costs.t(1) < 1.1 * before
    costs.observe(outcome("none", 0, 0, profile, verify_s=float("nan")), n_fresh=1)
    assert math.isfinite(costs.t(1))


def test_a_batch_size_misjudged_once_heals_while_other_sizes_are_measured() -> None:
    # One k = 1 step slowed fourfold by another process: its ratio is clipped to 2x at first,
    # and fades back toward the pooled ratio as plain steps at the profile's speed come in.
    profile = CostCurve((10 * MS, 14 * MS, 16 * MS), draft_token_s=5 * MS)
    costs = OnlineCosts(profile, n_sizes=9)
    costs.observe(outcome("ngram", 1, 0, profile, verify_s=56 * MS), n_fresh=1)
    assert costs.t(2) > 1.9 * profile.t(2)
    for _ in range(150):
        costs.observe(outcome("none", 0, 0, profile), n_fresh=1)
    assert costs.t(1) == pytest.approx(profile.t(1), rel=0.02)
    assert costs.t(2) == pytest.approx(profile.t(2), rel=0.1)


def test_token_trees_fit_the_sequences_a_context_holds() -> None:
    """The policies plan trees within their own leaf budget; each leaf is one sequence of the
    target's context, which the backend sizes."""
    from edge_spec.backend.model import MAX_SEQUENCES
    from edge_spec.policy.trees import MAX_TREE_LEAVES

    assert 1 < MAX_TREE_LEAVES <= MAX_SEQUENCES
