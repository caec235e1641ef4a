#!/usr/bin/env bash
# The whole test suite from a fresh clone: set up (venv with test extras, llama-cpp-python built
# for this machine, the default models), lint, then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/bootstrap.py --extras test
.venv/bin/ruff check edge_spec tests scripts
exec .venv/bin/python -m pytest -ra "$@"
