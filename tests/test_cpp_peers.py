"""llama.cpp's own examples as benchmark peers: parsing their real output, the command line, the
error paths (with stand-in binaries), and one real run of each on the default pair.

The fixtures under tests/data/ are verbatim stdout/stderr of llama-lookup and
llama-speculative-simple (llama-cpp-python 0.3.36's vendored llama.cpp) on the default pair,
prompt tests/data/cpp_peer_prompt.txt, -n 24 -c 512 -t 2 --spec-draft-n-max 4, greedy.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from edge_spec.bench import cpp_peers
from edge_spec.bench.cpp_peers import (
    BINARIES,
    CppPeerError,
    CppPeerSettings,
    credited_tokens,
    find_bin_dir,
    parse_stats,
    parse_text,
    peer_command,
    run_cpp_peer,
)

DATA = Path(__file__).parent / "data"
PROMPT = (DATA / "cpp_peer_prompt.txt").read_text(encoding="utf-8").removesuffix("\n")


def captured(kind: str, stream: str) -> str:
    return (DATA / f"cpp_peer_{kind}.{stream}").read_text(encoding="utf-8")


# ---- parsing real output ----------------------------------------------------------------------


def test_parse_stats_lookup_real_output() -> None:
    stats = parse_stats(captured("lookup", "stderr"))
    assert (stats.n_prompt_tokens, stats.prefill_s) == (12, 4.039)
    assert (stats.n_generated, stats.decode_s, stats.tokens_per_s) == (25, 3.130, 7.986)
    assert (stats.k, stats.n_drafted, stats.n_accepted) == (4, 4, 4)


def test_parse_stats_speculative_real_output() -> None:
    stats = parse_stats(captured("speculative", "stderr"))
    assert (stats.n_prompt_tokens, stats.prefill_s) == (12, 0.616)
    assert (stats.n_generated, stats.decode_s, stats.tokens_per_s) == (29, 21.234, 1.366)
    assert (stats.k, stats.n_drafted, stats.n_accepted) == (4, 35, 20)


@pytest.mark.parametrize("kind", ["lookup", "speculative"])
def test_parse_text_real_output(kind: str) -> None:
    text = parse_text(captured(kind, "stdout"), PROMPT)
    assert text.startswith(" Wednesday, Thursday, Friday, Saturday, Sunday.\n\nWrite the number")
    assert "<bos>" not in text and "Monday" not in text
    assert not text.endswith("\n\n\n")  # the examples' closing newlines are not generated text


def test_parse_text_prompt_repeated_in_output() -> None:
    # Input-reusing prompts: the echo is cut at the prompt's first occurrence, not a later one.
    stdout = "\n\n<bos>Copy: abc. Copy: abc. Copy: abc.\n\n\n\n"
    assert parse_text(stdout, "Copy: abc.") == " Copy: abc. Copy: abc."


def test_parse_text_echo_differs_from_prompt() -> None:
    # A tokenizer that does not round-trip the first line still leaves the last line to cut at.
    stdout = "\n\n<bos>Title:  x\nBody: Body: y and more\n\n\n\n"
    assert parse_text(stdout, "Title: x\nBody: Body:") == " y and more"


def test_parse_stats_without_statistics_raises() -> None:
    with pytest.raises(CppPeerError, match="printed no statistics"):
        parse_stats("error: failed to load model\n", "llama-lookup")


def test_parse_stats_zero_drafts_and_infinite_speed() -> None:
    stderr = (
        "0.01.000.000 I decoded    3 tokens in    0.000 seconds, speed:      inf t/s\n"
        "0.01.000.000 I n_draft   = 8\n0.01.000.000 I n_predict = 3\n"
        "0.01.000.000 I n_drafted = 0\n0.01.000.000 I n_accept  = 0\n"
        "0.01.000.000 I accept    = -nan%\n"
    )
    stats = parse_stats(stderr)
    assert (stats.n_generated, stats.n_drafted, stats.n_accepted, stats.k) == (3, 0, 0, 8)
    assert stats.tokens_per_s == 0.0 and stats.n_prompt_tokens == 0


# ---- command line -----------------------------------------------------------------------------


def settings(draft: str | None = "d.gguf", temperature: float = 0.0) -> CppPeerSettings:
    return CppPeerSettings("t.gguf", draft, 32, 2, 512, 5, temperature, 7)


def test_peer_command_speculative_greedy() -> None:
    cmd = peer_command("speculative", Path("/b"), settings(), Path("/p.txt"))
    assert cmd[0] == "/b/llama-speculative-simple"
    joined = " ".join(cmd)
    for part in (
        "-m t.gguf",
        "-md d.gguf",
        "--spec-type draft-simple",  # without it this llama.cpp refuses to start
        "--spec-draft-n-max 5",
        "-f /p.txt",
        "-n 32",
        "-c 512",
        "-t 2",
        "-s 7",
        "--temp 0.0 --top-k 1",
        "--flash-attn auto",
    ):
        assert part in joined


def test_peer_command_lookup_sampled() -> None:
    cmd = peer_command("lookup", Path("/b"), settings(None, 0.8), Path("/p.txt"))
    assert cmd[0] == "/b/llama-lookup"
    assert "-md" not in cmd and "--spec-type" not in cmd and "--top-k" not in cmd
    assert cmd[cmd.index("--temp") + 1] == "0.8"
    assert cmd[cmd.index("--spec-draft-n-max") + 1] == "5"


def test_peer_command_rejects_missing_draft_and_unknown_kind() -> None:
    with pytest.raises(CppPeerError, match="draft"):
        peer_command("speculative", Path("/b"), settings(None), Path("/p.txt"))
    with pytest.raises(CppPeerError, match="unknown peer kind"):
        peer_command("medusa", Path("/b"), settings(), Path("/p.txt"))  # type: ignore[arg-type]


# ---- finding binaries and running them (stand-in scripts, no llama.cpp) ---------------------


def fake_bin_dir(tmp_path: Path, body: str) -> Path:
    """Shell scripts named like the peers; `body` runs with "$@" and $DATA set."""
    tmp_path.mkdir(exist_ok=True)
    for name in BINARIES.values():
        script = tmp_path / name
        script.write_text(f'#!/bin/sh\nDATA="{DATA}"\n{body}\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return tmp_path


def test_find_bin_dir_env_and_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpp_peers.ENV_BIN_DIR, str(tmp_path))
    with pytest.raises(CppPeerError, match="lacks llama-lookup"):
        find_bin_dir()
    fake_bin_dir(tmp_path, "exit 0")
    assert find_bin_dir() == tmp_path
    monkeypatch.delenv(cpp_peers.ENV_BIN_DIR)
    monkeypatch.setattr(cpp_peers, "default_bin_dir", lambda root=None: None)
    with pytest.raises(CppPeerError, match="build_llama_examples.py"):
        find_bin_dir()


def test_default_bin_dir_picks_a_complete_build_of_this_version(tmp_path: Path) -> None:
    import importlib.metadata
    import json

    version = importlib.metadata.version("llama_cpp_python")
    builds = (("a", version, True), ("b", "0.0.1", True), ("c", version, False))
    for folder, built_for, complete in builds:
        out = tmp_path / ".cache/llama-examples" / folder
        (out / "bin").mkdir(parents=True)
        (out / "stamp.json").write_text(json.dumps({"version": built_for}))
        for name in BINARIES.values() if complete else ["llama-lookup"]:
            (out / "bin" / name).touch()
    assert cpp_peers.default_bin_dir(tmp_path) == tmp_path / ".cache/llama-examples/a/bin"


def test_run_cpp_peer_with_stand_in_binary(tmp_path: Path) -> None:
    # The stand-in checks the prompt file (`-f` drops one trailing newline, so the prompt is
    # written with one more) and replays the captured output of the real binary.
    expected = tmp_path / "expected_prompt.txt"
    expected.write_text(PROMPT + "\n", encoding="utf-8")
    body = (
        'while [ "$1" != "-f" ]; do shift; done\n'
        f'cmp -s "$2" "{expected}" || exit 9\n'
        'cat "$DATA/cpp_peer_speculative.stdout"\n'
        'cat "$DATA/cpp_peer_speculative.stderr" >&2'
    )
    bin_dir = fake_bin_dir(tmp_path / "bin", body)
    run = run_cpp_peer("speculative", bin_dir, "t.gguf", "d.gguf", PROMPT, 24, 2, 512, 4)
    assert run.kind == "speculative"
    assert (run.n_generated, run.n_drafted, run.n_accepted) == (29, 35, 20)
    assert run.acceptance_rate == pytest.approx(20 / 35)
    assert run.text.startswith(" Wednesday, Thursday")
    assert run.settings.k == 4 and run.settings.draft_path == "d.gguf"
    assert run.command[0] == str(bin_dir / "llama-speculative-simple")
    # As the engine: flash attention off where nothing can be offloaded (this CPU build).
    from edge_spec.backend import supports_gpu_offload

    flash = run.command[run.command.index("--flash-attn") + 1]
    assert flash == ("auto" if supports_gpu_offload() else "off")


def test_credited_tokens_count_only_timed_tokens_up_to_the_request() -> None:
    # llama-lookup: the first token comes from the prompt's logits, then overshoot past -n.
    assert credited_tokens("lookup", 69, 64) == 64
    assert credited_tokens("lookup", 65, 64) == 64
    assert credited_tokens("lookup", 12, 64) == 11  # stopped at end of generation
    assert credited_tokens("lookup", 0, 64) == 0
    # llama-speculative-simple: every printed token came out of a timed step.
    assert credited_tokens("speculative", 65, 64) == 65


def test_run_cpp_peer_lookup_rate_uses_credited_tokens(tmp_path: Path) -> None:
    body = 'cat "$DATA/cpp_peer_lookup.stdout"\ncat "$DATA/cpp_peer_lookup.stderr" >&2'
    bin_dir = fake_bin_dir(tmp_path, body)
    run = run_cpp_peer("lookup", bin_dir, "t.gguf", None, PROMPT, 16, 2, 512, 4)
    # The capture printed 25 tokens in 3.130 s for -n 24; asked for 16 here: 16 are credited.
    assert (run.n_printed, run.n_generated) == (25, 16)
    assert run.tokens_per_s == pytest.approx(16 / 3.130)


def test_run_cpp_peer_failure_reports_stderr_tail(tmp_path: Path) -> None:
    bin_dir = fake_bin_dir(tmp_path, 'echo "gguf_init: failed to read magic" >&2\nexit 3')
    with pytest.raises(CppPeerError, match=r"exited with 3(.|\n)*failed to read magic"):
        run_cpp_peer("lookup", bin_dir, "t.gguf", None, "Hi", 8, 2, 256, 4)


def test_run_cpp_peer_validates_arguments(tmp_path: Path) -> None:
    with pytest.raises(CppPeerError, match="n_predict"):
        run_cpp_peer("lookup", fake_bin_dir(tmp_path, "exit 0"), "t", None, "Hi", 0, 2, 256, 4)


# ---- the real binaries on the default pair ----------------------------------------------------


@pytest.fixture
def peer_bin_dir() -> Path:
    """The built binaries, or a skip (before any model is loaded): building them is optional."""
    try:
        return find_bin_dir()
    except CppPeerError as exc:
        pytest.skip(f"{exc} (building them is optional)")


@pytest.mark.models
def test_real_peers_on_default_pair(
    peer_bin_dir: Path, target_path: Path, draft_path: Path, spec: object
) -> None:
    bin_dir = peer_bin_dir
    prompt = "List the days of the week: Monday, Tuesday,"
    threads = min(2, os.cpu_count() or 1)
    runs = {
        kind: run_cpp_peer(
            kind, bin_dir, target_path, draft_path, prompt, 16, threads, 512, 4, timeout_s=600
        )
        for kind in ("lookup", "speculative")
    }
    for run in runs.values():
        assert run.n_generated > 0 and run.tokens_per_s > 0 and run.decode_s > 0
        assert 0 <= run.n_accepted <= run.n_drafted
        assert run.text.strip()
    assert runs["speculative"].n_drafted > 0

    # Greedy speculation must continue like the target alone. Batched and one-token logits can
    # differ at rare near-ties, so only the first words are compared, on a prompt with a clear
    # continuation.
    greedy = spec.generate(prompt, max_tokens=16, draft_mode="none").text  # type: ignore[attr-defined]
    words = greedy.split()[:3]
    assert runs["speculative"].text.split()[:3] == words, (greedy, runs["speculative"].text)
