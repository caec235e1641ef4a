"""Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version): what
Ollama's own clients (the `ollama` Python and JavaScript packages), LangChain's ChatOllama and
the chat front ends built for Ollama speak. A request becomes the chat or completion request it
means (request.py), so it gets the same template, drafts and exactness; the answer is Ollama's
object or its newline-delimited stream (answer.py). Errors take Ollama's shape ({error})."""

from edge_spec.server.ollama_api.answer import OllamaShape
from edge_spec.server.ollama_api.request import parse_ollama_chat, parse_ollama_generate
from edge_spec.server.ollama_api.routes import add_ollama_routes, served_name

__all__ = [
    "OllamaShape",
    "add_ollama_routes",
    "parse_ollama_chat",
    "parse_ollama_generate",
    "served_name",
]
