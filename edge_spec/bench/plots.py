"""PNG plots of a benchmark: speedup per category, acceptance by draft position, and tokens/s
against k for the fixed-k strategies. matplotlib is imported here only (Agg backend)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from edge_spec.bench.report import ALL, Summary
from edge_spec.bench.runner import TARGET

FIXED_K = re.compile(r"^(model|ngram)-k(\d+)$")


def write_plots(summaries: Sequence[Summary], out: Path) -> list[Path]:
    """Writes the plots into `out`; returns their paths (one set per temperature)."""
    import matplotlib
    from cycler import cycler

    matplotlib.use("Agg")
    # 20 distinct colours: a full bench has more strategies than the default cycle's 10.
    matplotlib.rcParams["axes.prop_cycle"] = cycler(color=matplotlib.colormaps["tab20"].colors)
    paths = []
    for temperature in sorted({s.temperature for s in summaries}):
        rows = [s for s in summaries if s.temperature == temperature]
        tag = f"t{temperature:g}".replace(".", "_")
        paths.append(_speedup_by_category(rows, out / f"speedup_by_category_{tag}.png"))
        paths.append(_acceptance_by_position(rows, out / f"acceptance_by_position_{tag}.png"))
        paths.append(_tokens_per_s_by_k(rows, out / f"tokens_per_s_by_k_{tag}.png"))
    return paths


def _speedup_by_category(rows: Sequence[Summary], path: Path) -> Path:
    import matplotlib.pyplot as plt

    categories = list(dict.fromkeys(s.category for s in rows))
    strategies = [n for n in dict.fromkeys(s.strategy for s in rows) if n != TARGET.name]
    by_key = {(s.category, s.strategy): s for s in rows}
    width = 0.8 / max(len(strategies), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(categories)), 4))
    for j, name in enumerate(strategies):
        xs, ys, lo, hi = [], [], [], []
        for i, category in enumerate(categories):
            s = by_key.get((category, name))
            if s is None:
                continue
            xs.append(i + (j - (len(strategies) - 1) / 2) * width)
            ys.append(s.speedup)
            lo.append(max(s.speedup - s.speedup_ci95[0], 0.0))
            hi.append(max(s.speedup_ci95[1] - s.speedup, 0.0))
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(categories)), [c.replace("_", "\n") for c in categories], fontsize=8)
    ax.set_ylabel("speed over the target alone (×)")
    ax.set_title(f"Speedup per category, T={rows[0].temperature:g} (95% intervals)")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def _acceptance_by_position(rows: Sequence[Summary], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in rows:
        if s.category == ALL and s.acceptance_per_position:
            positions = range(1, len(s.acceptance_per_position) + 1)
            ax.plot(positions, s.acceptance_per_position, marker="o", label=s.strategy)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate at that position")
    ax.set_ylim(0, 1)
    ax.set_title(f"Acceptance by draft position, all categories, T={rows[0].temperature:g}")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def _tokens_per_s_by_k(rows: Sequence[Summary], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    overall = [s for s in rows if s.category == ALL]
    series: dict[str, list[tuple[int, float]]] = {}
    for s in overall:
        match = FIXED_K.match(s.strategy)
        if match:
            series.setdefault(match.group(1), []).append((int(match.group(2)), s.tokens_per_s))
    for source, points in sorted(series.items()):
        points.sort()
        ax.plot(
            [k for k, _ in points], [v for _, v in points], marker="o", label=f"{source}, fixed k"
        )
    others = [s for s in overall if not FIXED_K.match(s.strategy)]
    for i, s in enumerate(others):
        style = "-" if s.strategy == TARGET.name else "--"
        color = "black" if s.strategy == TARGET.name else f"C{(i + 4) % 10}"
        ax.axhline(s.tokens_per_s, linestyle=style, color=color, linewidth=1, label=s.strategy)
    ax.set_xlabel("k (draft length)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"Tokens/s against k, all categories, T={rows[0].temperature:g}")
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig: object, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return path
