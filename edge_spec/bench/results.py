"""A bench run on disk: results.json (every run, the summaries, the versions and settings),
results.md (the summary tables and the per-prompt table against the noise floor) and plots."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edge_spec.bench.report import markdown_table, prompt_ratios, prompt_table, summarize
from edge_spec.bench.runner import Run, peak_rss_bytes, timestamp
from edge_spec.policy.types import CostCurve


def write_results(
    out: Path,
    runs: Sequence[Run],
    *,
    command: str,
    target: str,
    draft: str | None,
    settings: Mapping[str, Any],
    temperatures: Sequence[float],
    costs: CostCurve | None = None,
    sessions: bool = False,
    plots: bool = True,
) -> tuple[str, list[Path]]:
    """Write the run's files into `out`; returns the Markdown it wrote and the files."""
    from edge_spec import __version__
    from edge_spec.backend import llama_build, llama_cpp_version

    summaries = summarize(runs)
    per_prompt = prompt_ratios(runs, sessions=sessions)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "created": timestamp(),
        "command": command,
        "versions": {
            "edge_spec": __version__,
            "llama_cpp_python": llama_cpp_version(),
            "llama_cpp_build": llama_build(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "target": target,
        "draft": draft,
        "settings": dict(settings),
        "cost_curve": None
        if costs is None
        else {
            "verify_s": list(costs.verify_s),
            "draft_token_s": costs.draft_token_s,
            "ngram_s": costs.ngram_s,
        },
        "peak_rss_bytes": peak_rss_bytes(),
        "summaries": [s.to_dict() for s in summaries],
        "prompt_ratios": [r.to_dict() for r in per_prompt],
        "runs": [r.to_dict() for r in runs],
    }
    (out / "results.json").write_text(json.dumps(record, indent=1))
    tables = [markdown_table(summaries, t) for t in temperatures]
    tables.append(
        ("Per session" if sessions else "Per prompt")
        + ", decode tokens/s over the target alone's; the noise floor is the target alone "
        "run again (`none`), interleaved like every entry:\n\n" + prompt_table(per_prompt)
    )
    grammar = _grammar_lines(runs)
    if grammar:
        tables.append(grammar)
    walls = _wall_ratios(runs)
    if walls:
        tables.append(
            "Wall time of the whole process or request, the target alone's over each entry's "
            "(loading and prefill included): "
            + ", ".join(f"{name} {ratio:.2f}×" for name, ratio in walls.items())
        )
    text = "\n\n".join(tables) + "\n"
    (out / "results.md").write_text(text)
    files = [out / "results.json", out / "results.md"]
    if plots:
        from edge_spec.bench.plots import write_plots

        files += write_plots(summaries, out)
    return text, files


def _wall_ratios(runs: Sequence[Run]) -> dict[str, float]:
    """Σ target wall time / Σ entry wall time over the same runs (only runs measured from
    outside the process carry a wall time)."""
    totals: dict[str, float] = {}
    for run in runs:
        if run.wall_s > 0:
            totals[run.strategy] = totals.get(run.strategy, 0.0) + run.wall_s
    base = totals.get("target")
    if not base:
        return {}
    return {name: base / wall for name, wall in totals.items() if name != "target" and wall > 0}


def _grammar_lines(runs: Sequence[Run]) -> str:
    """Per entry under a grammar: the share of its tokens that were the grammar's forced text,
    drafted and accepted, and what the grammar's masks cost per token."""
    totals: dict[str, list[float]] = {}
    for run in runs:
        if run.constraint_s > 0:
            row = totals.setdefault(run.strategy, [0, 0, 0.0])
            row[0] += run.n_forced_accepted
            row[1] += run.n_generated
            row[2] += run.constraint_s
    if not totals:
        return ""
    lines = [
        "Under the grammar: the share of generated tokens that were its forced text (drafted "
        "and accepted), and its masks' cost per generated token:\n",
        "| entry | forced share | mask ms/token |",
        "|---|---|---|",
    ]
    for name, (forced, generated, seconds) in sorted(totals.items()):
        share = forced / generated if generated else 0.0
        per_token_ms = 1e3 * seconds / generated if generated else 0.0
        lines.append(f"| {name} | {share:.2f} | {per_token_ms:.3f} |")
    return "\n".join(lines)
