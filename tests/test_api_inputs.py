"""The API's inputs, fuzzed: any value for any generation option, and any message list, is
accepted or refused with the project's InvalidRequestError -- never another exception."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_spec.api import GenerationConfig
from edge_spec.errors import EdgeSpecError
from edge_spec.models.templates import BUILTIN_TEMPLATES, render_chat
from edge_spec.sampling.transform import SamplingParams

_TEXT = st.text(max_size=30)  # any code point: controls, NUL, lone surrogates
_ANY = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**80), max_value=2**80),
        st.floats(allow_nan=True, allow_infinity=True),
        _TEXT,
        st.binary(max_size=10),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3), st.tuples(inner)
    ),
    max_leaves=8,
)
OPTIONS = sorted(
    {f.name for f in fields(GenerationConfig)} | {f.name for f in fields(SamplingParams)}
)


@settings(
    max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(options=st.dictionaries(st.sampled_from(OPTIONS), _ANY, max_size=4))
def test_any_generation_option_is_accepted_or_refused_cleanly(options: dict[str, Any]) -> None:
    try:
        GenerationConfig.from_kwargs(**options)
    except EdgeSpecError:
        pass


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(
    messages=st.one_of(
        _ANY,
        st.lists(
            st.dictionaries(st.sampled_from(["role", "content", "name"]), _ANY, max_size=3),
            max_size=4,
        ),
        st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _TEXT}
            ),
            min_size=1,
            max_size=4,
        ),
    ),
    template=st.sampled_from(sorted(BUILTIN_TEMPLATES)),
)
def test_any_message_list_renders_or_is_refused_cleanly(messages: Any, template: str) -> None:
    try:
        text = render_chat(BUILTIN_TEMPLATES[template], messages, bos_token="", eos_token="")
    except EdgeSpecError:
        return
    assert isinstance(text, str)
