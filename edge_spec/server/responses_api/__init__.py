"""OpenAI's Responses API (POST /v1/responses), the one OpenAI's newer clients and agent SDKs
speak: its request becomes a chat request (instructions and input items as messages, function
tools, text.format as response_format) checked by schemas.parse_chat, and the answer goes back
as a `response` object, or as its stream of typed events.

A response made with `store` (OpenAI's default) is kept in memory, per API key, so that a
later request may continue it with `previous_response_id` (store.py); `conversation` objects
and item references are refused with 400.
"""

from edge_spec.server.responses_api.answer import ResponseEvents, ResponseShape
from edge_spec.server.responses_api.request import ResponseEcho, parse_responses
from edge_spec.server.responses_api.store import ResponseStore

__all__ = ["ResponseEcho", "ResponseEvents", "ResponseShape", "ResponseStore", "parse_responses"]
