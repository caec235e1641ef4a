"""scripts/replay_ngram.py: the offline walk of the n-gram lookup and the cost policy."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

from edge_spec.policy.cost import CostModelK
from edge_spec.policy.types import CostCurve

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "replay_ngram.py"


def load_script():
    spec = importlib.util.spec_from_file_location("replay_ngram", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def curve() -> CostCurve:
    # This CPU's shape: t(2) / t(1) = 1.39, flattening towards t(16) = 3.25.
    rel = (1.0, 1.39, 1.58, 1.71, 1.96, 2.01, 2.1, 2.19, 2.38, 2.57, 2.64, 2.71, 2.84, 2.98)
    rel += (3.11, 3.25)
    return CostCurve(tuple(0.03 * r for r in rel), 0.02, 1e-4)


def test_a_copy_pays_and_nothing_beats_the_clairvoyant_walk() -> None:
    replay = load_script()
    costs = curve()
    text = [3, 8, 1, 9, 4, 7, 2, 6, 5, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]
    prompt = [1, 2] + text + [30, 31, 2]
    cases = {
        "copy": text * 2,  # repeats the prompt's text (and then itself)
        "fresh": list(range(100, 140)),  # nothing to copy: the plain rate
    }
    for name, truth in cases.items():
        n, plain_like = len(truth), len(truth) * costs.t(1)
        policy = CostModelK(costs, k_max=16)
        tokens, replayed_s = replay.walk(prompt, truth, costs, 0.0, policy)
        _, bound_s = replay.walk(prompt, truth, costs, 0.0, None, clairvoyant=True)
        assert tokens == n
        assert bound_s <= replayed_s + 1e-12, name
        if name == "copy":
            assert plain_like / replayed_s > 2.0, plain_like / replayed_s
        else:  # no candidate ever: every step is a plain one
            assert math.isclose(bound_s, plain_like) and math.isclose(replayed_s, plain_like)


def test_the_linear_fit_recovers_the_cost_per_verified_token() -> None:
    # Steps that cost t(1) = 14 ms plus 2.5 ms per drafted token, whatever the profile says;
    # another strategy's runs (a model's draft time inside llama_decode) are left out.
    replay = load_script()
    t1_s, per_token_s = 0.014, 0.0025
    runs = [{"strategy": "target", "llama_decode_s": 50 * t1_s, "k_chosen": [50]}]
    for counts in ([10, 0, 3, 0, 5], [4, 6, 0, 0, 0, 0, 0, 0, 2], [1] * 20):
        steps = sum(counts)
        drafted = sum(k * c for k, c in enumerate(counts))
        runs.append(
            {
                "strategy": "ngram",
                "llama_decode_s": steps * t1_s + drafted * per_token_s,
                "k_chosen": counts,
            }
        )
    runs.append({"strategy": "auto", "llama_decode_s": 9.0, "k_chosen": [1, 1]})
    fitted = replay.fitted_curve(runs, curve(), "ngram", linear=True)
    for n in (1, 2, 8, 33):
        assert math.isclose(fitted.t(n), t1_s + (n - 1) * per_token_s, rel_tol=1e-9), n
