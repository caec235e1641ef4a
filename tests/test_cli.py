"""The edge-spec command in a child process: JSON output, and user errors as exit 2 + one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.models


def edge_spec(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge_spec.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_generate_json_on_the_default_pair(target_path, draft_path) -> None:
    out = edge_spec("generate", "The three primary colors are", "--max-tokens", "24", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for key in ("text", "finish_reason", "token_ids", "target", "draft", "stats"):
        assert key in result
    assert Path(result["target"]) == target_path and Path(result["draft"]) == draft_path
    for key in ("n_drafted", "n_accepted", "tokens_per_s", "acceptance_rate", "draft_s"):
        assert key in result["stats"]
    assert result["stats"]["n_drafted"] > 0 and len(result["token_ids"]) == 24

    baseline = edge_spec(
        "generate",
        "The three primary colors are",
        "--max-tokens",
        "24",
        "--json",
        "--draft-mode",
        "none",
    )
    alone = json.loads(baseline.stdout)
    assert alone["draft"] is None and alone["stats"]["n_drafted"] == 0
    assert alone["token_ids"] == result["token_ids"]  # greedy: the same tokens


def test_generate_prints_text_and_stats() -> None:
    out = edge_spec(
        "generate",
        "--draft-mode",
        "ngram",
        "--max-tokens",
        "16",
        "Repeat: one two three. Repeat: one two",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "accepted" in out.stderr and "tokens/s" in out.stderr


def _assert_user_error(out: subprocess.CompletedProcess[str], needle: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("edge-spec: error:") and needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--k", "-1"], "k must"),
        (["--max-tokens", "-1"], "max_tokens"),
        (["--draft-mode", "psychic"], "invalid choice"),
        (["--k", "four"], "invalid int"),
        (["--threads", "0"], "n_threads"),
        (["--ctx-size", "4"], "n_ctx"),
        (["--seed", "-2"], "seed must"),
        (["--seed", "one"], "invalid seed value"),
        (["--json", "--logprobs", "30"], "logprobs"),
        (["--logprobs", "2"], "needs --json"),
        (["--prompt", "Hi"], "one way"),  # beside the argument "Hello"
    ],
)
def test_bad_options_exit_2_with_one_line(args: list[str], needle: str) -> None:
    _assert_user_error(edge_spec("generate", "Hello", *args), needle)


def test_the_prompt_may_come_as_llama_cpps_p_option(target_path) -> None:
    """`-p/--prompt TEXT` (llama-cli's spelling) is the prompt, not an abbreviation of
    --prompt-file: the same answer as the argument."""
    common = ("--draft-mode", "none", "--max-tokens", "8", "--temperature", "0", "--json")
    outs = [
        edge_spec("generate", *flag, "The three primary colors are", *common)
        for flag in ((), ("--prompt",), ("-p",))
    ]
    assert all(out.returncode == 0 for out in outs), [out.stderr for out in outs]
    assert len({json.loads(out.stdout)["text"] for out in outs}) == 1


def test_seed_minus_one_is_a_random_seed_as_in_llama_cpp() -> None:
    from edge_spec.cli.main import build_parser

    args = build_parser().parse_args(["generate", "--seed", "-1", "Hello"])
    assert args.seed is None
    assert build_parser().parse_args(["generate", "--seed", "7", "Hello"]).seed == 7


def test_bad_files_exit_2_with_one_line(
    tmp_path: Path, target_path, smollm2_path, gemma_path
) -> None:
    _assert_user_error(
        edge_spec("generate", "Hi", "--target", str(tmp_path / "x.gguf")), "not found"
    )
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x00" * 4096)
    _assert_user_error(edge_spec("generate", "Hi", "--target", str(junk)), "not a GGUF")
    truncated = tmp_path / "cut.gguf"
    with open(target_path, "rb") as f:
        truncated.write_bytes(f.read(3_000_000))
    _assert_user_error(edge_spec("generate", "Hi", "--target", str(truncated)), "invalid GGUF")
    _assert_user_error(
        edge_spec("generate", "Hi", "--draft-mode", "self", "--draft", str(gemma_path)),
        "self derives its draft",
    )
    # A draft with another vocabulary is no error: its drafts are translated.
    out = edge_spec(
        "generate", "Hi", "--target", str(smollm2_path), "--draft", str(gemma_path), "--json"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["draft_vocab"] == "translated"


def test_prompt_longer_than_context_exits_2() -> None:
    out = edge_spec("generate", "word " * 400, "--ctx-size", "64", "--draft-mode", "none")
    _assert_user_error(out, "context")


def test_models_list() -> None:
    out = edge_spec("models", "list")
    assert out.returncode == 0, out.stderr
    assert "smollm2-135m-f16" in out.stdout and "default target" in out.stdout


def test_missing_prompt_exits_2() -> None:
    _assert_user_error(edge_spec("generate", "--draft-mode", "none"), "no prompt")
