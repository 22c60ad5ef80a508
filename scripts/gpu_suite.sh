#!/usr/bin/env bash
# The GPU suite (scripts/gpu_suite.py): bash scripts/gpu_suite.sh [--prepare | --dry] [--out FILE] ...
# On the GPU machine, the Python packages this project needs beyond that machine's image travel as
# wheels in .whl/ (git-ignored) and are installed into /tmp/site when the interpreter lacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY=.venv/bin/python
if ! "$PY" -c "import transformer_lens, datasets" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" scripts/gpu_suite.py "$@"
