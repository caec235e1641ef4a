"""Benchmark aggregation (pure) and the strategy grammar."""

from __future__ import annotations

import pytest

from edge_spec.bench.report import ALL, markdown_table, summarize
from edge_spec.bench.runner import TARGET, Run, parse_strategy


def run(
    prompt: str,
    category: str,
    strategy: str,
    tokens: int,
    seconds: float,
    drafted=(),
    accepted=(),
    k_chosen=(0,),
) -> Run:
    return Run(
        prompt_id=prompt,
        category=category,
        kind="input_reusing",
        strategy=strategy,
        temperature=0.0,
        repeat=0,
        n_prompt_tokens=10,
        n_generated=tokens,
        decode_s=seconds,
        tokens_per_s=tokens / seconds,
        n_steps=tokens,
        n_drafted=sum(drafted),
        n_accepted=sum(accepted),
        drafted_per_position=tuple(drafted),
        accepted_per_position=tuple(accepted),
        steps_by_source={"none": tokens},
        k_chosen=tuple(k_chosen),
        prefill_s=0.0,
        draft_s=0.0,
        verify_s=seconds,
        other_s=0.0,
        finish_reason="length",
        token_ids=(),
    )


def test_parse_strategy() -> None:
    assert parse_strategy("target") == TARGET
    assert parse_strategy("model-k3").k == 3 and parse_strategy("model-k3").policy == "fixed"
    assert parse_strategy("ngram-cost").draft_mode == "ngram"
    assert parse_strategy("auto").policy == "cost"
    # A draft mode alone runs the cost policy, as the API and the CLI do by default.
    assert parse_strategy("ngram").policy == parse_strategy("model").policy == "cost"
    assert parse_strategy("ngram").draft_mode == "ngram"
    null = parse_strategy("none")  # the target alone under another name: the noise floor
    assert (null.draft_mode, null.k, null.name) == ("none", 0, "none")
    tree = parse_strategy("ngram-k4-t4")  # token trees: up to 4 branch tokens
    assert (tree.policy, tree.k, tree.tree_nodes, tree.name) == ("fixed", 4, 4, "ngram-k4-t4")
    assert parse_strategy("auto-t0").tree_nodes == 0 and parse_strategy("auto").tree_nodes is None
    for bad in ("foo", "foo-k2", "model-kx", "ngram-magic", "t4", "ngram-tx"):
        with pytest.raises(ValueError):
            parse_strategy(bad)


def test_speedup_is_a_ratio_of_aggregates_over_the_same_prompts() -> None:
    runs = [
        run("a", "code", "target", 60, 1.0),
        run("b", "code", "target", 60, 1.0),
        run("a", "code", "fast", 60, 0.5, drafted=(10, 5), accepted=(8, 3), k_chosen=(0, 0, 10)),
        run("b", "code", "fast", 60, 0.5, drafted=(10,), accepted=(5,), k_chosen=(2, 8)),
        run("c", "math", "target", 30, 1.0),
        run("c", "math", "fast", 30, 1.5),
    ]
    by_key = {(s.category, s.strategy): s for s in summarize(runs, n_boot=200)}
    code = by_key[("code", "fast")]
    assert code.speedup == pytest.approx(2.0)
    assert code.speedup_ci95 == pytest.approx((2.0, 2.0))
    assert code.acceptance_rate == pytest.approx(16 / 25)
    assert code.acceptance_per_position == pytest.approx((13 / 20, 3 / 5))
    assert code.k_chosen == (2, 8, 10)
    assert by_key[("math", "fast")].speedup == pytest.approx(1 / 1.5)
    overall = by_key[(ALL, "fast")]
    assert overall.speedup == pytest.approx((150 / 2.5) / (150 / 3.0))
    low, high = overall.speedup_ci95
    assert low <= overall.speedup <= high
    assert by_key[(ALL, "target")].speedup == pytest.approx(1.0)
    table = markdown_table(summarize(runs, n_boot=50))
    assert "| code | 0 | fast |" in table and "2.00×" in table


def test_stats_keep_the_plain_steps_overhead_apart() -> None:
    """What a request that never drafts pays: the time outside llama_decode of the steps that
    drafted nothing, apart from the drafting steps' (which also verify and roll back)."""
    from edge_spec.decode.engine import Step
    from edge_spec.decode.stats import StatsCollector

    collector = StatsCollector()
    collector.step(Step((5,), "none", 0, 0, 0, 0.001, 0.019, decode_s=0.0185))
    collector.step(Step((6, 7), "ngram", 2, 2, 1, 0.002, 0.030, decode_s=0.0260))
    collector.step(Step((8,), "none", 0, 0, 0, 0.001, 0.021, decode_s=0.0200))
    s = collector.result(n_prompt=3, n_generated=4, total_s=0.1)
    assert s.n_plain_steps == 2
    assert s.plain_s == pytest.approx(0.042)
    assert s.plain_overhead_s == pytest.approx(0.0035)
    assert s.plain_overhead_fraction == pytest.approx(0.0035 / 0.042)
    assert s.to_dict()["plain_overhead_fraction"] == pytest.approx(0.0035 / 0.042)
    assert type(s).from_dict(s.to_dict()) == s


@pytest.mark.models
def test_bench_command_writes_results(tmp_path) -> None:
    import json
    import subprocess
    import sys

    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_spec.cli",
            "bench",
            "--quick",
            "--categories",
            "code_editing",
            "--strategies",
            "auto",
            "model-k2",
            "lcpp-lookup",
            "--max-tokens",
            "16",
            "--out",
            str(out),
            "--no-progress",
            "--no-plots",  # test_plots_are_written draws them
        ],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "results.json").read_text())
    strategies = {"target", "none", "auto", "model-k2", "lcpp-lookup"}
    assert {r["strategy"] for r in record["runs"]} == strategies
    # 2 quick prompts x (the target alone twice + 2 strategies + 1 peer)
    assert len(record["runs"]) == 2 * 5
    assert record["versions"]["llama_cpp_python"] and record["peak_rss_bytes"] > 0
    assert "CPU" in record["versions"]["llama_cpp_build"]
    summaries = {(s["category"], s["strategy"]): s for s in record["summaries"]}
    assert summaries[("code_editing", "target")]["speedup"] == pytest.approx(1.0)
    assert summaries[("all", "model-k2")]["acceptance_rate"] > 0
    markdown = (out / "results.md").read_text()
    assert "| code_editing | 0 | auto |" in markdown
    # Each entry's per-prompt ratios, judged against the target alone against itself.
    floor = next(r for r in record["prompt_ratios"] if r["strategy"] == "none")
    assert len(floor["ratios"]) == 2 and floor["floor_low"] == min(floor["ratios"].values())
    assert "| 0 | auto | 2 |" in markdown and "noise floor" in markdown
    # The written runs read back as the same Runs.
    reread = [Run.from_dict(raw) for raw in record["runs"]]
    assert json.loads(json.dumps([r.to_dict() for r in reread])) == record["runs"]
    assert json.loads(json.dumps([s.to_dict() for s in summarize(reread)])) == record["summaries"]
    # The peer (llama-cpp-python's prompt lookup) drafted, and its greedy output is the
    # target's own on most prompts (batched logits may flip a near-tie, so not on all).
    peer = [r for r in record["runs"] if r["strategy"] == "lcpp-lookup"]
    assert sum(r["n_drafted"] for r in peer) > 0 and all(r["n_generated"] > 0 for r in peer)
    target = {r["prompt_id"]: r["token_ids"] for r in record["runs"] if r["strategy"] == "target"}
    same = sum(r["token_ids"] == target[r["prompt_id"]] for r in peer)
    assert same >= len(peer) - 1, same


@pytest.mark.models
@pytest.mark.parametrize("where", ["--fresh-processes", "--via-server"])
def test_the_bench_from_outside_the_process(tmp_path, where: str) -> None:
    """Every run as its own `edge-spec generate` process, or every request through an
    `edge-spec serve` per entry with the openai client: the same report, with wall times."""
    import json
    import subprocess
    import sys

    # A prompt set of one's own (a JSON file): one of the copy set's quick prompts.
    from importlib import resources

    copy_set = json.loads(
        resources.files("edge_spec").joinpath("prompt_sets/copy.json").read_text()
    )
    copy_set["prompts"] = [p for p in copy_set["prompts"] if p.get("quick")][:1]
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(copy_set))
    out = tmp_path / "bench"
    command = [sys.executable, "-m", "edge_spec.cli", "bench", "--chat"]
    command += ["--prompt-set", str(mine), "--strategies", "ngram"]
    command += ["--max-tokens", "32", "--out", str(out), "--no-progress", "--no-plots", where]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((out / "results.json").read_text())
    runs = record["runs"]
    assert len(runs) == 3  # 1 copy prompt x (target, none, ngram)
    assert {r["strategy"] for r in runs} == {"target", "none", "ngram"}
    assert all(r["wall_s"] > 0 and r["n_generated"] > 0 for r in runs)
    assert any(r["n_drafted"] > 0 for r in runs if r["strategy"] == "ngram")
    assert "Wall time of the whole process or request" in (out / "results.md").read_text()


def test_plots_are_written(tmp_path) -> None:
    from edge_spec.bench.plots import write_plots

    runs = [
        run("a", "code", "target", 60, 1.0),
        run("a", "code", "model-k2", 60, 1.2, drafted=(10, 8), accepted=(8, 5), k_chosen=(0, 0, 9)),
        run("a", "code", "model-k4", 60, 1.4, drafted=(8, 6, 5, 4), accepted=(6, 5, 4, 2)),
        run("a", "code", "auto", 60, 0.7, drafted=(9, 7), accepted=(8, 6), k_chosen=(3, 0, 7)),
    ]
    paths = write_plots(summarize(runs, n_boot=20), tmp_path)
    assert len(paths) == 3
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
