#!/usr/bin/env bash
# The main job from a fresh clone: set up (venv, llama-cpp-python built for this machine, the
# default models) and run one speculative generation on the default pair, printing the text and
# its statistics. Extra arguments go to `edge-spec generate` (e.g. --draft-mode none, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/bootstrap.py
if [ "$#" -eq 0 ]; then
    set -- "The water cycle, explained for a school textbook. Water evaporates from the oceans,"
fi
exec .venv/bin/edge-spec generate --max-tokens 128 "$@"
