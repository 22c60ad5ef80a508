#!/usr/bin/env bash
# The GPU suite (issue #39; see scripts/gpu_suite.py): bash scripts/gpu_suite.sh [--dry] [--out FILE].
# On the GPU machine, Python packages this project needs beyond that machine's image travel as
# wheels in .whl/ (git-ignored) and are installed into /tmp/site first.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" scripts/gpu_suite.py "$@"
