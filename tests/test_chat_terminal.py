"""`edge-spec chat` driven through a real pseudo-terminal (pexpect), on the real chat pair: typed
turns, streamed answers, the per-turn summary, commands, Ctrl-C, Ctrl-D, colour on a terminal
and none through a pipe, and a context too small for the history."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

# One pytest-xdist worker runs this module: its expensive fixtures (session-scoped, so that
# tests of other modules running in between do not tear them down) are built once.
pytestmark = [pytest.mark.models, pytest.mark.xdist_group("chat_terminal")]

EDGE_SPEC = str(Path(sys.executable).parent / "edge-spec")
SUMMARY = re.compile(r"\[\d+ tokens, [\d.]+ tok/s · [^\]]*\]")
PROMPT = "\r\n> "
ANSI = "\x1b["


def spawn(*args: str, timeout: float = 240) -> pexpect.spawn:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    child = pexpect.spawn(
        EDGE_SPEC, ["chat", *args], env=env, encoding="utf-8", timeout=timeout, dimensions=(40, 200)
    )
    child.expect("Ctrl-D exits")  # the banner: the models are loaded
    child.expect("> ")
    return child


@pytest.fixture(scope="session")
def chat_models() -> None:
    from edge_spec.models.cache import resolve
    from edge_spec.models.manifest import default_pair

    for name in default_pair(chat=True):
        resolve(name, progress=False)


def test_two_turns_commands_and_ctrl_d(chat_models: None) -> None:
    child = spawn("--max-tokens", "24", "--seed", "1")
    child.sendline("Name three planets.")
    child.expect(SUMMARY)
    first = child.before
    child.expect("> ")
    child.sendline("Which one is the largest?")
    child.expect(SUMMARY)
    child.expect("> ")
    child.sendline("/stats")
    child.expect(r"turns: 2, tokens generated: \d+")
    child.expect("> ")
    child.sendline("/help")
    child.expect("/reset")
    child.expect("> ")
    child.sendline("/reset")
    child.expect("forgotten")
    child.expect("> ")
    child.sendeof()  # Ctrl-D
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert first.strip()  # the first answer was written before its summary


def test_ctrl_c_stops_the_answer_and_keeps_the_session(chat_models: None) -> None:
    # A long answer (400 tokens at T = 0 for this prompt), stopped once its text streams.
    child = spawn("--max-tokens", "400", "--temperature", "0", "--draft-mode", "none")
    child.sendline("Write a long story about a dragon and a knight.")
    child.expect("a knight.")  # the echo of the typed line
    child.expect("Once upon a time")  # the answer is streaming
    child.sendintr()  # Ctrl-C
    child.expect("stopped; the partial answer")
    child.expect("> ")
    child.sendline("/stats")
    child.expect(r"turns: 0")  # the stopped turn has no finished statistics
    child.expect(r"1 turns kept")  # but it is in the history
    child.expect("> ")
    child.sendintr()  # Ctrl-C at the prompt: a hint, not an exit
    child.expect("Ctrl-D exits")
    child.sendline("Thanks.")
    child.expect(SUMMARY)
    child.expect("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_colour_on_a_terminal_and_never_with_no_color_or_a_pipe(chat_models: None) -> None:
    coloured = spawn("--max-tokens", "8", "--seed", "2")
    coloured.sendline("Say hello.")
    coloured.expect(SUMMARY)
    assert coloured.before.endswith(ANSI + "2m")  # the summary is dimmed on a terminal
    coloured.sendeof()
    coloured.expect(pexpect.EOF)

    plain = spawn("--max-tokens", "8", "--seed", "2", "--no-color")
    plain.sendline("Say hello.")
    plain.expect(SUMMARY)
    assert ANSI not in plain.before + plain.after
    plain.sendeof()
    plain.expect(pexpect.EOF)

    piped = subprocess.run(
        [EDGE_SPEC, "chat", "--max-tokens", "8", "--seed", "2"],
        input="Say hello.\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert piped.returncode == 0, piped.stderr
    assert SUMMARY.search(piped.stdout) and ANSI not in piped.stdout


def test_history_too_long_for_the_context_drops_the_oldest_turns(chat_models: None) -> None:
    child = spawn("--ctx-size", "256", "--max-tokens", "48", "--seed", "3")
    filler = "Here is a long note about the weather in spring and autumn. " * 5
    dropped = False
    for i in range(5):
        child.sendline(f"{filler} Question {i}: summarize it.")
        index = child.expect([SUMMARY, "dropped the", "not sent"])
        if index == 1:
            dropped = True
            child.expect(SUMMARY)
        assert index != 2
        child.expect("> ")
    child.sendline("x " * 400)  # alone longer than the context: refused, not a crash
    child.expect("not sent")
    child.expect("> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert dropped and child.exitstatus == 0
