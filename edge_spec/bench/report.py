"""Aggregating benchmark runs: per category, temperature and strategy, tokens/s and the speedup
over the target alone (a ratio of aggregates over the same prompts, with a bootstrap confidence
interval over prompts), acceptance, acceptance by position, chosen k and the time split."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edge_spec.bench.runner import NULL, TARGET, Run

ALL = "all"
# Aggregate rows over every category of one kind ("input_reusing", "generative"), named so.
KIND_ROWS = ("input_reusing", "generative")


@dataclass(frozen=True)
class Summary:
    category: str
    temperature: float
    strategy: str
    n_prompts: int
    n_generated: int
    tokens_per_s: float
    speedup: float  # aggregate tokens/s over the target alone's, on the same prompts
    speedup_ci95: tuple[float, float]
    acceptance_rate: float
    mean_accepted_per_step: float
    acceptance_per_position: tuple[float, ...]
    k_chosen: tuple[int, ...]
    steps_by_source: dict[str, int]
    time_split_s: dict[str, float]
    # Orchestration: the wall time after the prefill that is not inside llama_decode.
    overhead_per_step_ms: float = 0.0
    overhead_fraction: float = 0.0
    # The same over the steps that drafted nothing (what a request that never drafts pays).
    plain_overhead_fraction: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(runs: Sequence[Run], *, n_boot: int = 2000, seed: int = 0) -> list[Summary]:
    """One Summary per (category, temperature, strategy), plus per (temperature, strategy) the
    kinds' aggregates ("input_reusing", "generative": every category of that kind together,
    when the runs cover both kinds) and "all"."""
    groups: dict[tuple[str, float, str], list[Run]] = defaultdict(list)
    both_kinds = {run.kind for run in runs} >= set(KIND_ROWS)
    for run in runs:
        kind = (run.kind,) if both_kinds and run.kind in KIND_ROWS else ()
        for category in (run.category, *kind, ALL):
            groups[(category, run.temperature, run.strategy)].append(run)
    rng = np.random.default_rng(seed)
    out = []
    for (category, temperature, strategy), group in sorted(groups.items(), key=_order):
        baseline = groups.get((category, temperature, TARGET.name), [])
        out.append(_summary(category, temperature, strategy, group, baseline, rng, n_boot))
    return out


def _order(
    item: tuple[tuple[str, float, str], list[Run]],
) -> tuple[int, str, float, bool, str]:
    (category, temperature, strategy), _ = item
    rank = 2 if category == ALL else 1 if category in KIND_ROWS else 0
    return (rank, category, temperature, strategy != TARGET.name, strategy)


def _summary(
    category: str,
    temperature: float,
    strategy: str,
    group: list[Run],
    baseline: list[Run],
    rng: np.random.Generator,
    n_boot: int,
) -> Summary:
    tokens = sum(r.n_generated for r in group)
    decode_s = sum(r.decode_s for r in group)
    drafted = _sum_positions(r.drafted_per_position for r in group)
    accepted = _sum_positions(r.accepted_per_position for r in group)
    steps = sum(r.n_steps for r in group)
    plain_s = sum(r.plain_s for r in group)
    plain_overhead_s = sum(r.plain_overhead_s for r in group)
    n_drafted = sum(r.n_drafted for r in group)  # totals: peers report no per-position counts
    n_accepted = sum(r.n_accepted for r in group)
    k_hist = _sum_positions(r.k_chosen for r in group)
    sources: dict[str, int] = defaultdict(int)
    for r in group:
        for name, n in r.steps_by_source.items():
            sources[name] += n
    speedup, ci = _speedup(group, baseline, rng, n_boot)
    return Summary(
        category=category,
        temperature=temperature,
        strategy=strategy,
        n_prompts=len({r.prompt_id for r in group}),
        n_generated=tokens,
        tokens_per_s=tokens / decode_s if decode_s else 0.0,
        speedup=speedup,
        speedup_ci95=ci,
        acceptance_rate=n_accepted / n_drafted if n_drafted else 0.0,
        mean_accepted_per_step=n_accepted / steps if steps else 0.0,
        acceptance_per_position=tuple(a / d if d else 0.0 for a, d in zip(accepted, drafted)),
        k_chosen=tuple(k_hist),
        steps_by_source=dict(sources),
        time_split_s={
            "prefill": sum(r.prefill_s for r in group),
            "draft": sum(r.draft_s for r in group),
            "verify": sum(r.verify_s for r in group),
            "other": sum(r.other_s for r in group),
            "llama_decode": sum(r.llama_decode_s for r in group),
            "overhead": sum(r.overhead_s for r in group),
        },
        overhead_per_step_ms=1e3 * sum(r.overhead_s for r in group) / steps if steps else 0.0,
        overhead_fraction=sum(r.overhead_s for r in group) / decode_s if decode_s else 0.0,
        plain_overhead_fraction=plain_overhead_s / plain_s if plain_s else 0.0,
    )


def _speedup(
    group: list[Run], baseline: list[Run], rng: np.random.Generator, n_boot: int
) -> tuple[float, tuple[float, float]]:
    """Σ tokens/Σ time of the strategy over the same for the target, on the prompts both ran;
    the interval resamples prompts (paired: a prompt brings both its runs)."""

    def key(r: Run) -> tuple[str, int]:
        return (r.prompt_id, r.repeat)

    base = {key(r): r for r in baseline}
    pairs = [(r, base[key(r)]) for r in group if key(r) in base]
    if not pairs:
        return float("nan"), (float("nan"), float("nan"))
    # per pair: (strategy tokens, strategy seconds, target tokens, target seconds)
    data = np.array([[s.n_generated, s.decode_s, b.n_generated, b.decode_s] for s, b in pairs])

    def ratio(rows: np.ndarray) -> float:
        return float((rows[:, 0].sum() / rows[:, 1].sum()) / (rows[:, 2].sum() / rows[:, 3].sum()))

    point = ratio(data)
    if len(pairs) < 2:
        return point, (point, point)
    idx = rng.integers(0, len(pairs), size=(n_boot, len(pairs)))
    boots = np.array([ratio(data[i]) for i in idx])
    low, high = np.percentile(boots, [2.5, 97.5])
    return point, (float(low), float(high))


def _sum_positions(rows: Iterable[Sequence[int]]) -> list[int]:
    total: list[int] = []
    for row in rows:
        total += [0] * (len(row) - len(total))
        for i, value in enumerate(row):
            total[i] += value
    return total


def markdown_table(summaries: Sequence[Summary], temperature: float | None = None) -> str:
    """One row per (category, strategy): tokens/s, speedup with its 95% interval, acceptance,
    accepted per step, and the most chosen k."""
    lines = [
        "| category | T | strategy | tokens/s | speedup (95% CI) | acceptance | "
        "accepted/step | overhead/step | overhead, plain steps | k chosen (0,1,2,..) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        if temperature is not None and s.temperature != temperature:
            continue
        lines.append(
            f"| {s.category} | {s.temperature:g} | {s.strategy} | {s.tokens_per_s:.1f} | "
            f"{s.speedup:.2f}× ({s.speedup_ci95[0]:.2f}–{s.speedup_ci95[1]:.2f}) | "
            f"{s.acceptance_rate:.2f} | {s.mean_accepted_per_step:.2f} | "
            f"{_overhead(s)} | {_plain(s)} | {' '.join(map(str, s.k_chosen)) or '-'} |"
        )
    return "\n".join(lines)


def _overhead(s: Summary) -> str:
    """Orchestration per step and its share of the wall time ("-" where not measured)."""
    if s.overhead_fraction <= 0:
        return "-"
    return f"{s.overhead_per_step_ms:.2f} ms ({100 * s.overhead_fraction:.1f} %)"


def _plain(s: Summary) -> str:
    """The overhead's share of the steps that drafted nothing ("-" where not measured)."""
    return f"{100 * s.plain_overhead_fraction:.1f} %" if s.plain_overhead_fraction > 0 else "-"


@dataclass(frozen=True)
class PromptRatios:
    """One entry's per-prompt speed over the target alone at one temperature, judged against
    the run's own noise floor: the target alone again ("none"), interleaved like every entry,
    whose per-prompt ratios are what an entry exactly as fast as the target measures here."""

    temperature: float
    strategy: str
    ratios: dict[str, float]  # prompt id -> decode tokens/s over the target alone's
    geometric_mean: float
    floor_low: float  # the noise floor's lowest per-prompt ratio (nan without "none")
    below_floor: tuple[str, ...]  # prompts slower than anything the floor showed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prompt_ratios(runs: Sequence[Run], *, sessions: bool = False) -> list[PromptRatios]:
    """Per (temperature, entry), each prompt's decode rate over the target alone's (tokens
    over seconds summed over its repeats); sessions=True pools an agentic run's turns by
    session (ids "session/turn")."""
    out = []
    for temperature in sorted({r.temperature for r in runs}):
        at_t = [r for r in runs if r.temperature == temperature]
        names = sorted({r.strategy for r in at_t} - {TARGET.name})
        floor = _pooled(at_t, NULL.name, sessions)
        floor_low = min(floor.values()) if floor else float("nan")
        for name in names:
            ratios = _pooled(at_t, name, sessions)
            if not ratios:
                continue
            gmean = float(np.exp(np.mean(np.log(list(ratios.values())))))
            below = tuple(p for p, r in sorted(ratios.items(), key=lambda i: i[1]) if r < floor_low)
            out.append(PromptRatios(temperature, name, ratios, gmean, floor_low, below))
    return out


def _pooled(runs: Sequence[Run], strategy: str, sessions: bool) -> dict[str, float]:
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for run in runs:
        if run.strategy not in (strategy, TARGET.name):
            continue
        prompt_id = run.prompt_id.split("/")[0] if sessions else run.prompt_id
        totals[(run.strategy, prompt_id)][0] += run.n_generated
        totals[(run.strategy, prompt_id)][1] += run.decode_s
    ratios = {}
    for (name, prompt), (tokens, seconds) in totals.items():
        base = totals.get((TARGET.name, prompt))
        if name == strategy and base and seconds > 0 and base[0] > 0:
            ratios[prompt] = (tokens / seconds) / (base[0] / base[1])
    return ratios


def prompt_table(rows: Sequence[PromptRatios], worst: int = 3) -> str:
    """Per entry: the geometric mean of its per-prompt ratios, its slowest prompts, and which
    prompts fall below the noise floor (the target alone against itself, per prompt)."""
    lines = [
        "| T | entry | prompts | geometric mean | slowest | below the noise floor |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        slowest = sorted(row.ratios.items(), key=lambda item: item[1])[:worst]
        floor = (
            f"{len(row.below_floor)} (floor {row.floor_low:.3f}×)"
            if not np.isnan(row.floor_low)
            else "- (no floor measured)"
        )
        lines.append(
            f"| {row.temperature:g} | {row.strategy} | {len(row.ratios)} | "
            f"{row.geometric_mean:.3f}× | "
            + ", ".join(f"{p} {r:.3f}×" for p, r in slowest)
            + f" | {floor} |"
        )
    return "\n".join(lines)
