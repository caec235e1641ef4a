"""The agentic bench's sessions (package data) and its turn-by-turn runner on the real pair."""

from __future__ import annotations

import copy
import json
from importlib import resources

import pytest

from edge_spec.bench.agentic import SCENARIOS, load_sessions, parse_sessions, run_agentic
from edge_spec.bench.runner import parse_strategy


def raw_sessions() -> dict:
    text = resources.files("edge_spec.bench").joinpath("agentic.json").read_text("utf-8")
    return json.loads(text)


def test_the_sessions_cover_every_scenario_and_quote_long_inputs() -> None:
    sessions = load_sessions()
    assert {s.scenario for s in sessions} == set(SCENARIOS)
    assert all(len(s.turns) >= 2 for s in sessions)
    # A coding agent re-emits files it has read: the first turn holds a whole file.
    coding = [s for s in sessions if s.scenario == "coding_agent"]
    assert all(s.turns[0][-1]["content"].count("\n") >= 15 for s in coding)
    assert [s.id for s in load_sessions(["agent-rag-06"])] == ["agent-rag-06"]
    with pytest.raises(ValueError, match="unknown"):
        load_sessions(["no-such-session"])


@pytest.mark.parametrize(
    "break_it",
    [
        lambda raw: raw.update(version=2),
        lambda raw: raw["sessions"][1].update(id=raw["sessions"][0]["id"]),
        lambda raw: raw["sessions"][0].update(scenario="chit-chat"),
        lambda raw: raw["sessions"][0]["turns"][0].append({"role": "assistant", "content": "x"}),
        lambda raw: raw["sessions"][0]["turns"][0].insert(0, {"role": "user", "content": "x"}),
        lambda raw: raw["sessions"][0]["turns"][0][0].update(content=""),
        lambda raw: raw["sessions"][0].update(turns=[]),
    ],
)
def test_malformed_sessions_are_refused(break_it) -> None:
    raw = copy.deepcopy(raw_sessions())
    break_it(raw)
    with pytest.raises(ValueError, match="agentic.json"):
        parse_sessions(raw)


@pytest.mark.models
def test_every_entry_answers_the_same_requests_with_the_targets_history(spec) -> None:
    session = load_sessions(["agent-config-03"])[0]
    strategies = [parse_strategy("ngram")]
    runs = run_agentic(spec, [session], strategies, max_tokens=24)
    assert len(runs) == len(session.turns) * 3  # the target alone, again (the floor), ngram
    by_turn: dict[str, dict[str, object]] = {}
    for run in runs:
        by_turn.setdefault(run.prompt_id, {})[run.strategy] = run
    assert sorted(by_turn) == ["agent-config-03/1", "agent-config-03/2"]
    first, second = (by_turn[f"agent-config-03/{t}"] for t in (1, 2))
    for turn in (first, second):
        # The same request for every entry, and at T = 0 the same answer.
        assert turn["target"].n_prompt_tokens == turn["ngram"].n_prompt_tokens
        assert turn["target"].token_ids == turn["ngram"].token_ids
        assert turn["target"].category == "coding_agent" and turn["target"].kind == "agentic"
    # The second request holds the first one and the target's answer to it.
    answer = spec.target.detokenize(list(first["target"].token_ids)).strip()
    assert second["target"].n_prompt_tokens > first["target"].n_prompt_tokens + 5
    text = spec.render_chat(
        [
            {"role": "system", "content": session.system},
            *session.turns[0],
            {"role": "assistant", "content": answer},
            *session.turns[1],
        ]
    )
    assert len(spec.tokenize(text)) == second["target"].n_prompt_tokens


@pytest.mark.models
def test_llama_cpp_pythons_prompt_lookup_takes_requests_longer_than_a_batch(target_path) -> None:
    """llama-cpp-python sizes its logits buffer from logits_all, not from the draft model that
    needs it: without the peer's fix, a request past n_batch (512) tokens failed to broadcast.
    Agentic requests are that long."""
    from edge_spec.backend import PromptLookupPeer

    peer = PromptLookupPeer(target_path, n_ctx=1024, n_threads=2)
    try:
        prompt = list(range(10, 20)) * 60  # 600 tokens that repeat: the lookup drafts
        out = peer.generate(prompt, max_tokens=8)
        assert len(out.token_ids) <= 8 and out.finish_reason in ("eos", "length")
    finally:
        peer.close()


@pytest.mark.models
def test_llama_cpp_pythons_prompt_lookup_keeps_a_conversations_prefix(target_path) -> None:
    """As its own server answers a conversation (scripts/measure_server_agentic.py, in git
    history): the next
    request reuses the longest prefix the Llama still holds and evaluates only the rest, and
    answers as it does from scratch."""
    from edge_spec.backend import PromptLookupPeer

    peer = PromptLookupPeer(target_path, n_ctx=1024, n_threads=2, num_pred_tokens=4)
    try:
        first = list(range(10, 20)) * 20
        answer = peer.generate(first, max_tokens=16, keep_prefix=True).token_ids
        second = [*first, *answer, *range(30, 60)]  # the history, the answer, a new turn
        kept = peer.generate(second, max_tokens=16, keep_prefix=True)
        fresh = peer.generate(second, max_tokens=16)
        assert kept.token_ids == fresh.token_ids and len(kept.token_ids) > 0
        assert peer.detokenize(kept.token_ids) == peer.detokenize(fresh.token_ids)
    finally:
        peer.close()
