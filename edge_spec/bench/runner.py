"""The benchmark runner: every strategy on the same prompts, interleaved and repeated in one
process, so that machine noise hits them alike and speedups are ratios measured side by side.

A strategy is a draft mode plus a k policy (and k). "target" (the target alone, k = 0) is always
run: every speedup is against it, prompt by prompt.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from edge_spec.api import EdgeSpec, GenerationConfig, GenerationResult
from edge_spec.bench.peers import Peer, PeerResult
from edge_spec.decode.stats import GenerationStats
from edge_spec.policy.types import DEFAULT_K_MAX
from edge_spec.prompts import Prompt
from edge_spec.sampling.transform import SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Strategy:
    name: str
    draft_mode: str
    policy: str
    k: int | None = None  # the fixed policy's k
    k_max: int = DEFAULT_K_MAX
    tree_nodes: int | None = None  # token trees (GenerationConfig.tree_nodes)

    def config(
        self, max_tokens: int, sampling: SamplingParams, stop: tuple[str, ...] = ()
    ) -> GenerationConfig:
        return GenerationConfig(
            max_tokens=max_tokens,
            stop=stop,
            k=self.k,
            k_max=self.k_max,
            tree_nodes=self.tree_nodes,
            draft_mode=self.draft_mode,  # type: ignore[arg-type]
            policy=self.policy,  # type: ignore[arg-type]
            sampling=sampling,
        )


TARGET = Strategy("target", "none", "fixed", k=0)
# The target alone again, interleaved like any other entry: its ratio to "target" is the run's
# own noise floor (what an entry exactly as fast as the target alone measures).
NULL = Strategy("none", "none", "fixed", k=0)

# Completion prompts are few-shot transcripts: without these a base model runs on into the
# next "Question:" or "User:" turn it invented. Chat prompts end at the template's EOS.
COMPLETION_STOPS = ("\nQuestion:", "\n\nProblem:", "\nUser:", "\n```\n", "\n\nText:")


def parse_strategy(spec: str) -> Strategy:
    """'target'; 'none' (the target alone again: the noise floor); a draft mode alone ('auto',
    'model', 'ngram', 'head': the cost policy, as the API and the CLI run them by default); or
    a mode with a policy: 'model-k3', 'ngram-k4' (fixed k), 'model-heuristic', 'ngram-cost'
    (the same as 'ngram'); any of these with '-tN': token trees of up to N branch tokens
    ('ngram-k4-t4', 'auto-t0': chains only)."""
    if spec == "target":
        return TARGET
    if spec == "none":
        return NULL
    tree_nodes = None
    head, _, tail = spec.rpartition("-")
    if head and tail.startswith("t") and tail[1:].isdigit():
        spec_core, tree_nodes = head, int(tail[1:])
    else:
        spec_core = spec
    mode, _, how = spec_core.partition("-")
    if mode not in ("model", "ngram", "auto", "head"):
        raise ValueError(f"unknown strategy {spec!r}")
    if not how:
        return Strategy(spec, mode, "cost", tree_nodes=tree_nodes)
    if how.startswith("k") and how[1:].isdigit():
        return Strategy(spec, mode, "fixed", k=int(how[1:]), tree_nodes=tree_nodes)
    if how in ("heuristic", "cost"):
        return Strategy(spec, mode, how, tree_nodes=tree_nodes)
    raise ValueError(f"unknown strategy {spec!r}")


@dataclass(frozen=True)
class Run:
    """One generation: a prompt under a strategy at a temperature, in repeat r."""

    prompt_id: str
    category: str
    kind: str
    strategy: str
    temperature: float
    repeat: int
    n_prompt_tokens: int
    n_generated: int
    decode_s: float
    tokens_per_s: float
    n_steps: int
    n_drafted: int
    n_accepted: int
    drafted_per_position: tuple[int, ...]
    accepted_per_position: tuple[int, ...]
    steps_by_source: dict[str, int]
    k_chosen: tuple[int, ...]
    prefill_s: float
    draft_s: float
    verify_s: float
    other_s: float
    finish_reason: str
    token_ids: tuple[int, ...] = field(repr=False)
    # Of decode_s, the time inside llama_decode (both models), and the rest: the runtime's own
    # per-step work. 0 for peers and for results recorded before they were measured.
    llama_decode_s: float = 0.0
    overhead_s: float = 0.0
    n_tree_steps: int = 0  # steps that verified a token tree
    n_branch_accepted: int = 0  # tokens accepted along a tree's branch
    # Measured outside the engine (bench/outside.py): the whole process or request, from the
    # caller's side. 0 in-process.
    wall_s: float = 0.0
    # Under a grammar: its forced text's accepted tokens, and the time its masks took.
    n_forced_accepted: int = 0
    constraint_s: float = 0.0
    # The steps that drafted nothing: their time, and of it the time outside llama_decode.
    plain_s: float = 0.0
    plain_overhead_s: float = 0.0

    @classmethod
    def of(
        cls,
        prompt: Prompt,
        strategy: Strategy,
        temperature: float,
        repeat: int,
        result: GenerationResult,
    ) -> Run:
        return cls.of_stats(
            prompt,
            strategy.name,
            temperature,
            repeat,
            result.stats,
            result.finish_reason,
            result.token_ids,
        )

    @classmethod
    def of_stats(
        cls,
        prompt: Prompt,
        name: str,
        temperature: float,
        repeat: int,
        s: GenerationStats,
        finish_reason: str,
        token_ids: tuple[int, ...],
        wall_s: float = 0.0,
    ) -> Run:
        decode_s = s.total_s - s.prefill_s
        return cls(
            prompt.id,
            prompt.category,
            prompt.kind,
            name,
            temperature,
            repeat,
            s.n_prompt_tokens,
            s.n_generated,
            decode_s,
            s.tokens_per_s,
            s.n_steps,
            s.n_drafted,
            s.n_accepted,
            s.drafted_per_position,
            s.accepted_per_position,
            s.steps_by_source,
            s.k_chosen,
            s.prefill_s,
            s.draft_s,
            s.verify_s,
            s.other_s,
            finish_reason,
            token_ids,
            s.decode_s,
            s.overhead_s,
            s.n_tree_steps,
            s.n_branch_accepted,
            wall_s,
            s.accepted_by_source.get("grammar", 0),
            s.constraint_s,
            s.plain_s,
            s.plain_overhead_s,
        )

    @classmethod
    def of_peer(
        cls, prompt: Prompt, name: str, temperature: float, repeat: int, result: PeerResult
    ) -> Run:
        """A peer reports totals only: no per-position counts, sources or k histogram."""
        r = result
        return cls(
            prompt.id,
            prompt.category,
            prompt.kind,
            name,
            temperature,
            repeat,
            0,
            r.n_generated,
            r.decode_s,
            r.n_generated / r.decode_s if r.decode_s > 0 else 0.0,
            r.n_steps,
            r.n_drafted,
            r.n_accepted,
            (),
            (),
            {},
            (),
            r.prefill_s,
            0.0,
            0.0,
            0.0,
            r.finish_reason,
            r.token_ids,
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["token_ids"] = list(self.token_ids)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Run:
        """The inverse of to_dict (a results.json run; keys this version lacks are ignored)."""
        kept = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        for name in ("drafted_per_position", "accepted_per_position", "k_chosen", "token_ids"):
            if name in kept:
                kept[name] = tuple(kept[name])
        return cls(**kept)


def plan_entries(strategies: Sequence[Strategy], peers: Sequence[Peer]) -> list[Strategy | Peer]:
    """What a bench runs, in its first order: the target alone, the target alone again (the
    noise floor), each strategy once, then the peers."""
    own = (TARGET.name, NULL.name)
    return [TARGET, NULL, *[s for s in strategies if s.name not in own], *peers]


def run_bench(
    spec: EdgeSpec,
    prompts: Sequence[Prompt],
    strategies: Sequence[Strategy],
    *,
    temperatures: Sequence[float] = (0.0,),
    max_tokens: int = 64,
    repeats: int = 1,
    chat: bool = False,
    seed: int = 0,
    peers: Sequence[Peer] = (),
    on_run: Callable[[Run], None] | None = None,
) -> list[Run]:
    """Runs every (prompt, strategy or peer, temperature) `repeats` times. Within a prompt the
    order rotates, so no strategy always runs first (cold caches) or last. With peers, nobody
    gets stop strings (the peers have none): every run generates up to max_tokens or EOS."""
    plan = plan_entries(strategies, peers)
    runs: list[Run] = []
    # Peers have no stop strings: then nobody gets them (up to max_tokens or EOS for all).
    stop = () if chat or peers else COMPLETION_STOPS
    warm = prompts[0].completion if prompts else "Hello"
    spec.generate(warm, max_tokens=8, draft_mode="none")  # page the weights in
    for repeat in range(repeats):
        for i, prompt in enumerate(prompts):
            text = spec.render_chat(prompt.messages) if chat else prompt.completion
            order = plan[i % len(plan) :] + plan[: i % len(plan)]
            for temperature in temperatures:
                sampling = SamplingParams(temperature=temperature, seed=seed + 1000 * repeat + i)
                for entry in order:
                    run = _run_one(spec, entry, prompt, text, sampling, repeat, max_tokens, stop)
                    runs.append(run)
                    if on_run is not None:
                        on_run(run)
    return runs


def _run_one(
    spec: EdgeSpec,
    entry: Strategy | Peer,
    prompt: Prompt,
    text: str,
    sampling: SamplingParams,
    repeat: int,
    max_tokens: int,
    stop: tuple[str, ...],
) -> Run:
    temperature = sampling.temperature
    spec.clear_session()  # no run drafts from another run's output of the same prompt
    if isinstance(entry, Strategy):
        result = spec.generate(text, entry.config(max_tokens, sampling, stop))
        return Run.of(prompt, entry, temperature, repeat, result)
    ids = spec.tokenize(text)
    peer_result = entry.run(text, ids, max_tokens, temperature, sampling.seed or 0)
    return Run.of_peer(prompt, entry.name, temperature, repeat, peer_result)


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if peak > 1 << 32 else peak * 1024)  # bytes on macOS, KiB on Linux


def timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
