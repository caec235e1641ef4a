"""Anthropic's Messages API (POST /v1/messages), what Anthropic's SDK and the coding agents built
on it (Claude Code among them, with ANTHROPIC_BASE_URL) speak: the request becomes a chat
request (request.py), so it is the chat completion of the same conversation, with the same
template, drafts and exactness; the answer is a `message` or its event stream (answer.py).
Errors take Anthropic's shape ({type: error, error: {type, message}})."""

from edge_spec.server.messages_api.answer import MessageEvents, MessageShape, error_body
from edge_spec.server.messages_api.request import parse_messages

__all__ = ["MessageEvents", "MessageShape", "error_body", "parse_messages"]
