"""Tool calls in a model's own words: how each family writes a call and reads a tool's result,
the grammar that makes every call valid under its function's parameters, and the parser that
turns an answer back into OpenAI's tool_calls.

Two formats, both a JSON object `{"name": ..., "arguments": {...}}` between delimiters:
- "hermes", for ChatML models (SmolLM2, Qwen, Hermes): `<tool_call>\\n{...}\\n</tool_call>`, a
  tool's result as `<tool_response>\\n...\\n</tool_response>` in a user turn (Qwen's and
  Hermes' convention);
- "gemma", for Gemma: a fenced block ```tool_call\\n{...}\\n``` and results in ```tool_output
  blocks (Gemma's documented convention of fenced tool_code / tool_output blocks, with JSON in
  place of Python calls so that the arguments can be held to their schema).

A template that renders `tools` itself and writes Hermes-style calls is used as it is; other
templates get the tool list in the system message and the history rewritten into the format
(assistant tool_calls as call blocks, tool messages as result blocks).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edge_spec.constrain.grammars import JSON_OPTIONS
from edge_spec.constrain.spec import Tool, ToolMode, closed
from edge_spec.errors import InvalidRequestError


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def arguments_object(self) -> dict[str, Any]:
        """The arguments as an object (Anthropic's `input`, Ollama's `arguments`); {} where
        the text is not a JSON object."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class CallFormat:
    name: str
    begin: str  # opens a call (its first characters trigger the call grammar in auto mode)
    end: str
    result_begin: str
    result_end: str
    parallel: bool = True  # more than one call in an answer

    # ---- the grammar -------------------------------------------------------------------------

    def grammar(self, tools: Sequence[Tool], mode: ToolMode) -> str:
        """llguidance's Lark: in "auto" free text in which a call, once its opening is
        written, must be complete and valid; otherwise calls only (one, or one per line when
        parallel)."""
        if mode == "auto":
            from llguidance import StructTag

            tags = [
                StructTag(
                    trigger=self.begin,
                    begin=self._call_head(tool),
                    grammar=arguments_schema(tool),
                    end="}" + self.end,
                )
                for tool in tools
            ]
            return StructTag.to_grammar(tags, assume_special=False)
        calls = " | ".join(f"call_{i}" for i in range(len(tools)))
        lines = [
            "%llguidance {}",
            f"start: call ({json.dumps(chr(10))} call)*" if self.parallel else "start: call",
        ]
        lines.append(f"call: {calls}")
        for i, tool in enumerate(tools):
            schema = json.dumps(arguments_schema(tool))
            head, tail = json.dumps(self._call_head(tool)), json.dumps("}" + self.end)
            lines.append(f"call_{i}: {head} %json {schema} {tail}")
        return "\n".join(lines) + "\n"

    def _call_head(self, tool: Tool) -> str:
        return f'{self.begin}{{"name": {json.dumps(tool.name)}, "arguments": '

    # ---- reading an answer -------------------------------------------------------------------

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str | None, list[ToolCall]]:
        """(the text outside the calls, or None; the calls), for every complete call block whose
        JSON names a known tool with object arguments. A block that is not one stays text."""
        names = {t.name for t in tools}
        calls: list[ToolCall] = []
        kept: list[str] = []
        pattern = re.compile(re.escape(self.begin) + r"(.*?)" + re.escape(self.end), re.S)
        at = 0
        for match in pattern.finditer(text):
            call = _read_call(match.group(1), names)
            if call is None:
                continue
            kept.append(text[at : match.start()])
            at = match.end()
            calls.append(call)
        kept.append(text[at:])
        content = "".join(kept).strip()
        return (content or None) if calls else text, calls

    # ---- writing a history -------------------------------------------------------------------

    def system_text(self, tools: Sequence[Tool]) -> str:
        listing = "\n".join(json.dumps(t.to_dict()) for t in tools)
        example = f'{self.begin}{{"name": "<tool name>", "arguments": {{...}}}}{self.end}'
        return (
            "You can call these tools. To call one, answer with exactly\n"
            f"{example}\n"
            "and nothing else; its result comes back to you in a "
            f"{self.result_begin.strip()} block.\n"
            f"Tools:\n{listing}"
        )

    def rewrite(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool]
    ) -> list[dict[str, str]]:
        """The conversation as plain system/user/assistant turns of text: the tool list in
        the system message, assistant tool_calls as call blocks, consecutive tool results as
        one user turn of result blocks."""
        out: list[dict[str, str]] = []
        intro = self.system_text(tools) if tools else ""
        if intro:
            if messages and messages[0].get("role") == "system":
                first = str(messages[0].get("content") or "")
                out.append({"role": "system", "content": f"{first}\n\n{intro}".strip()})
                messages = messages[1:]
            else:
                out.append({"role": "system", "content": intro})
        for message in messages:
            role = message.get("role")
            if role == "tool":
                block = f"{self.result_begin}{_text(message.get('content'))}{self.result_end}"
                if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_tool": "1"})
                continue
            content = _text(message.get("content"))
            if role == "assistant" and message.get("tool_calls"):
                blocks = [self.render_call(call) for call in message["tool_calls"]]
                content = "\n".join([content, *blocks] if content else blocks)
            out.append({"role": str(role), "content": content})
        for item in out:
            item.pop("_tool", None)
        return out

    def render_call(self, call: Mapping[str, Any]) -> str:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = arguments
        body = {"name": function.get("name", ""), "arguments": parsed}
        return f"{self.begin}{json.dumps(body, ensure_ascii=False)}{self.end}"


HERMES = CallFormat(
    "hermes", "<tool_call>\n", "\n</tool_call>", "<tool_response>\n", "\n</tool_response>"
)
GEMMA = CallFormat("gemma", "```tool_call\n", "\n```", "```tool_output\n", "\n```")


def call_format(architecture: str, template_text: str) -> CallFormat:
    """The family's format: Gemma's for Gemma models, Hermes' otherwise."""
    if architecture.startswith("gemma") or "<start_of_turn>" in template_text:
        return GEMMA
    return HERMES


def renders_tools(template_text: str, call: CallFormat) -> bool:
    """Whether a chat template lists `tools` itself in this call format (Qwen and Hermes
    templates do): then messages go to it as they are."""
    return "tools" in template_text and call.begin.strip() in template_text


def arguments_schema(tool: Tool) -> dict[str, Any]:
    """The schema a call's arguments are held to: the tool's parameters with only the declared
    fields (additionalProperties false unless they say otherwise, nested objects too: OpenAI's
    strict mode asks for this, and a small model otherwise invents more), written the one way
    JSON_OPTIONS says. The prompt lists the parameters as the request gave them."""
    schema = closed({"additionalProperties": False, **json.loads(tool.parameters)})
    schema["x-guidance"] = {**JSON_OPTIONS, "lenient": not tool.strict}
    return schema


def _read_call(body: str, names: set[str]) -> ToolCall | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in names:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if not isinstance(arguments, dict):
        return None
    return ToolCall(
        "call_" + uuid.uuid4().hex[:24], data["name"], json.dumps(arguments, ensure_ascii=False)
    )


def _text(content: Any) -> str:
    """A message's content as text: a string, or OpenAI's list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidRequestError("only text content parts are supported")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise InvalidRequestError("message content must be a string or a list of text parts")
