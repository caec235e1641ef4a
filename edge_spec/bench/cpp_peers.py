"""llama.cpp's own speculative examples as benchmark peers, run as subprocesses.

`llama-lookup` (prompt lookup over a 1..4-gram cache) and `llama-speculative-simple` (a draft
model, `--spec-type draft-simple`) are built from the same vendored llama.cpp as the installed
llama-cpp-python by `scripts/build_llama_examples.py`. Running them as separate processes is the
point: their numbers are llama.cpp's own, untouched by Python. Nothing here imports llama_cpp.

Their statistics are parsed from what they print (format strings of the vendored
examples/lookup/lookup.cpp and examples/speculative-simple/speculative-simple.cpp):

    0.28.489.187 I decoded   29 tokens in    7.642 seconds, speed:    3.795 t/s   (stderr)
    0.28.489.188 I n_drafted = 35     (also n_draft, n_predict, n_accept)         (stderr)
    "\\n\\n" + "<bos>" + prompt pieces + generated pieces + "\\n\\n\\n\\n"         (stdout)

Both examples stop only once they have produced *more* than `-n` tokens, and a last accepted
draft can overshoot further (up to k), so the printed count is n_predict + 1 or a little more.
`llama-lookup` also decodes the prompt's last token before its timer starts, so its first token
comes out of prompt processing, not out of the timed decode. The tokens/s we report credit each
peer with the tokens its timed decode produced, up to the n_predict asked for (`credited_tokens`),
which is how the engine's own runs count: otherwise the overshoot and the free first token add
up to 5-10 % on a 64-token run.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edge_spec.errors import EdgeSpecError

log = logging.getLogger(__name__)

PeerKind = Literal["lookup", "speculative"]
BINARIES: dict[str, str] = {"lookup": "llama-lookup", "speculative": "llama-speculative-simple"}
ENV_BIN_DIR = "EDGE_SPEC_LLAMA_EXAMPLES"
STAMP_NAME = "stamp.json"  # written by scripts/build_llama_examples.py beside bin/


class CppPeerError(EdgeSpecError):
    """A peer binary is missing, failed, or printed no statistics we could read."""


@dataclass(frozen=True)
class CppPeerSettings:
    """What a peer ran with. `k` is the draft length (`--spec-draft-n-max`)."""

    target_path: str
    draft_path: str | None  # None for lookup
    n_predict: int
    threads: int
    n_ctx: int
    k: int
    temperature: float
    seed: int
    # llama.cpp's --flash-attn: "off" where the engine runs on the CPU alone, as the engine
    # does (its CPU kernel makes a verify batch of n tokens read the KV cache n times,
    # backend/model.py), else "auto", llama.cpp's default.
    flash_attn: Literal["on", "off", "auto"] = "auto"


@dataclass(frozen=True)
class CppPeerStats:
    """The numbers a peer prints at its end (see the module docstring)."""

    n_prompt_tokens: int
    prefill_s: float
    n_generated: int
    decode_s: float
    tokens_per_s: float
    k: int
    n_drafted: int
    n_accepted: int


@dataclass(frozen=True)
class CppPeerRun:
    """One prompt through one peer. `decode_s` excludes prompt processing, like the engine's."""

    kind: PeerKind
    settings: CppPeerSettings
    n_generated: int
    decode_s: float
    tokens_per_s: float
    n_drafted: int
    n_accepted: int
    text: str
    command: tuple[str, ...]
    n_prompt_tokens: int = 0
    prefill_s: float = 0.0
    wall_s: float = 0.0  # the whole process: model loading and warm-up included
    n_printed: int = 0  # the token count the peer printed (n_generated is what it is credited)

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0


# ---------------------------------------------------------------------------------------------
# Finding the binaries
# ---------------------------------------------------------------------------------------------


def repo_root() -> Path | None:
    """The source checkout this package runs from, or None for an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def default_bin_dir(root: Path | None = None) -> Path | None:
    """The newest `<root>/.cache/llama-examples/<version>-<hash>/bin` built for the installed
    llama-cpp-python version with both binaries present, or None."""
    root = root or repo_root()
    if root is None:
        return None
    try:
        version: str | None = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        version = None
    found: list[tuple[float, Path]] = []
    for stamp in (root / ".cache" / "llama-examples").glob(f"*/{STAMP_NAME}"):
        try:
            built_for = json.loads(stamp.read_text()).get("version")
        except (OSError, ValueError):
            continue
        bin_dir = stamp.parent / "bin"
        if version is not None and built_for != version:
            log.info(
                "ignoring %s: built for llama-cpp-python %s, not %s", bin_dir, built_for, version
            )
            continue
        if all((bin_dir / name).is_file() for name in BINARIES.values()):
            found.append((stamp.stat().st_mtime, bin_dir))
    return max(found)[1] if found else None


def find_bin_dir(bin_dir: str | os.PathLike[str] | None = None) -> Path:
    """`bin_dir`, else $EDGE_SPEC_LLAMA_EXAMPLES, else the default build folder. Raises
    CppPeerError (saying how to build them) when the binaries are not there."""
    given = bin_dir if bin_dir is not None else os.environ.get(ENV_BIN_DIR) or None
    chosen = Path(given) if given is not None else default_bin_dir()
    if chosen is None:
        raise CppPeerError(
            "llama.cpp example binaries not built: run `python3 scripts/build_llama_examples.py`"
            f" or set {ENV_BIN_DIR} to a folder holding {' and '.join(BINARIES.values())}"
        )
    missing = [name for name in BINARIES.values() if not (chosen / name).is_file()]
    if missing:
        raise CppPeerError(f"{chosen} lacks {', '.join(missing)}")
    return chosen


# ---------------------------------------------------------------------------------------------
# Running one prompt
# ---------------------------------------------------------------------------------------------


def peer_command(
    kind: PeerKind, bin_dir: Path, settings: CppPeerSettings, prompt_file: Path
) -> list[str]:
    """The argv for one run. Greedy (T=0) also sets --top-k 1, as llama.cpp's own README does."""
    if kind not in BINARIES:
        raise CppPeerError(f"unknown peer kind {kind!r}; known: {', '.join(BINARIES)}")
    s = settings
    cmd = [str(bin_dir / BINARIES[kind]), "-m", s.target_path]
    if kind == "speculative":
        if not s.draft_path:
            raise CppPeerError("the speculative peer needs a draft model")
        # Without --spec-type this llama.cpp fails ("failed to initialize speculative decoding").
        cmd += ["-md", s.draft_path, "--spec-type", "draft-simple"]
        cmd += ["--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]  # always k tokens
    cmd += ["--spec-draft-n-max", str(s.k)]
    cmd += ["-f", str(prompt_file), "-n", str(s.n_predict), "-c", str(s.n_ctx)]
    cmd += ["-t", str(s.threads), "-tb", str(s.threads), "-s", str(s.seed)]
    cmd += ["--flash-attn", s.flash_attn]
    cmd += ["--temp", repr(float(s.temperature))]
    if s.temperature <= 0.0:
        cmd += ["--top-k", "1"]
    return cmd


def run_cpp_peer(
    kind: PeerKind,
    bin_dir: str | os.PathLike[str] | None,
    target_path: str | os.PathLike[str],
    draft_path: str | os.PathLike[str] | None,
    prompt_text: str,
    n_predict: int,
    threads: int,
    n_ctx: int,
    draft_n: int,
    temperature: float = 0.0,
    *,
    seed: int = 0,
    timeout_s: float | None = None,
) -> CppPeerRun:
    """Run `prompt_text` (a raw completion prompt; BOS is added by the example) through a peer.

    Requires the binaries (see find_bin_dir; `bin_dir` None means the default), n_predict >= 1,
    draft_n (k) >= 0, a draft_path for "speculative" (ignored for "lookup").
    Returns the parsed run. Raises CppPeerError on a non-zero exit (with the tail of stderr), a
    timeout, or output without the statistics lines.
    """
    if n_predict < 1 or draft_n < 0 or threads < 1 or n_ctx < 1:
        raise CppPeerError("need n_predict >= 1, draft_n >= 0, threads >= 1 and n_ctx >= 1")
    folder = find_bin_dir(bin_dir)
    from edge_spec.backend import supports_gpu_offload

    settings = CppPeerSettings(
        target_path=str(target_path),
        draft_path=str(draft_path) if kind == "speculative" and draft_path else None,
        n_predict=n_predict,
        threads=threads,
        n_ctx=n_ctx,
        k=draft_n,
        temperature=float(temperature),
        seed=seed,
        flash_attn="auto" if supports_gpu_offload() else "off",
    )
    with tempfile.TemporaryDirectory(prefix="edge_spec_peer_") as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        # `-f` drops one trailing newline from the file; add one so the prompt arrives intact.
        prompt_file.write_text(prompt_text + "\n", encoding="utf-8")
        cmd = peer_command(kind, folder, settings, prompt_file)
        log.info("running %s", " ".join(cmd))
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                cwd=tmp,  # whatever an example writes lands in the temp folder
            )
        except subprocess.TimeoutExpired as exc:
            raise CppPeerError(f"{BINARIES[kind]} ran past {timeout_s} s") from exc
        wall_s = time.perf_counter() - started
    stdout = proc.stdout.decode("utf-8", errors="replace")
    stderr = proc.stderr.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        raise CppPeerError(
            f"{BINARIES[kind]} exited with {proc.returncode}; stderr ends:\n{_tail(stderr)}"
        )
    stats = parse_stats(stderr, BINARIES[kind])
    credited = credited_tokens(kind, stats.n_generated, n_predict)
    return CppPeerRun(
        kind=kind,
        settings=settings,
        n_generated=credited,
        decode_s=stats.decode_s,
        tokens_per_s=credited / stats.decode_s if stats.decode_s > 0 else 0.0,
        n_drafted=stats.n_drafted,
        n_accepted=stats.n_accepted,
        text=parse_text(stdout, prompt_text),
        command=tuple(cmd),
        n_prompt_tokens=stats.n_prompt_tokens,
        prefill_s=stats.prefill_s,
        wall_s=wall_s,
        n_printed=stats.n_generated,
    )


def credited_tokens(kind: PeerKind, n_printed: int, n_predict: int) -> int:
    """The tokens a peer's timed decode produced, up to the n_predict asked for.

    llama-lookup samples its first token from the prompt's logits (the prompt's last token is
    decoded before `t_dec_start`), then stops after the step that takes its count past
    n_predict: tokens 2 .. n_predict + 1 come out of the timed window, the rest is overshoot.
    llama-speculative-simple keeps the prompt's last token for its first timed step, like the
    engine, caps its drafts at what is left, and overshoots by at most one token that a timed
    step produced: every printed token is credited."""
    if kind == "lookup":
        return max(min(n_printed - 1, n_predict), 0)
    return n_printed


# ---------------------------------------------------------------------------------------------
# Parsing what they print (pure)
# ---------------------------------------------------------------------------------------------

_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+|inf|nan))"
_SPEED = r"\s*(\d+) tokens in\s*" + _NUM + r" seconds, speed:\s*" + _NUM + r" t/s"
_ENCODED = re.compile(r"encoded" + _SPEED)
_DECODED = re.compile(r"decoded" + _SPEED)
# Log lines carry a "0.17.352.440 I " time/level prefix; `\b...\s*=` keeps n_draft off n_drafted.
_COUNTS = {
    name: re.compile(rf"\b{name}\s*=\s*(\d+)\s*$", re.MULTILINE)
    for name in ("n_draft", "n_predict", "n_drafted", "n_accept")
}


def parse_stats(stderr: str, program: str = "peer") -> CppPeerStats:
    """The statistics block of llama-lookup / llama-speculative-simple (their stderr).
    Raises CppPeerError when the `decoded ...` or a count line is missing."""
    decoded = _last(_DECODED, stderr)
    counts = {name: _last(pattern, stderr) for name, pattern in _COUNTS.items()}
    if decoded is None or any(m is None for m in counts.values()):
        raise CppPeerError(f"{program} printed no statistics; stderr ends:\n{_tail(stderr)}")
    encoded = _last(_ENCODED, stderr)
    n_generated, decode_s, speed = int(decoded[1]), float(decoded[2]), float(decoded[3])
    if not math.isfinite(speed):  # a sub-millisecond run prints inf
        speed = n_generated / decode_s if decode_s > 0 else 0.0
    value = {name: int(m[1]) for name, m in counts.items() if m is not None}
    return CppPeerStats(
        n_prompt_tokens=int(encoded[1]) if encoded else 0,
        prefill_s=float(encoded[2]) if encoded else 0.0,
        n_generated=n_generated,
        decode_s=decode_s,
        tokens_per_s=speed,
        k=value["n_draft"],
        n_drafted=value["n_drafted"],
        n_accepted=value["n_accept"],
    )


def parse_text(stdout: str, prompt_text: str) -> str:
    """The generated text out of a peer's stdout: "\\n\\n", the prompt echoed from its tokens
    (a "<bos>" piece first), the generated pieces, "\\n\\n\\n\\n". The echo is cut at the
    prompt's first occurrence; if the tokenizer did not reproduce the prompt exactly, at the
    first occurrence of its final line that ends where the echo can end."""
    body = stdout.removeprefix("\n\n")
    body = body[:-4] if body.endswith("\n\n\n\n") else body.rstrip("\n")
    cut = body.find(prompt_text) if prompt_text else -1
    if cut >= 0:
        return body[cut + len(prompt_text) :]
    last_line = prompt_text.rstrip().rsplit("\n", 1)[-1]
    if last_line.strip():
        start = max(0, len(prompt_text.rstrip()) - len(last_line) - 8)
        cut = body.find(last_line, start)
        if cut >= 0:
            return body[cut + len(last_line) :]
    log.warning("peer output does not echo the prompt; returning all of its stdout")
    return body


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def _tail(text: str, n_lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-n_lines:])
