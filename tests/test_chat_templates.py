"""Chat templates are untrusted code from the model file: rendered in Jinja's immutable sandbox
within a work, time and output bound. Known template-injection and runaway payloads end in one
InvalidRequestError, quickly; the built-in and real templates still render."""

from __future__ import annotations

import time

import pytest

from edge_spec.errors import InvalidRequestError
from edge_spec.models.templates import BUILTIN_TEMPLATES, RENDER_SECONDS, render_chat

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

RUNAWAY = {
    "nested ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}",
    "string product": "{{ 'x' * 10000000000 }}",
    "list product loop": "{% for m in messages * 100000000 %}{{ m.role }}{% endfor %}",
    "power": "{{ 10 ** 10000000 }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "output flood": "{% for i in range(900000) %}{{ 'abcdefghij' }}{% endfor %}",
    "joined range": "{{ range(100000) | join(',') * 1000 }}",
}
INJECTION = {
    "class walk": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "self": "{{ self._TemplateReference__context }}",
    "mutation": "{% set x = messages.append({'role': 'user', 'content': 'x'}) %}{{ x }}",
    "format string": "{{ '{0.__class__}'.format(messages) }}",
}


@pytest.mark.parametrize("name", sorted(RUNAWAY))
def test_a_runaway_template_is_stopped_within_its_bound(name: str) -> None:
    started = time.perf_counter()
    with pytest.raises(InvalidRequestError, match="chat template failed to render"):
        render_chat(RUNAWAY[name], MESSAGES, **TOKENS)
    assert time.perf_counter() - started < RENDER_SECONDS + 3.0


@pytest.mark.parametrize("name", sorted(INJECTION))
def test_template_injection_reaches_nothing(name: str) -> None:
    """Refused, or rendered as nothing: no class, global, context or mutation gets through."""
    try:
        text = render_chat(INJECTION[name], MESSAGES, **TOKENS)
    except InvalidRequestError:
        return
    assert text.strip() in ("", "None"), text
    assert len(MESSAGES) == 2


@pytest.mark.parametrize("name", sorted(BUILTIN_TEMPLATES))
def test_the_built_in_templates_still_render(name: str) -> None:
    text = render_chat(BUILTIN_TEMPLATES[name], MESSAGES, **TOKENS)
    assert "Be brief." in text and "Hi!" in text


def test_loops_and_ranges_of_a_real_template_still_work() -> None:
    """The constructs real templates use: range over the messages, loop.last, namespaces,
    string slicing and multiplication of a short separator."""
    template = (
        "{% set ns = namespace(n=0) %}"
        "{% for i in range(messages | length) %}{% set ns.n = ns.n + 1 %}"
        "{{ messages[i]['role'] }}:{{ messages[i]['content'][:40] }}"
        "{% if not loop.last %}{{ '-' * 3 }}{% endif %}{% endfor %}|{{ ns.n }}"
    )
    assert render_chat(template, MESSAGES, **TOKENS) == "system:Be brief.---user:Hi!|2"


def test_a_developer_message_renders_as_the_system_message() -> None:
    developer = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    for template in BUILTIN_TEMPLATES.values():
        assert render_chat(template, developer, **TOKENS) == render_chat(
            template, MESSAGES, **TOKENS
        )
