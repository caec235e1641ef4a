"""The simulate report: every policy on every device profile, against the target alone, the best
fixed k and the oracle (`edge-spec simulate`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from edge_spec.errors import InvalidRequestError
from edge_spec.simulate.curves import list_profiles, load_profile
from edge_spec.simulate.replay import DeviceReport, policy_factories, simulate
from edge_spec.simulate.traces import K_MAX, TraceSet, load_traces


def report_dict(reports: Sequence[DeviceReport], traces: TraceSet) -> dict:
    out: dict = {
        "traces": traces.path,
        "target": traces.target,
        "draft": traces.draft,
        "n_prompts": len(traces.prompts),
        "devices": [],
    }
    for rep in reports:
        oracle_tps, none_tps = rep.tps("oracle"), rep.tps("none")
        best_fixed = rep.best_fixed
        fixed_tps = rep.tps(best_fixed)
        policies = {}
        k_max = max(
            (int(n.rsplit("-", 1)[1]) for n in rep.results if n.startswith("fixed-")), default=8
        )
        order = [*policy_factories(k_max), "oracle-static", "oracle"]
        for name in sorted(rep.results, key=order.index):
            res = rep.results[name]
            policies[name] = {
                "tokens_per_s": round(res.tokens_per_s, 3),
                "vs_oracle": round(res.tokens_per_s / oracle_tps, 4),
                "vs_best_fixed": round(res.tokens_per_s / fixed_tps, 4),
                "vs_target_alone": round(res.tokens_per_s / none_tps, 4),
                "tokens_per_step": round(res.n_tokens / max(res.n_steps, 1), 3),
                "acceptance": round(res.n_accepted / res.n_drafted, 3) if res.n_drafted else None,
                "steps_by_source": res.steps_by_source,
                "tree_steps": res.n_tree_steps,
                "branch_tokens_accepted": res.n_branch_accepted,
            }
        categories = {
            cat: {
                name: round(r.tokens_per_s / runs["none"].tokens_per_s, 4)
                for name, r in runs.items()
                if name in ("cost", "oracle", "oracle-static", best_fixed)
            }
            for cat, runs in rep.by_category.items()
        }
        out["devices"].append(
            {
                "profile": rep.profile.name,
                "source": rep.profile.source,
                "c": rep.profile.c,
                "best_fixed": best_fixed,
                "policies": policies,
                "vs_target_alone_by_category": categories,
            }
        )
    return out


def format_report(data: dict) -> str:
    lines = [
        f"traces: {data['traces']} ({data['n_prompts']} prompts; target {data['target']}, "
        f"draft {data['draft']})"
    ]
    for dev in data["devices"]:
        lines += [
            "",
            f"== {dev['profile']} (c={dev['c']}; best fixed: {dev['best_fixed']})",
            f"{'policy':<18} {'tokens/s':>9} {'x oracle':>9} {'x best fixed':>13} "
            f"{'x target':>9} {'tok/step':>9} {'trees':>6}",
        ]
        for name, p in dev["policies"].items():
            lines.append(
                f"{name:<18} {p['tokens_per_s']:>9.2f} {p['vs_oracle']:>9.3f} "
                f"{p['vs_best_fixed']:>13.3f} {p['vs_target_alone']:>9.3f} "
                f"{p['tokens_per_step']:>9.2f} {p.get('tree_steps', 0):>6}"
            )
        cats = dev["vs_target_alone_by_category"]
        lines.append(
            "x target alone by category: "
            + "; ".join(
                f"{cat} " + " ".join(f"{n}={v:.2f}" for n, v in vals.items())
                for cat, vals in cats.items()
            )
        )
    return "\n".join(lines)


def run_report(
    paths: Sequence[str],
    profile_names: Sequence[str] | None,
    policies: Sequence[str] | None,
    k_max: int,
    draft_c: str,
) -> dict:
    """Replay the traces in `paths` against the named profiles (None: every bundled one) and
    return the report (report_dict). draft_c: "profile" (each profile's own model-draft cost
    ratio), "trace" (the one measured when the traces were recorded) or a number. Raises
    InvalidRequestError on bad inputs."""
    try:
        sets = [load_traces(p) for p in paths]
        profiles = [load_profile(p) for p in (profile_names or list_profiles())]
        if k_max < 1 or k_max > K_MAX:
            raise ValueError(f"--k-max must be in 1..{K_MAX}, got {k_max}")
        traces = TraceSet(
            ", ".join(paths),
            sets[0].target,
            sets[0].draft,
            sets[0].meta,
            tuple(p for s in sets for p in s.prompts),
        )
        if draft_c == "profile" and traces.draft == "head":
            # A draft head has no per-device profile: its cost ratio measured when the traces
            # were recorded stands for every device (its weights are a few per cent of the
            # target's, so its cost scales with the target's wherever the pass is bound by
            # memory traffic).
            draft_c = "trace"
        if draft_c != "profile":
            c = float(traces.meta["measured"]["c"] if draft_c == "trace" else draft_c)
            if not 0 <= c < 100:
                raise ValueError(f"--draft-c must be in [0, 100), got {c}")
            profiles = [replace(p, c=c) for p in profiles]
        reports = simulate(traces, profiles, policies, k_max)
    except (OSError, ValueError, KeyError) as exc:
        raise InvalidRequestError(f"simulate: {exc}") from exc
    return report_dict(reports, traces)
