"""OpenAI's Responses API (POST /v1/responses), the one OpenAI's newer clients and agent SDKs
speak: its request becomes a chat request (instructions and input items as messages, function
tools, text.format as response_format) checked by schemas.parse_chat, and the answer goes back
as a `response` object, or as its stream of typed events.

Nothing is stored here: `store` is accepted (clients send it) but a later request cannot refer
to an earlier response (`previous_response_id`, `conversation` and item references are
refused with 400); a client sends the whole conversation each time, as with chat completions.
"""

from edge_spec.server.responses_api.answer import ResponseEvents, ResponseShape
from edge_spec.server.responses_api.request import ResponseEcho, parse_responses

__all__ = ["ResponseEcho", "ResponseEvents", "ResponseShape", "parse_responses"]
