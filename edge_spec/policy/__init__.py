"""k policies: per step, which draft source to use and how many tokens to draft (k, down to 0).

The engine asks `plan()` before each step, lets a model draft stop early through
`keep_drafting()`, and reports every step's outcome to `update()`. The same objects drive
`edge-spec simulate`, which replays recorded acceptance traces against device cost curves.

Policies: `FixedK` (one source, one k), `HeuristicK` (transformers' +2/-1 schedule) and
`CostModelK` (the cost model), which picks
(source, k) maximising expected tokens per second, E(k) / (draft cost + t(k + 1)) (Sequoia's
hardware-aware form of Leviathan's walltime factor), from online acceptance estimates and an
online-corrected device cost curve.

Modules: `types` (what every policy shares: the cost curve, a step's plan and outcome, the
KPolicy protocol), `trees` (token trees within a leaf budget), `simple` (the baselines),
`cost` and `estimators` (the cost model), and `make_policy` here.
"""

from __future__ import annotations

from collections.abc import Mapping

from edge_spec.policy.cost import CostModelK
from edge_spec.policy.simple import FixedK, HeuristicK
from edge_spec.policy.types import DEFAULT_TREE_NODES, CostCurve, KPolicy

POLICY_NAMES = ("fixed", "heuristic", "cost")


def make_policy(
    name: str,
    costs: CostCurve | None,
    k: int,
    k_max: int,
    tree_nodes: int | None = None,
    model_prior: float | None = None,
    risk: Mapping[str, float] | None = None,
) -> KPolicy:
    """ "fixed": always k tokens from the model draft (else the n-gram lookup), drafts with up
    to tree_nodes branch tokens (default none); "heuristic": +2/-1 from k_start = k (chains
    only); "cost": CostModelK on `costs` (required), branch tokens while they pay, at most
    tree_nodes (default DEFAULT_TREE_NODES), the learned draft's acceptance starting from
    model_prior where one was measured (a head's held-out acceptance), its risk ledger's
    risk_floor / risk_rate from `risk` where given (else CostModelK's). Raises ValueError."""
    if name == "fixed":
        return FixedK(min(k, k_max), tree_nodes=tree_nodes or 0)
    if name == "heuristic":
        return HeuristicK(k_start=max(1, min(k, k_max)), k_max=max(k_max, 1))
    if name == "cost":
        if costs is None:
            raise ValueError("the cost policy needs a device cost curve")
        tree = DEFAULT_TREE_NODES if tree_nodes is None else tree_nodes
        prior = {"model": model_prior} if model_prior is not None else None
        return CostModelK(costs, k_max=k_max, prior_alpha=prior, tree_nodes=tree, **(risk or {}))
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
