"""Structured output: the shapes a request may send, the grammars llguidance compiles from them,
the decode loop's exactness under a grammar (scripted on the fake model; greedy on the real
pairs), tool calls in each family's format, and fuzzed schemas, grammars and tool definitions
that must end in one clear error or a grammar, never anything else."""

from __future__ import annotations

import json
import string

import numpy as np
import pytest
from fake_model import (
    N_VOCAB,
    FakeLlama,
    ScriptedConstraint,
    in_parallel,
    make_draft,
    make_target,
    n_chunks,
    runs_for,
    tv_bound,
    tv_bound_for,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_spec.constrain.spec import (
    Constraint,
    ToolChoice,
    parse_tool_choice,
    parse_tools,
)
from edge_spec.constrain.tools import GEMMA, HERMES, arguments_schema
from edge_spec.decode.engine import Step, run_steps
from edge_spec.drafts import ModelDraft, NgramDraft, NoDraft
from edge_spec.errors import InvalidRequestError
from edge_spec.policy.simple import FixedK
from edge_spec.sampling import SamplingParams
from edge_spec.server.responses import ContentGate

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}


# ---- the request shapes ----------------------------------------------------------------------


def test_response_formats_become_constraints_or_one_clear_error() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {}}}
    named = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    got = Constraint.from_response_format(named)
    assert got.kind == "json_schema" and got.name == "x"
    assert list(json.loads(got.source)["properties"]) == ["b", "a"]  # the schema's own order
    assert Constraint.from_response_format({"type": "text"}) is None
    assert Constraint.from_response_format({"type": "json_object"}).kind == "json_object"
    with_schema = {"type": "json_object", "schema": schema}  # llama-cpp-python's form
    assert Constraint.from_response_format(with_schema).kind == "json_schema"
    for bad in (
        "json",
        {"type": "xml"},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
        {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}},
        {"type": "json_schema", "json_schema": {"schema": 5}},
        {"type": "json_schema", "json_schema": {"schema": {}, "extra": 1}},
        {"type": "text", "schema": {}},
    ):
        with pytest.raises(InvalidRequestError):
            Constraint.from_response_format(bad)
    with pytest.raises(InvalidRequestError, match="grammar kind"):
        Constraint.grammar("x", "ebnf")
    with pytest.raises(InvalidRequestError, match="non-empty"):
        Constraint.grammar("  ", "lark")


def test_tools_and_tool_choice_are_checked_as_openai_defines_them() -> None:
    tools = parse_tools([WEATHER, {"name": "now", "description": "the time"}])
    assert [t.name for t in tools] == ["get_weather", "now"]
    assert "additionalProperties" not in json.loads(tools[0].parameters)  # listed as given
    assert arguments_schema(tools[0])["additionalProperties"] is False  # held to what it lists
    assert json.loads(tools[1].parameters)["properties"] == {}
    assert parse_tool_choice(None, tools) == ToolChoice("auto")
    assert parse_tool_choice(None, ()) == ToolChoice("none")
    named = {"type": "function", "function": {"name": "now"}}
    assert parse_tool_choice(named, tools) == ToolChoice("function", "now")
    for bad_tools in (
        "get_weather",
        [{"type": "retrieval"}],
        [{"name": "two words"}],
        [{"name": "x", "parameters": {"type": "array"}}],
        [{"name": "x"}, {"name": "x"}],
        [{"name": "x", "surprise": 1}],
        [{"name": "x"}] * 200,
    ):
        with pytest.raises(InvalidRequestError):
            parse_tools(bad_tools)
    for bad_choice, available in (
        ("sometimes", tools),
        ({"type": "function", "function": {"name": "nope"}}, tools),
        ("required", ()),
        (5, tools),
    ):
        with pytest.raises(InvalidRequestError):
            parse_tool_choice(bad_choice, available)


@pytest.mark.parametrize("fmt", [HERMES, GEMMA])
def test_calls_are_parsed_and_histories_rewritten_in_the_family_format(fmt) -> None:
    tools = parse_tools([WEATHER])
    call = fmt.render_call(
        {"function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}
    )
    content, calls = fmt.parse(f"Let me look.\n{call}", tools)
    assert content == "Let me look." and len(calls) == 1
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments)["city"] == "Paris"
    # A block that names no tool, or holds no JSON, stays text.
    junk = f"{fmt.begin}not json{fmt.end}"
    assert fmt.parse(junk, tools) == (junk, [])
    history = fmt.rewrite(
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [calls[0].to_dict()]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": "21 C"},
            {"role": "tool", "tool_call_id": "x", "content": "sunny"},
        ],
        tools,
    )
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
    assert "get_weather" in history[0]["content"] and fmt.begin.strip() in history[2]["content"]
    assert history[3]["content"].count(fmt.result_begin.strip()) == 2


def test_the_stream_holds_back_only_what_may_be_a_call() -> None:
    gate = ContentGate()
    sent = gate.feed("Let me check. <to") + gate.feed("ol_call>\n{...}")
    assert sent == "Let me check. " and gate.rest(made_calls=True) == ""
    plain = ContentGate()
    assert plain.feed("a <b> c <") == "a <b> c " and plain.rest(made_calls=False) == "<"


# ---- exactness under a grammar on the scripted fake model ------------------------------------


def _steps(source, target, prompt, constraint, sampling, k=3, max_tokens=12):
    sources = {"none": NoDraft()} if source is None else {"draft": source, "none": NoDraft()}
    names = {"draft": "model" if isinstance(source, ModelDraft) else "ngram"}
    sources = {names.get(k, k): v for k, v in sources.items()}
    policy = FixedK(k if source is not None else 0)
    return run_steps(
        target,
        sources,
        policy,
        prompt,
        k_max=k,
        max_tokens=max_tokens,
        sampling=sampling,
        constraint=constraint,
    )


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, seed=5)])
def test_under_a_grammar_every_draft_source_gives_the_constrained_targets_own_tokens(
    params: SamplingParams,
) -> None:
    """Greedy, and sampled with a seed: the same tokens with a model draft, with n-gram drafts
    and with no draft, each token allowed by the grammar; its forced text was drafted and some
    of it accepted."""
    target_model = make_target()
    n_forced = n_forced_accepted = 0
    for prompt in ([1, 2, 0, 1, 2, 0, 3], [4, 3, 1, 2, 0, 0], [0]):
        alone = FakeLlama(target_model)
        expected = [
            t
            for e in _steps(None, alone, prompt, ScriptedConstraint(prompt[-1]), params)
            if isinstance(e, Step)
            for t in e.tokens
        ]
        state = prompt[-1]
        for token in expected:  # every token the grammar allows
            assert token in ScriptedConstraint.RULES[state]
            state = token
        for make in (
            lambda: ModelDraft(FakeLlama(make_draft(target_model))),
            lambda: NgramDraft(max_ngram=2),
        ):
            got = []
            for event in _steps(
                make(), FakeLlama(target_model), prompt, ScriptedConstraint(prompt[-1]), params
            ):
                if isinstance(event, Step):
                    got.extend(event.tokens)
                    n_forced += event.n_forced
                    n_forced_accepted += event.n_forced_accepted
            assert got == expected
    assert n_forced > 0 and 0 < n_forced_accepted <= n_forced


# The engine-level distribution tests check the plumbing around verification (keys,
# positions, trees, heads, sources) at 20,000 runs: a TV bound near 0.035 on 25 cells;
# test_verify.py holds verification itself to 50,000 runs (bound near 0.022).
N_RUNS = 20_000


@pytest.mark.parametrize("source", ["model", "ngram"])
def test_sampled_output_under_a_grammar_follows_the_masked_target(source: str) -> None:
    """The first two tokens of many generations against the exact joint distribution of the
    target masked by the grammar (then the sampling transform), as fake_model.tv_bound allows."""
    params = SamplingParams(temperature=0.8, top_k=4, seed=21)
    prompt = [3, 4, 3, 4, 3]
    target_model = make_target()
    checker = ScriptedConstraint(prompt[-1])
    p_first = checker.masked_probs(target_model, prompt, params)
    exact = np.concatenate(
        [
            p_first[x] * checker.masked_probs(target_model, [*prompt, x], params)
            for x in range(N_VOCAB)
        ]
    )
    bound = tv_bound(N_RUNS, N_VOCAB**2)
    n_runs = runs_for(exact, bound, N_RUNS)
    seeds = np.random.default_rng(params.seed).integers(0, 2**62, size=n_runs)
    parts = in_parallel(
        _constrained_cells, [(source, params, prompt, s) for s in np.array_split(seeds, n_chunks())]
    )
    cells = np.concatenate([c for c, _ in parts])
    assert sum(d for _, d in parts) > n_runs // 4  # drafts were really verified
    empirical = np.bincount(cells, minlength=N_VOCAB**2) / n_runs
    tv = 0.5 * float(np.abs(empirical - exact).sum())
    assert tv < tv_bound_for(n_runs, exact) <= bound, tv


def _constrained_cells(source: str, params: SamplingParams, prompt: list[int], seeds):
    target_model = make_target()
    target = FakeLlama(target_model)
    draft = (
        ModelDraft(FakeLlama(make_draft(target_model)))
        if source == "model"
        else NgramDraft(max_ngram=2)
    )
    cells = np.empty(len(seeds), dtype=np.int64)
    n_drafted = 0
    for run, seed in enumerate(seeds):
        sampling = SamplingParams(params.temperature, params.top_k, seed=int(seed))
        out: list[int] = []
        for event in _steps(draft, target, prompt, ScriptedConstraint(prompt[-1]), sampling, 3, 2):
            if isinstance(event, Step):
                out.extend(event.tokens)
                n_drafted += event.n_drafted
        cells[run] = out[0] * N_VOCAB + out[1]
    return cells, n_drafted


# ---- compiling: fuzzed schemas, grammars and tools -------------------------------------------

SCHEMA_KEYS = [
    "type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "allOf",
    "$ref", "$defs", "minimum", "maxLength", "pattern", "additionalProperties", "format",
    "minItems", "not", "prefixItems", "x",
]  # fmt: skip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(string.ascii_letters, max_size=6),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(SCHEMA_KEYS), children, max_size=5)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="session")
def tokenizer(smollm2_path):
    from edge_spec.backend import LlamaModel
    from edge_spec.backend.grammar_vocab import grammar_tokenizer

    with LlamaModel(smollm2_path, n_ctx=64) as model:
        yield grammar_tokenizer(model)


@pytest.mark.models
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=json_values)
def test_fuzzed_schemas_compile_or_are_refused_with_one_error(tokenizer, schema) -> None:
    from edge_spec.constrain.grammars import compile_grammar
    from edge_spec.constrain.matcher import GrammarConstraint

    try:
        grammar = compile_grammar(Constraint.json_schema(schema), tokenizer)
    except InvalidRequestError as exc:
        assert str(exc)
        return
    GrammarConstraint(grammar, tokenizer).forced(8)  # a compiled grammar runs


@pytest.mark.models
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=st.text(alphabet=string.printable, max_size=80),
    kind=st.sampled_from(["lark", "gbnf", "regex"]),
)
def test_fuzzed_grammars_compile_or_are_refused_with_one_error(tokenizer, text, kind) -> None:
    from edge_spec.constrain.grammars import compile_grammar

    prefix = {"lark": "start: ", "gbnf": "root ::= ", "regex": ""}[kind]
    for source in (text, prefix + text):
        try:
            compile_grammar(Constraint.grammar(source, kind), tokenizer)
        except InvalidRequestError as exc:
            assert str(exc)


@pytest.mark.models
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(tools=json_values, choice=json_values)
def test_fuzzed_tool_definitions_are_taken_or_refused_with_one_error(
    tokenizer, tools, choice
) -> None:
    from edge_spec.constrain.grammars import tool_grammar

    candidates = [tools, [tools], [{"type": "function", "function": tools}]]
    for value in candidates:
        try:
            parsed = parse_tools(value)
            picked = parse_tool_choice(choice if choice is not None else None, parsed)
            tool_grammar(parsed, picked, HERMES, tokenizer)
        except InvalidRequestError as exc:
            assert str(exc)


@pytest.mark.models
def test_a_keyword_llguidance_cannot_enforce_is_ignored_unless_strict(tokenizer, caplog) -> None:
    """A schema from pydantic's set[str] (uniqueItems) works as in llama.cpp, the keyword
    ignored with a warning; strict (OpenAI's response_format or a tool's) refuses it."""
    from edge_spec.constrain.grammars import compile_grammar, tool_grammar

    tags = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    schema = {"type": "object", "properties": {"tags": tags}, "required": ["tags"]}
    for strict in (False, True):
        fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
        fmt["json_schema"]["strict"] = strict
        constraint = Constraint.from_response_format(fmt)
        assert constraint is not None and constraint.strict is strict
        tool = {"name": "tag", "parameters": schema, "strict": strict}
        tools = parse_tools([tool])
        if strict:
            with pytest.raises(InvalidRequestError, match="uniqueItems"):
                compile_grammar(constraint, tokenizer)
            with pytest.raises(InvalidRequestError, match="uniqueItems"):
                tool_grammar(tools, ToolChoice("required"), HERMES, tokenizer)
        else:
            with caplog.at_level("WARNING", logger="edge_spec.constrain.grammars"):
                assert compile_grammar(constraint, tokenizer)
            assert "uniqueItems" in caplog.text
            assert tool_grammar(tools, ToolChoice("required"), HERMES, tokenizer)


@pytest.mark.models
def test_a_pathological_schema_is_refused_within_the_parser_limits(tokenizer) -> None:
    from edge_spec.constrain.grammars import compile_grammar

    # A regex whose automaton explodes, and a deeply nested schema.
    nasty = {"type": "string", "pattern": "(a|b)*a(a|b){40}"}
    deep: dict = {"type": "string"}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    for schema in (nasty, deep):
        try:
            compile_grammar(Constraint.json_schema(schema), tokenizer)
        except InvalidRequestError as exc:
            assert str(exc)


# ---- the real pairs: greedy structured answers are the constrained target's own ------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Lyon", "Porto", "Lagos", "Krakow"]},
        "role": {"type": "string"},
    },
    "required": ["name", "age", "city", "role"],
    "additionalProperties": False,
}
CARD = "Bruno Costa is 28, lives in Porto and works as a designer."


def _structured_cases(chat: bool) -> list[tuple[str, dict]]:
    """(a prompt or a chat message, the request's structured options)."""

    def ask(text: str) -> str:
        return text if chat else f"{text}\nAnswer:"

    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    date = Constraint.grammar(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "regex")
    cases = [
        (ask(f"Extract the person as JSON: {CARD}"), {"response_format": schema}),
        (
            ask(f"Describe this person as a JSON object: {CARD}"),
            {"response_format": {"type": "json_object"}},
        ),
        (ask("When did the Berlin Wall fall? Give the date as YYYY-MM-DD."), {"grammar": date}),
    ]
    if chat:
        # One call (a 135M model repeats a call while parallel calls are allowed).
        required = {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}
        cases.append(("What is the weather in Lyon, in celsius?", required))
        cases.append(("What is the weather in Porto?", {"tools": [WEATHER]}))
    return cases


@pytest.mark.models
@pytest.mark.parametrize("chat", [True, False], ids=["chat-pair", "default-pair"])
def test_greedy_structured_answers_equal_the_constrained_target_alone(chat: bool) -> None:
    """Every draft mode answers exactly as the constrained target alone, and each answer is
    valid under its schema, grammar or tool's parameters; the grammar's forced text is drafted
    and accepted."""
    import re

    import jsonschema

    from edge_spec import EdgeSpec, EngineConfig
    from edge_spec.models import default_pair

    target, draft = default_pair(chat=chat)
    forced = 0
    with EdgeSpec(target, draft, config=EngineConfig(n_ctx=1024)) as spec:
        for text, options in _structured_cases(chat):
            tools = parse_tools(options.get("tools"))
            message = [{"role": "user", "content": text}]
            prompt = spec.render_chat(message, tools) if chat else text
            alone = spec.generate(prompt, max_tokens=64, draft_mode="none", **options)
            for mode in ("auto", "ngram", "model"):
                got = spec.generate(prompt, max_tokens=64, draft_mode=mode, **options)
                assert got.token_ids == alone.token_ids, (text[:40], mode)
                forced += got.stats.accepted_by_source.get("grammar", 0)
            if "response_format" in options and alone.constraint_complete:
                value = json.loads(alone.text)
                if options["response_format"]["type"] == "json_schema":
                    jsonschema.validate(value, PERSON)
                assert isinstance(value, dict)
            elif "grammar" in options and alone.constraint_complete:
                assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", alone.text)
            elif options.get("tool_choice") == "required":
                assert alone.finish_reason == "tool_calls" and alone.tool_calls
                for call in alone.tool_calls:
                    params = WEATHER["function"]["parameters"]
                    jsonschema.validate(json.loads(call.arguments), params)
                # Cut one token short, the answer holds no whole call: OpenAI's "length".
                short = len(alone.token_ids) - 1
                cut = spec.generate(prompt, max_tokens=short, draft_mode="none", **options)
                assert cut.finish_reason == "length" and cut.constraint_complete is False
    assert forced > 0
