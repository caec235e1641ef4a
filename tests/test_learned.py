"""What the cost policy learned, carried between processes (edge_spec.device.learned): the state
round-trips exactly, holds numbers only, is refused whole when it does not fit, and is ignored
when stale, from another build or another profile measurement."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_spec import __version__
from edge_spec.device import learned
from edge_spec.device.learned import LearnedKey, LearnedStore, load_learned, save_learned
from edge_spec.drafts.candidates import NgramCandidate
from edge_spec.policy.cost import CostModelK
from edge_spec.policy.types import CostCurve, StepOutcome

MS = 1e-3
COSTS = CostCurve(
    tuple(16.4 * MS * r for r in (1.0, 1.46, 1.62, 1.77, 2.0, 2.1, 2.2, 2.3, 2.41)),
    draft_token_s=5 * MS,
)
KEY = LearnedKey("profile-key", "2026-12-07T00:00:00+00:00", ("auto", "model", "cost", 4, 8))


@pytest.fixture(autouse=True)
def learned_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("EDGE_SPEC_LEARNED_DIR", str(tmp_path / "learned"))
    yield tmp_path / "learned"


def _trained(seed: int = 0) -> CostModelK:
    """A policy after a few requests of scripted steps: model drafts with confidences,
    n-gram drafts of several match lengths, plain steps, token-tree branches."""
    policy = CostModelK(COSTS, k_max=8)
    for request in range(3):
        policy.begin(model_lag=40)
        for i in range(30):
            ngram = NgramCandidate((1, 2, 3, 4), match_len=1 + (i + seed) % 7)
            plan = policy.plan(("model", "ngram", "none"), 8, ngram)
            n = plan.k
            accepted = (i * 7 + request + seed) % (n + 1) if n else 0
            policy.update(
                StepOutcome(
                    plan.source if n else "none",
                    n,
                    accepted,
                    tuple(0.5 + 0.05 * j for j in range(n)) if plan.source == "model" else (),
                    ngram.match_len if plan.source == "ngram" else 0,
                    (2 + n) * MS if plan.source == "model" else 0.3 * MS,
                    COSTS.t(n + 1) * (1.1 + 0.01 * (i % 5)),
                    tokens=(1, 2, 9)[: accepted + 1],
                    n_branch_nodes=1 if plan.source == "ngram" and n > 2 else 0,
                    branch_weight=0.4 if plan.source == "ngram" and n > 2 else 0.0,
                )
            )
    return policy


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_the_state_round_trips_through_json_and_plans_the_same() -> None:
    trained = _trained()
    state = json.loads(json.dumps(trained.state()))
    restored = CostModelK(COSTS, k_max=8)
    assert restored.state() != state  # the priors differ from what was learned
    restored.restore(state)
    assert restored.state() == trained.state()
    trained.begin(model_lag=40)
    restored.begin(model_lag=40)
    for match_len in (1, 3, 12):
        ngram = NgramCandidate((5, 6, 7, 8, 9), match_len=match_len)
        sources = ("model", "ngram", "none")
        assert restored.plan(sources, 8, ngram) == trained.plan(sources, 8, ngram)
    assert restored.wants_model(500) == trained.wants_model(500)


def test_the_state_is_numbers_only() -> None:
    state = _trained().state()
    assert all(isinstance(v, int | float) for v in _leaves(state))  # bools are ints
    # Its keys are the policy's own names, never anything from a request.
    ngram_keys = set(state["ngram"])
    assert all(k.split("/")[0].isdigit() for k in ngram_keys)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda s: s["model"].update(accepted=s["model"]["accepted"][:-1]),
        lambda s: s["model"].update(accepted=[x + 100.0 for x in s["model"]["reached"]]),
        lambda s: s["ngram"].pop(next(iter(s["ngram"]))),
        lambda s: s["costs"].update(overhead_s=1.0),
        lambda s: s["costs"]["verify"].__setitem__(1, [50.0, 3]),
        lambda s: s["calibration"].update(seen=[-1.0] * len(s["calibration"]["seen"])),
        lambda s: s["probe_intervals"].update(model=10**6),
        lambda s: s["model_gains"].append(float("nan")),
        lambda s: s.pop("branch_yield"),
        lambda s: s.update(model="not a mapping"),
    ],
)
def test_a_state_that_does_not_fit_is_refused_whole(corrupt: Any) -> None:
    state = _trained().state()
    corrupt(state)
    policy = _trained(seed=1)
    before = policy.state()
    with pytest.raises(ValueError, match="does not fit"):
        policy.restore(state)
    assert policy.state() == before


def test_saved_and_loaded_and_ignored_when_stale(learned_dir: Path) -> None:
    state = _trained().state()
    path = save_learned(KEY, state)
    assert path is not None and path.parent == learned_dir
    assert load_learned(KEY) == json.loads(json.dumps(state))
    # Another profile, too old: ignored.
    assert load_learned(LearnedKey("other", KEY.profile_created, KEY.settings)) is None
    assert load_learned(KEY, now_s=time.time() + learned.MAX_AGE_S + 60) is None
    # Another format or edge_spec version, or a damaged file: ignored.
    data = json.loads(path.read_text())
    for field, value in (("version", 0), ("edge_spec", "0.0.0-other")):
        path.write_text(json.dumps({**data, field: value}))
        assert load_learned(KEY) is None
    path.write_text('{"version": 1, "state": ')
    assert load_learned(KEY) is None
    assert data["edge_spec"] == __version__


def test_another_profile_measurement_is_ignored(learned_dir: Path) -> None:
    save_learned(KEY, _trained().state())
    remeasured = LearnedKey(KEY.profile_key, "2026-12-08T00:00:00+00:00", KEY.settings)
    assert remeasured.name == KEY.name  # the same file ...
    assert load_learned(remeasured) is None  # ... learned against the old measurement


def test_settings_keep_states_apart() -> None:
    sampled = LearnedKey(KEY.profile_key, KEY.profile_created, ("auto", "model", "cost", 4, 8, 1))
    save_learned(KEY, _trained().state())
    assert load_learned(sampled) is None


def test_the_store_restores_saves_at_most_so_often_and_at_flush(learned_dir: Path) -> None:
    trained = _trained()
    store = LearnedStore()
    assert not store.attach(KEY, trained)  # nothing saved yet
    store.request_done()  # the first request saves at once
    saved = learned_dir / f"{KEY.name}.json"
    first = saved.stat().st_mtime_ns
    trained.begin()
    trained.update(StepOutcome("none", 0, 0, (), 0, 0.1 * MS, 17 * MS))
    store.request_done()  # within SAVE_EVERY_S: not yet
    assert saved.stat().st_mtime_ns == first
    store.flush()  # close
    assert load_learned(KEY) == json.loads(json.dumps(trained.state()))

    fresh_policy = CostModelK(COSTS, k_max=8)
    assert LearnedStore().attach(KEY, fresh_policy)
    assert fresh_policy.state() == trained.state()
    ignoring = CostModelK(COSTS, k_max=8)
    assert not LearnedStore(fresh=True).attach(KEY, ignoring)
    assert ignoring.state() == CostModelK(COSTS, k_max=8).state()


def test_files_are_bounded(learned_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(learned, "MAX_FILES", 5)
    state = _trained().state()
    for i in range(9):
        save_learned(LearnedKey(f"p{i}", "c", ()), state)
        os.utime(learned.learned_path(LearnedKey(f"p{i}", "c", ())), (i, i))
    kept = sorted(p.name for p in learned_dir.glob("*.json"))
    assert len(kept) == 5
    assert learned.learned_path(LearnedKey("p8", "c", ())).name in kept


def test_an_unwritable_cache_costs_only_the_head_start(learned_dir: Path) -> None:
    learned_dir.parent.mkdir(parents=True, exist_ok=True)
    learned_dir.write_text("a file where the directory should be")
    assert save_learned(KEY, _trained().state()) is None
    assert load_learned(KEY) is None
