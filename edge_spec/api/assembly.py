"""How an EdgeSpec is put together, one named step each: which files (choose_models), on which
devices (rpc_devices), checked (check_files) and placed (plan_placement, in models), the target
loaded (load_target), the draft sources beside it (load_sources) and the chat template."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from edge_spec.api.config import EngineConfig
from edge_spec.backend import LlamaModel
from edge_spec.device.self_draft import self_draft_path
from edge_spec.drafts import (
    CrossVocabDraft,
    DraftSource,
    LazyModelDraft,
    ModelDraft,
    NgramDraft,
    NoDraft,
)
from edge_spec.drafts.head import HeadDraft
from edge_spec.drafts.vocab import check_compatible, relation_from_files
from edge_spec.errors import EdgeSpecError, InvalidRequestError, VocabMismatchError
from edge_spec.models.draft_choice import DraftChoice
from edge_spec.models.heads import find_head
from edge_spec.models.templates import ChatTemplate, choose_template
from edge_spec.modes import AUTO_DRAFT, DRAFT_MODES, HEAD, SELF, DraftMode

log = logging.getLogger(__name__)

# What loading a draft model is expected to cost, before it is loaded once (the cost policy's
# risk ledger charges it to the first plan that would draft with it). Measured on this 2-core
# machine with a 1024-4096-token context: SmolLM2-135M Q4_0 (87 MiB) 0.15 s, Gemma-3-270M
# Q4_0 (230 MiB) 0.44-0.52 s (Q4_0 weights are repacked at load), SmolLM2-135M F16 (258 MiB)
# 0.11-0.13 s: the estimate errs high, so a short request does not bet on a cheap load.
LOAD_FIXED_S = 0.02
LOAD_S_PER_MIB = 2e-3

# Logit rows the target's first prefill outputs (and drops) so that the first verifications
# do not pay for llama.cpp's buffers (LlamaModel.sync): a request's first drafts are short
# (the risk ledger affords a few tokens before drafting has gained anything), and larger
# batches come once drafts have paid. The first prefill takes 25-48 ms more on Gemma-3-270M
# F16, about what the first steps then save; a fresh process's first draft no longer pays it.
WARM_ROWS = 9


@dataclass(frozen=True)
class ModelChoice:
    """The files an EdgeSpec loads and the draft mode it defaults to."""

    mode: DraftMode
    target_path: Path
    draft_path: Path | None  # a draft model (the self-draft's derived file included)
    draft_is_self: bool  # the draft is the target less some blocks (derived on first use)
    head_dir: Path | None  # a draft head trained for the target, where one drafts
    draft_choice: DraftChoice | None = None  # draft "auto": what was chosen, and why


@dataclass(frozen=True)
class Devices:
    """Where the models run: None lists mean llama.cpp's default (every local device)."""

    target: list[int] | None = None
    local: list[int] | None = None
    remote_free_bytes: int | None = None  # what the rpc-servers offer the target


def choose_models(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str] | None,
    draft_mode: DraftMode | None,
    config: EngineConfig,
) -> ModelChoice:
    """Resolve the names to files and check that the draft mode can run with them. The
    self-draft is derived and measured here on its first use for a target (logged)."""
    target_path = resolve_model(target)
    mode = draft_mode or "auto"
    if mode not in DRAFT_MODES:
        raise InvalidRequestError(f"draft_mode must be one of {', '.join(DRAFT_MODES)}")
    if mode == "self" and draft is not None and str(draft) != SELF:
        raise InvalidRequestError("draft_mode 'self' derives its draft from the target: no draft")
    draft_is_self = mode == "self" or (draft is not None and str(draft) == SELF)
    draft_choice = None
    if draft is not None and str(draft) == AUTO_DRAFT and not draft_is_self:
        from edge_spec.models.draft_choice import choose_draft

        draft_choice = choose_draft(target_path)
        log.info("draft for %s: %s", target_path.name, draft_choice.reason)
        draft = draft_choice.draft
    if draft_is_self:
        draft_path: Path | None = self_draft_path(target_path, n_threads=config.n_threads)
    else:
        draft_path = resolve_model(draft) if draft is not None else None
    if mode == "model" and draft_path is None:
        raise InvalidRequestError("draft_mode 'model' needs a draft model")
    if mode == HEAD and draft is not None:
        raise InvalidRequestError("draft_mode 'head' drafts with the target's head: no draft")
    head_dir = None
    if mode == HEAD or (mode == "auto" and config.use_head):
        head_dir = find_head(target_path)
        if head_dir is None and mode == HEAD:
            raise InvalidRequestError(
                f"no draft head for {target_path.name}: train one with "
                f"`edge-spec head train -m {target_path}`"
            )
    return ModelChoice(mode, target_path, draft_path, draft_is_self, head_dir, draft_choice)


def rpc_devices(config: EngineConfig) -> Devices:
    """The target spread over rpc-servers: each checked (reachable, its protocol) before
    llama.cpp sees it, since llama.cpp aborts the process on a server it cannot use."""
    if not config.rpc_servers:
        return Devices()
    from edge_spec.backend import rpc

    rpc.set_call_timeout(config.rpc_timeout_s)
    endpoints = rpc.parse_endpoints(",".join(config.rpc_servers))
    local = rpc.local_devices()
    remote = rpc.rpc_devices(endpoints)
    remote_free = sum(free for _, free, _ in rpc.device_memory(remote))
    return Devices(remote + local, local, remote_free)


def check_files(choice: ModelChoice) -> None:
    """Load each file this machine has no verdict for in a child process first, so a file
    llama.cpp aborts on cannot take this process down (edge_spec.models.isolation)."""
    from edge_spec.files import cache_dir
    from edge_spec.models.isolation import verify_in_child

    for path in (choice.target_path, choice.draft_path):
        if path is not None:
            verify_in_child(path, cache_dir())


def load_target(choice: ModelChoice, config: EngineConfig, devices: Devices) -> LlamaModel:
    return LlamaModel(
        choice.target_path,
        n_ctx=config.n_ctx,
        n_batch=config.n_batch,
        n_threads=config.n_threads,
        n_gpu_layers=config.n_gpu_layers,
        hidden_states=choice.head_dir is not None,
        devices=devices.target,
        warm_rows=1 if choice.mode == "none" else WARM_ROWS,  # none: one row a step
    )


def load_sources(
    choice: ModelChoice, config: EngineConfig, target: LlamaModel, devices: Devices
) -> tuple[dict[str, DraftSource], Path | None]:
    """Every draft source the engine may use, by slot name ("none", "ngram", "model" for the
    draft model, "head"), and the head's directory (None where no head drafts: a broken one is
    set aside in auto mode, an error in head mode). The draft model loads on its first use
    (LazyModelDraft), unless its files leave open whether it shares the target's vocabulary."""
    sources: dict[str, DraftSource] = {
        "none": NoDraft(),
        "ngram": NgramDraft(
            config.ngram_max,
            config.ngram_min,
            config.ngram_session_tokens,
            config.max_sessions,
            config.ngram_session_bytes,
        ),
    }
    draft_path = choice.draft_path
    if draft_path is not None:

        def load_draft() -> ModelDraft:
            draft_model = LlamaModel(
                draft_path,
                n_ctx=target.n_ctx,
                n_batch=config.n_batch,
                n_threads=config.n_threads,
                n_gpu_layers=config.n_gpu_layers,
                devices=devices.local,
            )
            try:
                return model_source(target, draft_model)
            except Exception:
                draft_model.close()
                raise

        vocabulary = relation_from_files(choice.target_path, draft_path)
        expected_load_s = LOAD_FIXED_S + LOAD_S_PER_MIB * draft_path.stat().st_size / 2**20
        model = LazyModelDraft(load_draft, vocabulary or "translated", expected_load_s)
        if vocabulary is None:  # only the loaded models can tell: load now
            model.load()
        sources["model"] = model
    head_dir = choice.head_dir
    if head_dir is not None:
        try:
            sources[HEAD] = HeadDraft.load(head_dir, choice.target_path, target.n_vocab)
        except EdgeSpecError as exc:
            if choice.mode == HEAD:
                close_sources(sources)
                raise
            # auto drafts without it: a broken head must not break generation.
            log.warning("the draft head in %s is not used: %s", head_dir, exc)
            head_dir = None
        except Exception:
            close_sources(sources)
            raise
    return sources, head_dir


def close_sources(sources: dict[str, DraftSource]) -> None:
    """Free what the sources hold: the draft model, where it was loaded."""
    model = sources.get("model")
    if isinstance(model, LazyModelDraft):
        model.close()


def model_source(target: LlamaModel, draft_model: LlamaModel) -> ModelDraft:
    """The draft model as a source: its token ids go to the target as they are when the two
    share a vocabulary; otherwise its text is re-tokenized for the target."""
    try:
        check_compatible(target, draft_model)
    except VocabMismatchError as mismatch:
        log.info("drafting across vocabularies (%s)", mismatch)
        info = draft_model.info
        return CrossVocabDraft(draft_model, target, [info.bos_id] if info.add_bos else [])
    return ModelDraft(draft_model)


def chat_template(config: EngineConfig, target: LlamaModel) -> ChatTemplate:
    """The template chats render with: the one configured, else the target's own, else a
    built-in for its architecture (logged)."""
    info = target.info
    template = choose_template(config.chat_template, info.chat_template, info.architecture)
    if template.source == "fallback":
        log.info(
            "%s has no chat template; chats use the built-in %s template",
            target.path.name,
            template.name,
        )
    return template


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """A manifest model name or a path (validated on load)."""
    from edge_spec.models import resolve

    return resolve(str(name_or_path))
