"""One exception hierarchy; the CLI maps every EdgeSpecError to exit code 2 and one line."""

from __future__ import annotations


class EdgeSpecError(Exception):
    """Base of every error edge_spec raises on purpose."""


class ModelFileError(EdgeSpecError):
    """A model file is missing, is not GGUF, is truncated, or llama.cpp refused to load it."""


class VocabMismatchError(EdgeSpecError):
    """The draft's vocabulary cannot be used to draft for the target."""


class ContextOverflowError(EdgeSpecError):
    """The prompt (plus what must be generated) does not fit in the context."""


class InvalidRequestError(EdgeSpecError):
    """A request or configuration value is out of range."""


class RpcError(EdgeSpecError):
    """An rpc-server that cannot be used (unreachable, not an rpc-server, another protocol), or
    one lost mid-generation."""
