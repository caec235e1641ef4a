"""What a request constrains its answer to, validated from the shapes users send: OpenAI's
`response_format` (`text`, `json_object`, `json_schema`), a grammar (Lark, GBNF or a regular
expression), and OpenAI's `tools` and `tool_choice`. Every check here is pure Python and names
what is wrong (InvalidRequestError: a 400 in the server, exit 2 in the CLI); whether a schema or
grammar compiles is llguidance's to say (grammars.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from edge_spec.errors import InvalidRequestError

ConstraintKind = Literal["json_schema", "json_object", "regex", "lark", "gbnf"]
GRAMMAR_KINDS: tuple[str, ...] = ("lark", "gbnf", "regex")
MAX_SOURCE_CHARS = 200_000  # a schema's or grammar's text
MAX_TOOLS = 128
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
ANY_OBJECT = '{"type": "object"}'


@dataclass(frozen=True)
class Constraint:
    """A grammar the answer must match. source: the schema as JSON text (json_schema), or the
    grammar's own text."""

    kind: ConstraintKind
    source: str
    name: str = ""  # the schema's name (response_format.json_schema.name)
    # A schema keyword llguidance cannot enforce (uniqueItems, ...): refused when strict (as
    # OpenAI's strict mode refuses what it cannot hold to), else ignored with a warning, as
    # llama.cpp's schema converter ignores it.
    strict: bool = False

    @classmethod
    def json_schema(cls, schema: Any, name: str = "", strict: bool = False) -> Constraint:
        """A JSON schema given as a dict or as JSON text."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise InvalidRequestError(f"the JSON schema is not valid JSON: {exc}") from None
        if isinstance(schema, bool):  # JSON Schema allows true (anything) and false (nothing)
            schema = {} if schema else {"not": {}}
        if not isinstance(schema, dict):
            raise InvalidRequestError(
                f"a JSON schema must be an object, got {type(schema).__name__}"
            )
        # Key order kept: a schema's properties are written in the order it lists them.
        text = _bounded(json.dumps(closed(schema)), "JSON schema")
        return cls("json_schema", text, name, strict)

    @classmethod
    def grammar(cls, text: Any, kind: str = "lark") -> Constraint:
        """A Lark grammar (llguidance's dialect, `start:` rule first), a GBNF grammar
        (llama.cpp's, `root ::=`) or a regular expression the whole answer must match."""
        if kind not in GRAMMAR_KINDS:
            raise InvalidRequestError(
                f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {kind!r}"
            )
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequestError(f"the {kind} grammar must be a non-empty string")
        return cls(kind, _bounded(text, f"{kind} grammar"))  # type: ignore[arg-type]

    @classmethod
    def from_response_format(cls, value: Any) -> Constraint | None:
        """OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"} (any JSON
        object; llama-cpp-python's optional "schema" beside it is honoured), or {"type":
        "json_schema", "json_schema": {"name", "schema", "strict", "description"}}."""
        if value is None:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise InvalidRequestError("'response_format' must be an object with a 'type'")
        kind = value["type"]
        if kind == "text":
            _only(value, {"type"}, "response_format")
            return None
        if kind == "json_object":
            _only(value, {"type", "schema"}, "response_format")
            if value.get("schema") is not None:
                return cls.json_schema(value["schema"])
            return cls("json_object", ANY_OBJECT)
        if kind == "json_schema":
            _only(value, {"type", "json_schema"}, "response_format")
            spec = value.get("json_schema")
            if not isinstance(spec, dict):
                raise InvalidRequestError("'response_format.json_schema' must be an object")
            _only(spec, {"name", "schema", "strict", "description"}, "response_format.json_schema")
            name = spec.get("name", "")
            if not isinstance(name, str) or (name and not TOOL_NAME.match(name)):
                raise InvalidRequestError(
                    "'response_format.json_schema.name' must be 1-64 letters, digits, _ or -"
                )
            if "strict" in spec and not isinstance(spec["strict"], bool | None):
                raise InvalidRequestError("'response_format.json_schema.strict' must be a boolean")
            if "schema" not in spec:
                raise InvalidRequestError("'response_format.json_schema.schema' is required")
            return cls.json_schema(spec["schema"], name, strict=spec.get("strict") is True)
        raise InvalidRequestError(
            f"'response_format.type' must be text, json_object or json_schema, got {kind!r}"
        )


# An object with any of these is left open: it says what else it takes, or it combines with
# schemas whose fields additionalProperties (which sees only its siblings) would refuse.
_OPEN_KEYWORDS = ("additionalProperties", "unevaluatedProperties", "patternProperties")
_OPEN_KEYWORDS += ("allOf", "anyOf", "oneOf", "$ref", "dependentSchemas")
_SUBSCHEMA = ("items", "additionalItems", "contains", "not", "if", "then", "else")
_SUBSCHEMA += ("propertyNames", "unevaluatedItems")
_SUBSCHEMAS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "dependentSchemas")


def closed(schema: Any, close: bool = True) -> Any:
    """The schema with every object that lists its `properties` and says nothing of others
    closed to them (`additionalProperties: false`), as llama.cpp's schema converter reads a
    schema (and so llama-server, Ollama and llama-cpp-python) and OpenAI's strict mode asks:
    the answer holds the declared fields, where a small model would otherwise go on inventing
    more until max_tokens. `additionalProperties: true` (or a schema) keeps an object open.
    An object combined with other schemas (allOf, anyOf, oneOf, $ref beside its properties)
    stays open, and so do the members of an allOf: closing either would refuse the fields the
    others declare."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if close and "properties" in out and not any(k in out for k in _OPEN_KEYWORDS):
        out["additionalProperties"] = False
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), list):  # items as an array (the older prefixItems)
            out[key] = [closed(s) for s in out[key]]
        elif key in out:
            out[key] = closed(out[key])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = closed(out["additionalProperties"])
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed(s, close=False) for s in out["allOf"]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(s) for name, s in out[key].items()}
    return out


@dataclass(frozen=True)
class Tool:
    """One function a model may call: its name, description and parameters (a JSON schema of
    an object, as JSON text)."""

    name: str
    description: str
    parameters: str
    strict: bool = False  # refuse, not ignore, schema keywords llguidance cannot enforce

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": json.loads(self.parameters),
        }


ToolMode = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True)
class ToolChoice:
    """none: no call (plain text); auto: text or calls, the model's choice; required: at least
    one call; function: a call of that function."""

    mode: ToolMode = "auto"
    name: str | None = None


def parse_tools(value: Any) -> tuple[Tool, ...]:
    """OpenAI's tools: [{"type": "function", "function": {"name", "description", "parameters",
    "strict"}}, ...]; the bare function objects are taken too."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidRequestError("'tools' must be a list of tool definitions")
    if len(value) > MAX_TOOLS:
        raise InvalidRequestError(f"'tools' may hold at most {MAX_TOOLS} tools")
    tools: list[Tool] = []
    for i, item in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"'{where}' must be an object")
        if "function" in item or "type" in item:
            if item.get("type", "function") != "function":
                raise InvalidRequestError(f"'{where}.type' must be 'function'")
            _only(item, {"type", "function"}, where)
            item, where = item.get("function"), f"{where}.function"
            if not isinstance(item, dict):
                raise InvalidRequestError(f"'{where}' must be an object")
        _only(item, {"name", "description", "parameters", "strict"}, where)
        name = item.get("name")
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise InvalidRequestError(f"'{where}.name' must be 1-64 letters, digits, _ or -")
        if any(t.name == name for t in tools):
            raise InvalidRequestError(f"two tools are named {name!r}")
        description = item.get("description", "")
        if not isinstance(description, str):
            raise InvalidRequestError(f"'{where}.description' must be a string")
        parameters = item.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise InvalidRequestError(f"'{where}.parameters' must be a JSON schema object")
        if parameters.get("type", "object") != "object":
            raise InvalidRequestError(f"'{where}.parameters' must describe an object")
        strict = item.get("strict")
        if not isinstance(strict, bool | None):
            raise InvalidRequestError(f"'{where}.strict' must be a boolean")
        # As given: the prompt lists them so; the grammar closes them (tools.arguments_schema).
        text = _bounded(json.dumps(parameters), f"{where}.parameters")
        tools.append(Tool(name, description, text, strict is True))
    return tuple(tools)


def parse_tool_choice(value: Any, tools: tuple[Tool, ...]) -> ToolChoice:
    """OpenAI's tool_choice: "none", "auto" (the default), "required", or {"type": "function",
    "function": {"name": ...}}; a choice that needs tools needs some."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise InvalidRequestError(
                f"'tool_choice' must be none, auto, required or a function, got {value!r}"
            )
        choice = ToolChoice(value)  # type: ignore[arg-type]
    elif isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise InvalidRequestError("'tool_choice.function.name' must name a tool")
        if all(t.name != name for t in tools):
            raise InvalidRequestError(f"'tool_choice' names {name!r}, which is not in 'tools'")
        choice = ToolChoice("function", name)
    else:
        raise InvalidRequestError(
            "'tool_choice' must be none, auto, required or {'type': 'function', ...}"
        )
    if choice.mode in ("required", "function") and not tools:
        raise InvalidRequestError(f"'tool_choice' {choice.mode} needs 'tools'")
    return choice


def _bounded(text: str, what: str) -> str:
    if len(text) > MAX_SOURCE_CHARS:
        raise InvalidRequestError(f"the {what} is longer than {MAX_SOURCE_CHARS} characters")
    return text


def _only(raw: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise InvalidRequestError(f"'{where}' has unknown field(s): {', '.join(unknown)}")
