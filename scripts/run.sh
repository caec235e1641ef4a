#!/usr/bin/env bash
# The main job from a fresh clone: set up (venv, llama-cpp-python built for this machine, the
# default models) and run one speculative generation on the default pair, printing the text and
# its statistics. Extra arguments go to `edge-spec generate` (e.g. --draft-mode none, --json, a
# prompt of your own); without a prompt argument the default prompt below is used.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/bootstrap.py
DEFAULT_PROMPT="The water cycle, explained for a school textbook. Water evaporates from the oceans,"
# The CLI reads stdin only when no prompt argument is given: that is how the default applies.
printf '%s' "$DEFAULT_PROMPT" | .venv/bin/edge-spec generate --max-tokens 128 "$@"
