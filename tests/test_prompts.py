"""The benchmark prompt sets: shape, limits, and that input-reusing prompts really reuse input."""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from statistics import mean

import pytest

from edge_spec.prompts import Prompt, categories, load_prompts, parse_prompts

CATEGORY_NAMES = {
    "multi_turn_chat",
    "code_generation",
    "code_editing",
    "summarization",
    "extraction_qa",
    "math_reasoning",
}
# ~350 tokens: the CPU benchmark must stay short.
MAX_CHARS = 1400


def _raw() -> dict:
    text = (
        resources.files("edge_spec")
        .joinpath("prompt_sets", "bench.json")
        .read_text(encoding="utf-8")
    )
    return json.loads(text)


def _trigrams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+|[^\w\s]", text.lower())
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


def _reuse(reference: str, source: str) -> float:
    """Fraction of the reference's word trigrams that occur in the source."""
    ref = _trigrams(reference)
    return len(ref & _trigrams(source)) / len(ref)


def _line_reuse(reference: str, source: str) -> float:
    """Fraction of the reference's non-blank lines (stripped) that occur as lines in the source."""
    ref = [line.strip() for line in reference.splitlines() if line.strip()]
    src = {line.strip() for line in source.splitlines()}
    return sum(line in src for line in ref) / len(ref)


def _chat_text(prompt: Prompt) -> str:
    return "\n".join(m["content"] for m in prompt.messages)


def test_six_categories_with_kinds() -> None:
    kinds = categories()
    assert set(kinds) == CATEGORY_NAMES
    assert {kinds[c] for c in ("code_generation", "math_reasoning")} == {"generative"}
    assert all(
        kinds[c] == "input_reusing" for c in CATEGORY_NAMES - {"code_generation", "math_reasoning"}
    )


def test_at_least_eight_prompts_and_exactly_two_quick_per_category() -> None:
    prompts = load_prompts()
    quick = load_prompts(quick=True)
    for name in CATEGORY_NAMES:
        assert sum(p.category == name for p in prompts) >= 8, name
        assert sum(p.category == name for p in quick) == 2, name
    assert all(p.quick for p in quick)
    assert all(p.kind == categories()[p.category] for p in prompts)


def test_ids_unique_and_category_filter() -> None:
    prompts = load_prompts()
    assert len({p.id for p in prompts}) == len(prompts)
    math = load_prompts(categories=["math_reasoning"])
    assert math and {p.category for p in math} == {"math_reasoning"}
    assert len(load_prompts(quick=True, categories=["code_editing", "summarization"])) == 4
    with pytest.raises(ValueError, match="unknown prompt categories"):
        load_prompts(categories=["poetry"])


def test_both_forms_well_formed_and_short() -> None:
    for p in load_prompts():
        assert p.completion.strip() and not p.completion.endswith(" "), p.id
        assert len(p.completion) <= MAX_CHARS, p.id
        assert len(_chat_text(p)) <= MAX_CHARS, p.id
        roles = [m["role"] for m in p.messages]
        assert set(roles) <= {"system", "user", "assistant"}, p.id
        assert roles[-1] == "user", p.id
        turns = [r for r in roles if r != "system"]
        assert all(a != b for a, b in zip(turns, turns[1:])), f"{p.id}: roles must alternate"
        assert p.reference.strip(), p.id


def test_multi_turn_chats_have_several_turns_in_both_forms() -> None:
    for p in load_prompts(categories=["multi_turn_chat"]):
        assert sum(m["role"] == "user" for m in p.messages) >= 2, p.id
        # The transcript ends in the assistant's turn (after a short neutral lead-in).
        last_user = p.completion.rindex("\nUser: ")
        assert p.completion.count("\nUser: ") >= 2, p.id
        assert "\nAssistant:" in p.completion[last_user:], p.id


def test_code_editing_rewrite_mostly_repeats_the_original() -> None:
    for p in load_prompts(categories=["code_editing"]):
        for source in (p.completion, _chat_text(p)):
            assert _line_reuse(p.reference, source) >= 0.6, p.id


def test_input_reusing_answers_reuse_the_prompt_text() -> None:
    # Thresholds per category: extraction answers quote spans; summaries and chat edits mostly
    # copy phrases from the input.
    floor = {
        "multi_turn_chat": 0.6,
        "summarization": 0.5,
        "extraction_qa": 0.8,
        "code_editing": 0.6,
    }
    for p in load_prompts():
        if p.kind != "input_reusing":
            continue
        for source in (p.completion, _chat_text(p)):
            assert _reuse(p.reference, source) >= floor[p.category], p.id


def test_generative_answers_reuse_less_than_input_reusing_ones() -> None:
    prompts = load_prompts()
    by_kind = {
        kind: mean(_reuse(p.reference, p.completion) for p in prompts if p.kind == kind)
        for kind in ("input_reusing", "generative")
    }
    assert by_kind["input_reusing"] > by_kind["generative"] + 0.3, by_kind


def test_completion_forms_end_where_the_model_continues() -> None:
    endings = {
        "summarization": "\n1.",
        "extraction_qa": "\nAnswer:",
        "math_reasoning": "\nSolution:",
    }
    for p in load_prompts():
        if p.category in endings:
            assert p.completion.endswith(endings[p.category]), p.id
        elif p.category == "code_editing":
            assert "\nOriginal:\n" in p.completion, p.id
            assert p.completion.endswith(("```python\n", "```javascript\n")), p.id
        else:  # code generation and the chat lead-in end on a fresh line
            assert p.completion.endswith("\n"), p.id


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda raw: raw["prompts"].append(copy.deepcopy(raw["prompts"][0])), "duplicate id"),
        (lambda raw: raw["prompts"][0].update(category="poetry"), "unknown category"),
        (lambda raw: raw["prompts"][0].update(completion="  "), "empty completion"),
        (lambda raw: raw["prompts"][0]["messages"].pop(), "end with a user turn"),
        (lambda raw: raw["prompts"][0]["messages"][0].update(role="bot"), "bad message"),
        (lambda raw: raw["categories"]["math_reasoning"].update(kind="other"), "unknown kind"),
        (lambda raw: raw.update(version=2), "version 1"),
    ],
)
def test_malformed_files_raise_value_error(mutate, message: str) -> None:
    raw = _raw()
    parse_prompts(raw)  # the real file is valid
    mutate(raw)
    with pytest.raises(ValueError, match=message):
        parse_prompts(raw)


def test_the_copy_sets_load_in_both_forms() -> None:
    """The copy prompts (`edge-spec bench --prompt-set copy|copy-2`): answers that re-emit what
    the prompt holds, a chat message and a document for a base model each."""
    for name in ("copy", "copy-2"):
        prompts = load_prompts(prompt_set=name)
        assert len(prompts) == 10 and {p.kind for p in prompts} == {"input_reusing"}
        assert all(p.messages[-1]["role"] == "user" and p.completion for p in prompts)
        assert len(load_prompts(quick=True, prompt_set=name)) == 3
    with pytest.raises(ValueError, match="unknown prompt set"):
        load_prompts(prompt_set="nope")


def test_a_prompt_set_of_ones_own_loads_from_a_json_file(tmp_path) -> None:
    """`--prompt-set FILE.json`: any set in the package's format, checked the same way."""
    raw = json.loads(
        resources.files("edge_spec").joinpath("prompt_sets", "copy.json").read_text("utf-8")
    )
    raw["prompts"] = raw["prompts"][:3]
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(raw), encoding="utf-8")
    loaded = load_prompts(prompt_set=str(mine))
    assert [p.id for p in loaded] == [p["id"] for p in raw["prompts"]]
    assert categories(str(mine)) == {"copy": "input_reusing"}
    with pytest.raises(ValueError, match="cannot read prompt set"):
        load_prompts(prompt_set=str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="not JSON"):
        load_prompts(prompt_set=str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="unknown prompt set"):
        load_prompts(prompt_set="nonesuch")
