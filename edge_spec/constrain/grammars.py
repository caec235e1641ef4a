"""Constraints compiled by llguidance, the engine llama.cpp and vLLM use. Chosen over XGrammar
by measured mask cost (bench/results/issue35-structured/mask-cost: 6-12 us median per token on both
registry vocabularies, against XGrammar's 7-13 on SmolLM2 and 49-58 on Gemma-3's 262,144
tokens), its forced-token API, and one wheel where XGrammar needs torch. A grammar is compiled
and checked against the target's tokenizer once and kept (an LRU of compiled grammars), under
parser limits that bound what a pathological schema or grammar can cost."""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any

from edge_spec.constrain.spec import Constraint, Tool, ToolChoice
from edge_spec.errors import InvalidRequestError

# JSON as people and models write it: `{"name": "Alice", "age": 34}` (a space after ':' and
# ','), one way only, so the punctuation between values is forced text the grammar drafts.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 64

log = logging.getLogger(__name__)


def limits() -> Any:
    """llguidance's parser limits, a little below its defaults: a grammar that needs more to
    compile or to compute one token's mask is refused (compile) or ends the request with an
    error instead of stalling the engine."""
    from llguidance import LLParserLimits

    return LLParserLimits(
        initial_lexer_fuel=500_000,  # ~10 ms of regex analysis at compile time
        step_lexer_fuel=200_000,  # ~15 ms per token at most
        step_max_items=50_000,
        max_grammar_size=200_000,
        verbose_errors=False,  # errors name the problem, not the parser's internal state
    )


_cache: OrderedDict[tuple[int, Any], str] = OrderedDict()
_cache_lock = threading.Lock()


def compile_grammar(constraint: Constraint, tokenizer: Any) -> str:
    """The llguidance grammar of a constraint, checked against the tokenizer. Raises
    InvalidRequestError naming what is wrong with a schema or grammar."""
    key = (id(tokenizer), constraint)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    grammar = _checked(_grammar_text(constraint), tokenizer, _describe(constraint))
    _remember(key, grammar)
    return grammar


def tool_grammar(
    tools: tuple[Tool, ...], choice: ToolChoice, call_format: Any, tokenizer: Any
) -> str | None:
    """The grammar of an answer under tool_choice: None for "none" (free text); for "auto",
    free text in which a call, once begun, must be a valid one; for "required" or a named
    function, one call or more (call_format.parallel) and nothing else."""
    if choice.mode == "none" or not tools:
        return None
    key = (id(tokenizer), tools, choice, call_format)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    wanted = (
        tools if choice.mode != "function" else tuple(t for t in tools if t.name == choice.name)
    )
    grammar = _checked(call_format.grammar(wanted, choice.mode), tokenizer, "tools")
    _remember(key, grammar)
    return grammar


def _grammar_text(constraint: Constraint) -> str:
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        if constraint.kind in ("json_schema", "json_object"):
            return LLMatcher.grammar_from_json_schema(
                json.loads(constraint.source),
                defaults={**JSON_OPTIONS, "lenient": not constraint.strict},
            )
        if constraint.kind == "regex":
            return LLMatcher.grammar_from_regex(constraint.source)
        text = gbnf_to_lark(constraint.source) if constraint.kind == "gbnf" else constraint.source
        return LLMatcher.grammar_from_lark(text)
    except Exception as exc:  # the converters' errors on user input: one clear 400
        raise InvalidRequestError(f"invalid {_describe(constraint)}: {_short(exc)}") from None


def _checked(grammar: str, tokenizer: Any, what: str) -> str:
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(
        grammar, tokenizer, limits=limits()
    )
    if is_error:
        raise InvalidRequestError(f"invalid {what}: {_short(messages[0] if messages else '?')}")
    for message in messages:  # e.g. a keyword it cannot enforce, ignored (not strict)
        log.warning("%s: %s", what, _short(message))
    return grammar


def _remember(key: tuple[int, Any], grammar: str) -> None:
    with _cache_lock:
        _cache[key] = grammar
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)


def _describe(constraint: Constraint) -> str:
    return {
        "json_schema": "JSON schema",
        "json_object": "JSON object",
        "regex": "regular expression",
        "lark": "Lark grammar",
        "gbnf": "GBNF grammar",
    }[constraint.kind]


def _short(message: object, limit: int = 300) -> str:
    text = " ".join(str(message).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
