"""EdgeSpec(target, draft).generate / stream / chat: one request at a time through the decode
loop, with the draft sources and the k policy its draft mode allows."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_spec.api import assembly, driver
from edge_spec.api.config import (
    EngineConfig,
    GenerationConfig,
    GenerationResult,
    TextDelta,
)
from edge_spec.backend import LlamaModel
from edge_spec.backend.grammar_vocab import grammar_tokenizer
from edge_spec.constrain.grammars import compile_grammar, tool_grammar
from edge_spec.constrain.matcher import GrammarConstraint
from edge_spec.constrain.spec import Tool, ToolChoice
from edge_spec.constrain.tools import CallFormat, call_format, renders_tools
from edge_spec.decode.logprobs import PromptScores
from edge_spec.device.learned import LearnedKey, LearnedStore
from edge_spec.device.profile import DeviceProfile, cached_profile, load_or_profile
from edge_spec.drafts import DraftSource, ModelDraft, NgramDraft
from edge_spec.drafts.head import HeadDraft
from edge_spec.errors import InvalidRequestError
from edge_spec.models.placement import plan_placement
from edge_spec.models.templates import render_chat
from edge_spec.modes import HEAD, DraftMode
from edge_spec.policy import make_policy
from edge_spec.policy.cost import DRAFT_FREE_RISK, CostModelK
from edge_spec.policy.types import CostCurve, KPolicy, SourceName

log = logging.getLogger(__name__)

DEFAULT_K = 4  # the fixed policy's draft length when none is given (the heuristic's start)


class EdgeSpec:
    """A target GGUF model with an optional GGUF draft; not safe for concurrent requests (a lock
    serializes them). Each is a manifest name, a path, or a name in a local store
    (`ollama:NAME[:TAG]`, `lmstudio:PUBLISHER/REPO[/FILE]`, `hf:ORG/REPO[/FILE]`); the draft
    may also be "self" (derived from the target) or "auto" (the best local draft for the
    target, edge_spec.models.draft_choice.choose_draft: see draft_choice)."""

    def __init__(
        self,
        target: str | os.PathLike[str],
        draft: str | os.PathLike[str] | None = None,
        *,
        draft_mode: DraftMode | None = None,
        config: EngineConfig | None = None,
    ) -> None:
        self.config = cfg = config or EngineConfig()
        self._learned = LearnedStore(fresh=cfg.fresh)
        # What the policies learned is saved at close, or when the interpreter exits for an
        # engine never closed (the finalizer holds the store, not the engine).
        self._save_learned = weakref.finalize(self, self._learned.flush)
        choice = assembly.choose_models(target, draft, draft_mode, cfg)
        self.default_draft_mode: DraftMode = choice.mode
        self.target_path, self.draft_path = choice.target_path, choice.draft_path
        self.draft_is_self = choice.draft_is_self
        self.draft_choice = choice.draft_choice  # draft="auto": the local draft chosen, and why
        devices = assembly.rpc_devices(cfg)
        if cfg.verify_in_child:
            assembly.check_files(choice)
        # Refuse before loading anything if the pair and its KV cannot fit in the budget.
        self.placement = plan_placement(
            self.target_path,
            self.draft_path,
            n_ctx=cfg.n_ctx,
            ram_budget_bytes=cfg.mem_budget_bytes,
            remote_budget_bytes=devices.remote_free_bytes,
        )
        log.info("placement: %s", self.placement.describe())
        self.target = assembly.load_target(choice, cfg, devices)
        self._sources: dict[str, DraftSource] = {}
        try:
            self._sources, self.head_dir = assembly.load_sources(choice, cfg, self.target, devices)
            self.chat_template = assembly.chat_template(cfg, self.target)
        except BaseException:
            self.close()
            raise
        self._policies: dict[tuple[object, ...], KPolicy] = {}
        self._scores = PromptScores()  # the last scored prompt: a next one sharing its start
        self._costs: CostCurve | None = None
        self._profile: DeviceProfile | None = None
        self._lock = threading.Lock()
        if self.default_draft_mode != "none":
            self._costs_if_measured()

    def _costs_if_measured(self) -> None:
        """The device profile read at load where one was measured for this pair (nothing is
        measured here): its key hashes the llama.cpp libraries and the models, 20-30 ms that
        a one-shot run's first request paid before its first token otherwise."""
        profile = cached_profile(
            self.target_path,
            self.draft_path,
            n_threads=self.target.n_threads,
            n_gpu_layers=self.config.n_gpu_layers,
            rpc_servers=self.config.rpc_servers,
        )
        if profile is not None:
            self._profile, self._costs = profile, profile.cost_curve()

    @property
    def draft(self) -> LlamaModel | None:
        """The draft model (None without one). It loads when a request first drafts with it,
        or here, on first access."""
        model = self._sources.get("model")
        return model.draft_model if isinstance(model, ModelDraft) else None

    def close(self) -> None:
        self._save_learned()
        assembly.close_sources(self._sources)
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
        self, prompt: str | Sequence[int], config: GenerationConfig | None = None, **options: Any
    ) -> GenerationResult:
        """Complete `prompt`; options override fields of `config` (see GenerationConfig)."""
        for delta in self.stream(prompt, config, **options):
            if delta.result is not None:
                return delta.result
        raise AssertionError("stream() ended without a result")  # pragma: no cover

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        config: GenerationConfig | None = None,
        **options: Any,
    ) -> GenerationResult:
        """Answer a conversation rendered with the target GGUF's own chat template (with the
        request's tools, their calls and results, in the model family's format)."""
        cfg = _config(config, options)
        return self.generate(self.render_chat(messages, cfg.tools), cfg)

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        config: GenerationConfig | None = None,
        **options: Any,
    ) -> Iterator[TextDelta]:
        cfg = _config(config, options)
        return self.stream(self.render_chat(messages, cfg.tools), cfg)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool] = ()) -> str:
        """The prompt of a conversation. With tools, or with tool calls and results in the
        history, a template that renders tools itself gets them as they are; any other gets the
        tool list in the system message and the history in the family's call format."""
        info = self.target.info
        template = self.chat_template.text
        has_tools = bool(tools) or any(
            isinstance(m, Mapping) and (m.get("role") == "tool" or m.get("tool_calls"))
            for m in messages
        )
        native = has_tools and renders_tools(template, self.call_format)
        if has_tools and not native:
            messages = self.call_format.rewrite(messages, tools)
        return render_chat(
            template,
            messages,
            bos_token=self.target.token_text(info.bos_id).decode("utf-8", "replace"),
            eos_token=self.target.token_text(info.eos_id).decode("utf-8", "replace"),
            tools=[{"type": "function", "function": t.to_dict()} for t in tools]
            if native
            else None,
        )

    @property
    def call_format(self) -> CallFormat:
        """How the target's family writes tool calls (edge_spec.constrain.tools)."""
        return call_format(self.target.info.architecture, self.chat_template.text)

    def tokenize(self, text: str) -> list[int]:
        return self.target.tokenize(text, add_special=True, parse_special=True)

    def stream(
        self, prompt: str | Sequence[int], config: GenerationConfig | None = None, **options: Any
    ) -> Iterator[TextDelta]:
        """Yields text deltas as tokens are accepted; the last delta carries the result. The
        prompt is text, or the target's token ids as they are (no BOS added)."""
        if not isinstance(prompt, str) and not _token_ids(prompt):
            raise InvalidRequestError("the prompt must be a string or a list of token ids")
        cfg = _config(config, options)
        mode: DraftMode = cfg.draft_mode or self.default_draft_mode
        if mode == "model" and "model" not in self._sources:
            raise InvalidRequestError(f"draft_mode {mode!r} needs a draft model; none is loaded")
        if mode == HEAD and HEAD not in self._sources:
            raise InvalidRequestError(
                "draft_mode 'head' needs a draft head: none was trained for this target "
                "(edge-spec head train)"
            )
        n_vocab = self.target.n_vocab
        outside = [t for t, _ in cfg.sampling.logit_bias if t >= n_vocab]
        if outside:
            raise InvalidRequestError(
                f"logit_bias names token {outside[0]}, outside the vocabulary [0, {n_vocab})"
            )
        if isinstance(prompt, str):
            prompt_ids = self.tokenize(prompt)
        else:
            prompt_ids = [int(t) for t in prompt]
            if any(not 0 <= t < n_vocab for t in prompt_ids):
                raise InvalidRequestError(f"prompt token ids must be in [0, {n_vocab})")
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        constraint = self._constraint(cfg)  # a bad schema or grammar fails here, not mid-stream
        return self._stream(prompt_ids, cfg, mode, constraint)

    def _constraint(self, cfg: GenerationConfig) -> GrammarConstraint | None:
        """The request's grammar state: its tool calls' under tool_choice, else its response
        format's or grammar's; None when the answer is free text."""
        if cfg.tool_mode == "none" and cfg.constraint is None:
            return None
        tokenizer = grammar_tokenizer(self.target)
        if cfg.tool_mode != "none":
            choice = cfg.tool_choice or ToolChoice("auto")
            fmt = replace(self.call_format, parallel=cfg.parallel_tool_calls)
            grammar = tool_grammar(cfg.tools, choice, fmt, tokenizer)
        else:
            assert cfg.constraint is not None
            grammar = compile_grammar(cfg.constraint, tokenizer)
        return GrammarConstraint(grammar, tokenizer) if grammar is not None else None

    # ---- the generation driver (driver.py) ---------------------------------------------------

    def _stream(
        self,
        prompt_ids: list[int],
        cfg: GenerationConfig,
        mode: DraftMode,
        constraint: GrammarConstraint | None = None,
    ) -> Iterator[TextDelta]:
        with self._lock:
            sources, policy = self._plan_for(mode, cfg)  # may profile the device: not timed
            self._ngram.select(cfg.session)
            run = driver.Generation(
                self.target,
                sources,
                policy,
                cfg,
                mode,
                self.call_format,
                constraint,
                target_name=str(self.target_path),
                draft_name=_draft_name(sources.get("model"), self.draft_path, self.head_dir),
                known_scores=self._scores,
            )
            deltas = driver.deltas(run, prompt_ids)
            try:
                for delta in deltas:
                    if delta.result is not None:
                        self._learned.request_done()
                    yield delta
            except Exception:
                self._recover()
                raise
            finally:
                deltas.close()

    def _recover(self) -> None:
        """After a request failed mid-step (a decode, a tree, a draw, the text): the models'
        caches may hold what the failed step left, so they are emptied and the next request
        prefills from scratch, as a fresh process would."""
        log.info("a request failed mid-generation: the models' caches are reset")
        try:
            self.target.reset()
        except Exception:  # noqa: BLE001 - the original error is the one to report
            log.debug("resetting the target failed too", exc_info=True)
        for source in self._sources.values():  # the draft model's reset is its source's
            reset = getattr(source, "reset", None)
            if reset is not None:
                try:
                    reset()
                except Exception:  # noqa: BLE001
                    log.debug("resetting a draft source failed too", exc_info=True)

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
        # Constrained answers (drafts cut by the grammar, forced text ahead) too.
        structured = cfg.constraint is not None or cfg.tool_mode != "none"
        key = (
            mode,
            learned,
            policy_name,
            k,
            cfg.k_max,
            cfg.tree_nodes,
            cfg.sampling.greedy,
            structured,
            cfg.sampling.penalized,  # penalties keep drafts of repeats from being accepted
        )
        if key not in self._policies:
            costs = self.cost_curve(learned) if policy_name == "cost" else None
            policy = make_policy(
                policy_name,
                costs,
                k=k,
                k_max=max(k, cfg.k_max),
                tree_nodes=cfg.tree_nodes,
                model_prior=self._head_prior() if learned == HEAD else None,
                risk=DRAFT_FREE_RISK if mode == "ngram" else None,
            )
            if isinstance(policy, CostModelK) and self._profile is not None:
                head = str(self.head_dir) if learned == HEAD else None
                where = LearnedKey(self._profile.key, self._profile.created, (*key, head))
                self._learned.attach(where, policy)
            self._policies[key] = policy
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
            profile = load_or_profile(
                self.target_path,
                self.draft_path,
                n_threads=self.target.n_threads,
                n_gpu_layers=self.config.n_gpu_layers,
                quick=True,
                rpc_servers=self.config.rpc_servers,
            )
            self._profile = profile
            self._costs = profile.cost_curve()
        return self._costs


def _draft_name(source: DraftSource | None, draft: Path | None, head: Path | None) -> str | None:
    """What drafted in the learned-draft slot: the draft model's path or the head's directory."""
    if source is None:
        return None
    return str(head) if isinstance(source, HeadDraft) else str(draft)


def _token_ids(prompt: object) -> bool:
    """Whether a prompt is a non-empty list (or tuple) of token ids."""
    return (
        isinstance(prompt, (list, tuple))
        and bool(prompt)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    )


def _config(config: GenerationConfig | None, options: Mapping[str, Any]) -> GenerationConfig:
    """The request's config: `config` (or the defaults) with `options` applied."""
    if options:
        return GenerationConfig.from_kwargs(config, **options)
    return config or GenerationConfig()
