"""The public API's configuration and result types: EngineConfig (how the models load, fixed for
an EdgeSpec's life), GenerationConfig (one request), GenerationResult and TextDelta."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from edge_spec.constrain.spec import (
    Constraint,
    Tool,
    ToolChoice,
    parse_tool_choice,
    parse_tools,
)
from edge_spec.constrain.tools import ToolCall
from edge_spec.decode.logprobs import MAX_TOP_LOGPROBS
from edge_spec.decode.stats import GenerationStats
from edge_spec.decode.text import Span
from edge_spec.errors import InvalidRequestError
from edge_spec.modes import DRAFT_MODES, DraftMode
from edge_spec.policy.types import DEFAULT_K_MAX
from edge_spec.sampling import SamplingParams

PolicyName = Literal["fixed", "heuristic", "cost"]
POLICIES: tuple[str, ...] = ("fixed", "heuristic", "cost")
DEFAULT_K = 4  # the fixed policy's draft length when none is given (the heuristic's start)
DEFAULT_SESSION = "default"  # the session of API calls that name none
FinishReason = Literal["stop", "eos", "length", "context", "tool_calls"]


@dataclass(frozen=True)
class EngineConfig:
    """How the models are loaded; fixed for the life of an EdgeSpec."""

    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int = -1  # -1: as planned (all where they fit); ignored on CPU builds
    mem_budget_bytes: int | None = None  # RAM the pair may use; None: what is free now
    ngram_max: int = 3
    ngram_min: int = 1
    # How many tokens of a session's earlier requests (prompts and outputs) the n-gram source
    # drafts from (0: each request from itself only), and how many sessions are kept. Safe on
    # by default: sampled tokens are keyed by (seed, position), so drafts never change the text.
    ngram_session_tokens: int = 32768
    max_sessions: int = 16
    # What all sessions' indexes together may hold (estimated from above); the least recently
    # used sessions go first. None: only the token and session bounds.
    ngram_session_bytes: int | None = 64 * 2**20
    # The chat template: None for the model's own (a built-in for its architecture if it has
    # none), or a built-in name ("chatml", "gemma") or a file of Jinja.
    chat_template: str | None = None
    # Load a model file this machine has no verdict for in a child process first, so that a
    # file llama.cpp aborts on cannot take this process down (edge_spec.isolation). The CLI and
    # the server set it; a library user whose files come from elsewhere may.
    verify_in_child: bool = False
    # A draft head trained for the target (edge-spec head train) drafts in auto mode when one
    # exists; False keeps auto to the draft model (the CLI sets it when --draft is given).
    # draft_mode "head" needs one either way.
    use_head: bool = True
    # llama.cpp rpc-servers ("host:port") that hold the target's layers (edge-spec rpc-server);
    # the draft, n-gram and head stay on this machine. Empty: everything local.
    rpc_servers: tuple[str, ...] = ()
    rpc_timeout_s: float = 120.0  # the most one call may wait for them (a silent server)
    # The cost policy starts from what earlier processes learned for this device, pair and
    # settings (edge_spec.device.learned); True starts it from its priors (what it learns then
    # replaces the saved state).
    fresh: bool = False

    def __post_init__(self) -> None:
        checks = [
            (self.n_ctx >= 16, f"n_ctx must be >= 16, got {self.n_ctx}"),
            (self.n_batch >= 1, f"n_batch must be >= 1, got {self.n_batch}"),
            (
                self.n_threads is None or self.n_threads >= 1,
                f"n_threads must be >= 1, got {self.n_threads}",
            ),
            (
                self.ngram_session_tokens >= 0,
                f"ngram_session_tokens must be >= 0, got {self.ngram_session_tokens}",
            ),
            (self.max_sessions >= 1, f"max_sessions must be >= 1, got {self.max_sessions}"),
            (
                (self.ngram_session_bytes or 0) >= 0,
                f"ngram_session_bytes must be >= 0, got {self.ngram_session_bytes}",
            ),
            (
                1 <= self.ngram_min <= self.ngram_max,
                f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequestError(message)
        if not self.rpc_timeout_s > 0:
            raise InvalidRequestError(f"rpc_timeout_s must be > 0, got {self.rpc_timeout_s}")
        if self.rpc_servers:
            from edge_spec.backend.rpc import parse_endpoints

            parse_endpoints(",".join(self.rpc_servers))


@dataclass(frozen=True)
class GenerationConfig:
    """One request. `sampling.temperature == 0` is greedy (exact), > 0 rejection sampling."""

    max_tokens: int = 128
    # A fixed draft length; giving it without a policy means the fixed policy. None: adaptive
    # (the fixed and heuristic policies then start from DEFAULT_K).
    k: int | None = None
    k_max: int = DEFAULT_K_MAX  # the adaptive policies' cap (policy.DEFAULT_K_MAX)
    # Token trees: the most branch tokens an n-gram draft may add (the cost policy adds them
    # while they pay; the fixed policy adds as many as the lookup offers). None: 8 under the
    # cost policy, 0 (chains only) under the others.
    tree_nodes: int | None = None
    draft_mode: DraftMode | None = None  # None: the EdgeSpec's default
    # None: "fixed" when k is given, else "cost" -- in every draft mode, so that no mode a user
    # can pick runs slower than the target alone.
    policy: PolicyName | None = None
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Which conversation this request belongs to: the n-gram source drafts from that session's
    # earlier requests too. The EdgeSpec's own session by default; None: this request alone
    # (the server's default, so no client's text reaches another's drafts).
    session: str | None = DEFAULT_SESSION
    # Structured output: the answer matches this grammar (a JSON schema, any JSON object, a
    # regular expression, a Lark or GBNF grammar), token by token, exactly as the constrained
    # target alone would write it. from_kwargs takes OpenAI's response_format or a grammar.
    constraint: Constraint | None = None
    # Tools the model may call (OpenAI's function tools) and how: tool_choice None is "auto"
    # with tools, "none" without; calls are held to their function's parameters.
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # Each answer token's log-probability under the target (result.logprobs) and this many of
    # its position's most likely tokens (0-20); None: none (they cost nothing then).
    logprobs: int | None = None
    # The prompt's tokens' logprobs too (result.prompt_logprobs), with this many alternatives
    # each (0-20); None: none. Scoring decodes the prompt again, every row output, but for the
    # beginning it shares with the last prompt scored (decode.logprobs.PromptScores).
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise InvalidRequestError(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 0:
            raise InvalidRequestError(f"max_tokens must be >= 0, got {self.max_tokens}")
        k = self.k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise InvalidRequestError(f"k must be an integer >= 0, got {k!r}")
        if isinstance(self.k_max, bool) or not isinstance(self.k_max, int) or self.k_max < 0:
            raise InvalidRequestError(f"k_max must be an integer >= 0, got {self.k_max!r}")
        tree = self.tree_nodes
        if tree is not None and (isinstance(tree, bool) or not isinstance(tree, int) or tree < 0):
            raise InvalidRequestError(f"tree_nodes must be an integer >= 0, got {tree!r}")
        if max(self.k or 0, self.k_max, tree or 0) > 64:
            raise InvalidRequestError(
                f"k, k_max and tree_nodes must be <= 64, got {self.k}, {self.k_max}, {tree}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and (
                isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP_LOGPROBS
            ):
                raise InvalidRequestError(
                    f"{name} must be None or an integer in [0, {MAX_TOP_LOGPROBS}], got {n!r}"
                )
        if self.policy is not None and self.policy not in POLICIES:
            raise InvalidRequestError(
                f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}"
            )
        if self.draft_mode is not None and self.draft_mode not in DRAFT_MODES:
            raise InvalidRequestError(
                f"draft_mode must be one of {', '.join(DRAFT_MODES)}, got {self.draft_mode!r}"
            )
        if self.stop is None or isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,) if self.stop else ())
        if not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty strings")
        if self.session is not None and not isinstance(self.session, str):
            raise InvalidRequestError(f"session must be a string or None, got {self.session!r}")
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InvalidRequestError("constraint must be a Constraint (or use response_format)")
        choice = self.tool_choice
        if choice is not None and choice.mode in ("required", "function") and not self.tools:
            raise InvalidRequestError(f"tool_choice {choice.mode!r} needs tools")
        if self.constraint is not None and self.tools and self.tool_mode != "none":
            raise InvalidRequestError(
                "a response format or grammar and tool calls: give one (or tool_choice 'none')"
            )

    @classmethod
    def from_kwargs(cls, base: GenerationConfig | None = None, **kwargs: Any) -> GenerationConfig:
        """Build a config from keyword overrides; sampling fields (temperature, top_k, top_p,
        min_p, seed) may be given flat."""
        base = base or cls()
        sampling_names = {f.name for f in fields(SamplingParams)}
        own_names = {f.name for f in fields(cls)}
        unknown = set(kwargs) - sampling_names - own_names - set(STRUCTURED_OPTIONS)
        if unknown:
            raise InvalidRequestError(f"unknown generation option(s): {', '.join(sorted(unknown))}")
        flat = {key: kwargs.pop(key) for key in list(kwargs) if key in sampling_names}
        sampling = kwargs.pop("sampling", base.sampling)
        if not isinstance(sampling, SamplingParams):
            raise InvalidRequestError(f"sampling must be SamplingParams, got {sampling!r:.60}")
        sampling = replace(sampling, **flat)
        _structured(kwargs)
        stop = kwargs.get("stop")
        if stop is not None and not isinstance(stop, str):
            try:
                kwargs["stop"] = tuple(stop)
            except TypeError:
                raise InvalidRequestError(
                    f"stop must be a string or a list of strings, got {stop!r:.60}"
                ) from None
        return replace(base, sampling=sampling, **kwargs)

    @property
    def tool_mode(self) -> str:
        """none, auto, required or function: how this request may call its tools."""
        if not self.tools:
            return "none"
        return self.tool_choice.mode if self.tool_choice is not None else "auto"

    @property
    def policy_name(self) -> PolicyName:
        """The policy this request runs: the one asked for, else fixed when k is given, else
        the cost model."""
        if self.policy is not None:
            return self.policy
        return "fixed" if self.k is not None else "cost"


STRUCTURED_OPTIONS = ("response_format", "grammar", "json_schema")


def _structured(kwargs: dict[str, Any]) -> None:
    """from_kwargs' structured-output options as config fields, in place: response_format
    (OpenAI's shapes), grammar (Lark text, or a Constraint), json_schema (a schema); tools and
    tool_choice in OpenAI's shapes."""
    given = [name for name in STRUCTURED_OPTIONS if kwargs.get(name) is not None]
    if len(given) > 1 or (given and kwargs.get("constraint") is not None):
        raise InvalidRequestError(f"give one of {', '.join(STRUCTURED_OPTIONS)}, not several")
    for name in STRUCTURED_OPTIONS:
        value = kwargs.pop(name, None)
        if value is None:
            continue
        if name == "response_format":
            kwargs["constraint"] = Constraint.from_response_format(value)
        elif name == "json_schema":
            kwargs["constraint"] = Constraint.json_schema(value)
        else:
            is_spec = isinstance(value, Constraint)
            kwargs["constraint"] = value if is_spec else Constraint.grammar(value, "lark")
    tools = kwargs.get("tools")
    if tools is not None and not all(isinstance(tool, Tool) for tool in tools or ()):
        kwargs["tools"] = parse_tools(tools)
    elif "tools" in kwargs:
        kwargs["tools"] = tuple(tools or ())
    tool_choice = kwargs.get("tool_choice")
    if tool_choice is not None and not isinstance(tool_choice, ToolChoice):
        kwargs["tool_choice"] = parse_tool_choice(tool_choice, kwargs.get("tools", ()))


@dataclass(frozen=True)
class TokenLogprob:
    """A token of the answer and its log-probability under the target: the log-softmax of the
    target's logits at its position, before a bias, penalties, temperature, top-k/top-p/min-p
    or a grammar (as OpenAI and llama.cpp report them); `top`: that position's most likely
    tokens, best first. A prompt's first token has none (logprob None): nothing predicts it."""

    token_id: int
    token_bytes: bytes
    logprob: float | None
    top: tuple[TokenLogprob, ...] = ()

    @property
    def token(self) -> str:
        """The token's text (a token that ends inside a UTF-8 character shows U+FFFD)."""
        return self.token_bytes.decode("utf-8", "replace")

    def to_dict(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "token_id": self.token_id,
            "logprob": self.logprob,
            "bytes": list(self.token_bytes),
            "top_logprobs": [t.to_dict() for t in self.top],
        }


@dataclass(frozen=True)
class GenerationResult:
    text: str
    finish_reason: FinishReason
    token_ids: tuple[int, ...]
    prompt_token_ids: tuple[int, ...]
    target: str  # path of the target GGUF
    draft: str | None  # path of the draft GGUF, None when no model drafted
    draft_mode: DraftMode
    policy: str
    k: int | None  # the fixed k asked for; None when the policy chose k per step
    stats: GenerationStats
    # "shared": the draft model's token ids are the target's; "translated": its text is
    # re-tokenized for the target (a cross-vocabulary draft); None without a draft model.
    draft_vocab: str | None = None
    # Tool calls the answer made (finish_reason "tool_calls"), and its text outside them.
    tool_calls: tuple[ToolCall, ...] = ()
    content: str | None = None
    # Under a constraint: whether the answer is a whole one (False when max_tokens or the
    # context cut it short); None without one.
    constraint_complete: bool | None = None
    # One per token of token_ids where the request asked for logprobs; None otherwise.
    logprobs: tuple[TokenLogprob, ...] | None = None
    # The stop string that ended the answer (finish_reason "stop"), else None.
    stop_string: str | None = None
    # One per prompt token where the request asked for prompt_logprobs (the first with
    # logprob None); None otherwise.
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    # With logprobs, where an end-of-generation token ended the answer (finish "eos"): its
    # logprob (it is not in token_ids; OpenAI's completions list it last).
    end_logprob: TokenLogprob | None = None

    @property
    def reply(self) -> str:
        """The answer's text outside its tool calls (all of it when it made none)."""
        return (self.content or "") if self.tool_calls else self.text

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "content": self.reply,
            "tool_calls": [call.to_dict() for call in self.tool_calls],
            "constraint_complete": self.constraint_complete,
            "finish_reason": self.finish_reason,
            "stop_string": self.stop_string,
            "token_ids": list(self.token_ids),
            "n_prompt_tokens": len(self.prompt_token_ids),
            "target": self.target,
            "draft": self.draft,
            "draft_vocab": self.draft_vocab,
            "draft_mode": self.draft_mode,
            "policy": self.policy,
            "k": self.k,
            "stats": self.stats.to_dict(),
            **(
                {"logprobs": [t.to_dict() for t in self.logprobs]}
                if self.logprobs is not None
                else {}
            ),
            **(
                {"prompt_logprobs": [t.to_dict() for t in self.prompt_logprobs]}
                if self.prompt_logprobs is not None
                else {}
            ),
            **({"end_logprob": self.end_logprob.to_dict()} if self.end_logprob else {}),
        }


@dataclass(frozen=True)
class TextDelta:
    """One piece of streamed output. Text never splits a multi-byte UTF-8 character; the last
    delta has finish_reason set and carries the whole result."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    result: GenerationResult | None = None
    # The text again, as runs marked True where they came from accepted draft tokens.
    spans: tuple[Span, ...] = ()
    # The logprobs of token_ids, where the request asked for them.
    logprobs: tuple[TokenLogprob, ...] = ()
    # The first delta only, where the request asked for them: the prompt's (as the result's).
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
