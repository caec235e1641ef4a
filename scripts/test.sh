#!/usr/bin/env bash
# The whole test suite from a fresh clone: set up (venv with test extras, llama-cpp-python built
# for this machine, the default models), lint, then pytest on two workers. Extra arguments go to
# pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/bootstrap.py --extras test
.venv/bin/ruff check edge_spec tests scripts
# One worker per core (at most 2), one llama.cpp thread each (tests/conftest.py): the models'
# tests leave a core idle while they tokenize, load, start processes and run Python, and the
# pure tests fill it. Modules with expensive fixtures stay on one worker (xdist_group).
workers=$(.venv/bin/python -c "import os; print(min(2, os.cpu_count() or 1))")
exec .venv/bin/python -m pytest -ra -n "$workers" --dist loadgroup "$@"
