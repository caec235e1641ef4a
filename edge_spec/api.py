"""The public API: EdgeSpec(target, draft).generate / stream / chat, and the result types."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from .backend import LlamaModel
from .chat import choose_template, render_chat
from .cost_policy import DRAFT_FREE_RISK
from .drafts import CrossVocabDraft, DraftSource, ModelDraft, NgramDraft, NoDraft
from .drafts.head import HeadDraft
from .engine import Prefill, Step, run_steps
from .errors import EdgeSpecError, InvalidRequestError, VocabMismatchError
from .heads import find_head
from .modes import DRAFT_MODES, HEAD, SELF, DraftMode
from .placement import plan_placement
from .policy import DEFAULT_K_MAX, CostCurve, KPolicy, SourceName, make_policy
from .sampling import SamplingParams
from .self_draft import self_draft_path
from .stats import GenerationStats, StatsCollector
from .text import Span, TextAssembler
from .vocab import check_compatible

log = logging.getLogger(__name__)

# Logit rows the target's first prefill outputs (and drops) so that the first verifications
# do not pay for llama.cpp's buffers (LlamaModel.sync): a request's first drafts are short
# (the risk ledger affords a few tokens before drafting has gained anything), and larger
# batches come once drafts have paid. The first prefill takes 25-48 ms more on Gemma-3-270M
# F16, about what the first steps then save; a fresh process's first draft no longer pays it.
WARM_ROWS = 9

PolicyName = Literal["fixed", "heuristic", "cost"]
POLICIES: tuple[str, ...] = ("fixed", "heuristic", "cost")
DEFAULT_K = 4  # the fixed policy's draft length when none is given (the heuristic's start)
DEFAULT_SESSION = "default"  # the session of API calls that name none
FinishReason = Literal["stop", "eos", "length", "context"]


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
        if self.rpc_servers:
            from .backend.rpc import parse_endpoints

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

    @classmethod
    def from_kwargs(cls, base: GenerationConfig | None = None, **kwargs: Any) -> GenerationConfig:
        """Build a config from keyword overrides; sampling fields (temperature, top_k, top_p,
        min_p, seed) may be given flat."""
        base = base or cls()
        sampling_names = {f.name for f in fields(SamplingParams)}
        own_names = {f.name for f in fields(cls)}
        unknown = set(kwargs) - sampling_names - own_names
        if unknown:
            raise InvalidRequestError(f"unknown generation option(s): {', '.join(sorted(unknown))}")
        flat = {key: kwargs.pop(key) for key in list(kwargs) if key in sampling_names}
        sampling = kwargs.pop("sampling", base.sampling)
        if not isinstance(sampling, SamplingParams):
            raise InvalidRequestError(f"sampling must be SamplingParams, got {sampling!r:.60}")
        sampling = replace(sampling, **flat)
        stop = kwargs.get("stop")
        if stop is not None and not isinstance(stop, str):
            kwargs["stop"] = tuple(stop)
        return replace(base, sampling=sampling, **kwargs)

    @property
    def policy_name(self) -> PolicyName:
        """The policy this request runs: the one asked for, else fixed when k is given, else
        the cost model."""
        if self.policy is not None:
            return self.policy
        return "fixed" if self.k is not None else "cost"


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "token_ids": list(self.token_ids),
            "n_prompt_tokens": len(self.prompt_token_ids),
            "target": self.target,
            "draft": self.draft,
            "draft_vocab": self.draft_vocab,
            "draft_mode": self.draft_mode,
            "policy": self.policy,
            "k": self.k,
            "stats": self.stats.to_dict(),
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


class EdgeSpec:
    """A target GGUF model with an optional GGUF draft; not safe for concurrent requests (a lock
    serializes them)."""

    def __init__(
        self,
        target: str | os.PathLike[str],
        draft: str | os.PathLike[str] | None = None,
        *,
        draft_mode: DraftMode | None = None,
        config: EngineConfig | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        cfg = self.config
        self.target_path = _resolve(target)
        mode = draft_mode or "auto"
        if mode not in DRAFT_MODES:
            raise InvalidRequestError(f"draft_mode must be one of {', '.join(DRAFT_MODES)}")
        if mode == "self" and draft is not None and str(draft) != SELF:
            raise InvalidRequestError(
                "draft_mode 'self' derives its draft from the target: no draft"
            )
        # The self-draft: the target less some blocks, derived and chosen on first use.
        self.draft_is_self = mode == "self" or (draft is not None and str(draft) == SELF)
        if self.draft_is_self:
            self.draft_path: Path | None = self_draft_path(
                self.target_path, n_threads=cfg.n_threads
            )
        else:
            self.draft_path = _resolve(draft) if draft is not None else None
        if mode == "model" and self.draft_path is None:
            raise InvalidRequestError("draft_mode 'model' needs a draft model")
        if mode == HEAD and draft is not None:
            raise InvalidRequestError("draft_mode 'head' drafts with the target's head: no draft")
        # A draft head trained for this target: its directory in the model cache, or None.
        self.head_dir: Path | None = None
        if mode == HEAD or (mode == "auto" and cfg.use_head):
            self.head_dir = find_head(self.target_path)
            if self.head_dir is None and mode == HEAD:
                raise InvalidRequestError(
                    f"no draft head for {self.target_path.name}: train one with "
                    f"`edge-spec head train -m {self.target_path}`"
                )
        self.default_draft_mode: DraftMode = mode
        # The target spread over rpc-servers: each checked (reachable, its protocol) before
        # llama.cpp sees it, since llama.cpp aborts the process on a server it cannot use.
        target_devices: list[int] | None = None
        local_devices: list[int] | None = None
        remote_free: int | None = None
        if cfg.rpc_servers:
            from .backend import rpc

            endpoints = rpc.parse_endpoints(",".join(cfg.rpc_servers))
            local_devices = rpc.local_devices()
            remote = rpc.rpc_devices(endpoints)
            remote_free = sum(free for _, free, _ in rpc.device_memory(remote))
            target_devices = remote + local_devices
        if cfg.verify_in_child:
            from .isolation import verify_in_child
            from .models import cache_dir

            for path in (self.target_path, self.draft_path):
                if path is not None:
                    verify_in_child(path, cache_dir())
        # Refuse before loading anything if the pair and its KV cannot fit in the budget.
        self.placement = plan_placement(
            self.target_path,
            self.draft_path,
            n_ctx=cfg.n_ctx,
            ram_budget_bytes=cfg.mem_budget_bytes,
            remote_budget_bytes=remote_free,
        )
        log.info("placement: %s", self.placement.describe())
        self.target = LlamaModel(
            self.target_path,
            n_ctx=cfg.n_ctx,
            n_batch=cfg.n_batch,
            n_threads=cfg.n_threads,
            n_gpu_layers=cfg.n_gpu_layers,
            hidden_states=self.head_dir is not None,
            devices=target_devices,
            warm_rows=1 if mode == "none" else WARM_ROWS,  # none: one row a step
        )
        self._sources: dict[str, DraftSource] = {
            "none": NoDraft(),
            "ngram": NgramDraft(
                cfg.ngram_max,
                cfg.ngram_min,
                cfg.ngram_session_tokens,
                cfg.max_sessions,
                cfg.ngram_session_bytes,
            ),
        }
        self.draft: LlamaModel | None = None
        if self.draft_path is not None:
            draft_model = LlamaModel(
                self.draft_path,
                n_ctx=self.target.n_ctx,
                n_batch=cfg.n_batch,
                n_threads=cfg.n_threads,
                n_gpu_layers=cfg.n_gpu_layers,
                devices=local_devices,
            )
            try:
                model_source = _model_source(self.target, draft_model)
            except Exception:
                draft_model.close()
                self.target.close()
                raise
            self.draft = draft_model
            self._sources["model"] = model_source
        if self.head_dir is not None:
            try:
                self._sources[HEAD] = HeadDraft.load(
                    self.head_dir, self.target_path, self.target.n_vocab
                )
            except EdgeSpecError as exc:
                if mode == HEAD:
                    self.close()
                    raise
                # auto drafts without it: a broken head must not break generation.
                log.warning("the draft head in %s is not used: %s", self.head_dir, exc)
                self.head_dir = None
            except Exception:
                self.close()
                raise
        info = self.target.info
        try:
            self.chat_template = choose_template(
                cfg.chat_template, info.chat_template, info.architecture
            )
        except Exception:
            self.close()
            raise
        if self.chat_template.source == "fallback":
            log.info(
                "%s has no chat template; chats use the built-in %s template",
                self.target_path.name,
                self.chat_template.name,
            )
        self._policies: dict[tuple[object, ...], KPolicy] = {}
        self._costs: CostCurve | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
        self.target.close()

    def clear_session(self, session: str | None = None) -> None:
        """Forget one session's earlier requests (None: every session's); what the k policies
        learned stays. Benchmarks call this between runs so no run drafts from another's
        output of the same prompt."""
        with self._lock:
            self._ngram.clear_session(session)

    @property
    def _ngram(self) -> NgramDraft:
        ngram = self._sources["ngram"]
        assert isinstance(ngram, NgramDraft)
        return ngram

    def __enter__(self) -> EdgeSpec:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- public calls ----------------------------------------------------------------------

    def generate(
        self, prompt: str, config: GenerationConfig | None = None, **options: Any
    ) -> GenerationResult:
        """Complete `prompt`; options override fields of `config` (see GenerationConfig)."""
        for delta in self.stream(prompt, config, **options):
            if delta.result is not None:
                return delta.result
        raise AssertionError("stream() ended without a result")  # pragma: no cover

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        config: GenerationConfig | None = None,
        **options: Any,
    ) -> GenerationResult:
        """Answer a conversation rendered with the target GGUF's own chat template."""
        return self.generate(self.render_chat(messages), config, **options)

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        config: GenerationConfig | None = None,
        **options: Any,
    ) -> Iterator[TextDelta]:
        return self.stream(self.render_chat(messages), config, **options)

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        info = self.target.info
        return render_chat(
            self.chat_template.text,
            messages,
            bos_token=self.target.token_text(info.bos_id).decode("utf-8", "replace"),
            eos_token=self.target.token_text(info.eos_id).decode("utf-8", "replace"),
        )

    def tokenize(self, text: str) -> list[int]:
        return self.target.tokenize(text, add_special=True, parse_special=True)

    def stream(
        self, prompt: str, config: GenerationConfig | None = None, **options: Any
    ) -> Iterator[TextDelta]:
        """Yields text deltas as tokens are accepted; the last delta carries the result."""
        if not isinstance(prompt, str):
            raise InvalidRequestError("the prompt must be a string")
        cfg = (
            GenerationConfig.from_kwargs(config, **options)
            if options
            else (config or GenerationConfig())
        )
        mode: DraftMode = cfg.draft_mode or self.default_draft_mode
        if mode == "model" and "model" not in self._sources:
            raise InvalidRequestError(f"draft_mode {mode!r} needs a draft model; none is loaded")
        if mode == HEAD and HEAD not in self._sources:
            raise InvalidRequestError(
                "draft_mode 'head' needs a draft head: none was trained for this target "
                "(edge-spec head train)"
            )
        prompt_ids = self.tokenize(prompt)
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        return self._stream(prompt_ids, cfg, mode)

    # ---- the generation driver -------------------------------------------------------------

    def _stream(
        self, prompt_ids: list[int], cfg: GenerationConfig, mode: DraftMode
    ) -> Iterator[TextDelta]:
        with self._lock:
            sources, policy = self._plan_for(mode, cfg)  # may profile the device: not timed
            self._ngram.select(cfg.session)
            t_start = time.perf_counter()
            stats = StatsCollector({slot: source.name for slot, source in sources.items()})
            text = TextAssembler(cfg.stop)
            token_ids: list[int] = []
            new_ids: list[int] = []
            finish: FinishReason | None = None
            steps = run_steps(
                self.target,
                sources,
                policy,
                prompt_ids,
                k_max=max((cfg.k or 0) + (cfg.tree_nodes or 0), cfg.k_max),
                max_tokens=cfg.max_tokens,
                sampling=cfg.sampling,
            )
            try:
                for event in steps:
                    if isinstance(event, Prefill):
                        stats.prefill(event)
                        continue
                    stats.step(event)
                    new_ids, finish = self._take(event, len(token_ids), text, cfg.max_tokens)
                    token_ids.extend(new_ids)
                    if finish is not None:
                        break
                    spans = text.take_ready_spans()
                    yield TextDelta(_join(spans), tuple(new_ids), spans=tuple(spans))
                    new_ids = []
            finally:
                steps.close()
            if finish is None:  # the loop ran out: max_tokens reached or the context is full
                finish = "length" if len(token_ids) >= cfg.max_tokens else "context"
            tail = text.finish_spans()
            result = GenerationResult(
                text=text.text,
                finish_reason=finish,
                token_ids=tuple(token_ids),
                prompt_token_ids=tuple(prompt_ids),
                target=str(self.target_path),
                draft=_draft_name(sources.get("model"), self.draft_path, self.head_dir),
                draft_mode=mode,
                policy=policy.name,
                k=cfg.k,
                stats=stats.result(len(prompt_ids), len(token_ids), time.perf_counter() - t_start),
                draft_vocab=(
                    getattr(sources["model"], "vocabulary", None) if "model" in sources else None
                ),
            )
            yield TextDelta(_join(tail), tuple(new_ids), finish, result, tuple(tail))

    def _plan_for(
        self, mode: DraftMode, cfg: GenerationConfig
    ) -> tuple[dict[SourceName, DraftSource], KPolicy]:
        """The draft sources a mode allows and the k policy that chooses among them. Policies
        are kept per (mode, policy, k, k_max, greedy), so what they learn carries over between
        requests."""
        if mode == "self" and not self.draft_is_self:
            raise InvalidRequestError("draft_mode 'self' needs an engine started with draft 'self'")
        names: tuple[SourceName, ...] = {
            "auto": ("model", "ngram", "none"),
            "model": ("model", "none"),
            "self": ("model", "none"),
            "head": ("model", "none"),
            "ngram": ("ngram", "none"),
            "none": ("none",),
        }[mode]
        # The policy's learned-draft slot ("model"): the head in head mode, and in auto when one
        # was trained for the target (it costs ~1 % of a step where a draft model costs a third
        # or more); the draft model otherwise.
        learned = HEAD if mode == HEAD or (mode == "auto" and HEAD in self._sources) else "model"
        held = {name: learned if name == "model" else name for name in names}
        sources = {name: self._sources[held[name]] for name in names if held[name] in self._sources}
        policy_name = cfg.policy_name if mode != "none" else "fixed"
        k = (DEFAULT_K if cfg.k is None else cfg.k) if mode != "none" else 0
        # Acceptance differs between greedy and sampled decoding: learn them apart.
        key = (mode, learned, policy_name, k, cfg.k_max, cfg.tree_nodes, cfg.sampling.greedy)
        if key not in self._policies:
            costs = self.cost_curve(learned) if policy_name == "cost" else None
            self._policies[key] = make_policy(
                policy_name,
                costs,
                k=k,
                k_max=max(k, cfg.k_max),
                tree_nodes=cfg.tree_nodes,
                model_prior=self._head_prior() if learned == HEAD else None,
                risk=DRAFT_FREE_RISK if mode == "ngram" else None,
            )
        return sources, self._policies[key]

    def _head_prior(self) -> float | None:
        """The head's held-out first-position acceptance, measured when it was trained."""
        head = self._sources[HEAD]
        assert isinstance(head, HeadDraft)
        return head.info.first_acceptance if head.info is not None else None

    def cost_curve(self, learned: str = "model") -> CostCurve:
        """This device's measured costs for the loaded pair: the cached profile, or a quick
        profile measured now (the first time a pair is used on a machine). With the head in
        the learned-draft slot, its own cost per token (measured at load) replaces the draft
        model's: flat, since it reads the target's hidden state instead of re-decoding."""
        if learned == HEAD:
            head = self._sources[HEAD]
            assert isinstance(head, HeadDraft)
            return replace(
                self.cost_curve(),
                draft_token_s=head.token_s,
                draft_verify_s=(head.token_s, head.token_s),
            )
        if self._costs is None:
            from .device import load_or_profile

            profile = load_or_profile(
                self.target_path,
                self.draft_path,
                n_threads=self.target.n_threads,
                n_gpu_layers=self.config.n_gpu_layers,
                quick=True,
                rpc_servers=self.config.rpc_servers,
            )
            self._costs = profile.cost_curve()
        return self._costs

    def _take(
        self, step: Step, n_before: int, text: TextAssembler, max_tokens: int
    ) -> tuple[list[int], FinishReason | None]:
        """The step's tokens up to the first end condition, and that condition if one was met."""
        taken: list[int] = []
        for i, token in enumerate(step.tokens):
            if self.target.is_eog(token):
                return taken, "eos"
            taken.append(token)
            if text.feed(self.target.token_bytes(token), from_draft=i < step.n_accepted):
                return taken, "stop"
            if n_before + len(taken) >= max_tokens:
                return taken, "length"
        return taken, None


def _model_source(target: LlamaModel, draft_model: LlamaModel) -> ModelDraft:
    """The draft model as a source: its token ids go to the target as they are when the two
    share a vocabulary; otherwise its text is re-tokenized for the target."""
    try:
        check_compatible(target, draft_model)
    except VocabMismatchError as mismatch:
        log.info("drafting across vocabularies (%s)", mismatch)
        info = draft_model.info
        return CrossVocabDraft(draft_model, target, [info.bos_id] if info.add_bos else [])
    return ModelDraft(draft_model)


def _draft_name(source: DraftSource | None, draft: Path | None, head: Path | None) -> str | None:
    """What drafted in the learned-draft slot: the draft model's path or the head's directory."""
    if source is None:
        return None
    return str(head) if isinstance(source, HeadDraft) else str(draft)


def _join(spans: Sequence[Span]) -> str:
    return "".join(text for text, _ in spans)


def _resolve(name_or_path: str | os.PathLike[str]) -> Path:
    """A manifest model name or a path (validated on load)."""
    from .models import resolve

    return resolve(str(name_or_path))
