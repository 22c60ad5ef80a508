#!/usr/bin/env bash
# Mutation testing of one module of workbench/ or models/ (mutmut 3).
#
#   scripts/mutation.sh MODULE [PYTEST_ARGS ...]
#
#   MODULE        a .py file under workbench/ or models/, e.g. workbench/data/answers.py
#   PYTEST_ARGS   the tests to judge it by (files, node ids, -k EXPR, --ignore=...). Default:
#                 the files the table below gives for MODULE; for a module not in the table,
#                 every tests/**/test_*.py that imports it by its dotted name (printed first).
#
#   e.g.  scripts/mutation.sh workbench/data/answers.py
#         scripts/mutation.sh models/full_bandwidth.py tests/models/test_fbt.py -k "not slow"
#         MUTATION_BUDGET=600 scripts/mutation.sh workbench/probing/probes.py
#
# Prints the mutation score (killed / total), the count of each outcome and every surviving
# mutant as a diff; exits with mutmut's status (0 when the budget cut the run short: the
# report then says PARTIAL and gives killed/tested of total).
#
# Environment:
#   MUTATION_BUDGET=SECONDS  wall-clock limit of the mutmut run (default 1500); mutants not
#                            tested by then count as "not checked"
#   MUTATION_CHILDREN=N      mutants tested in parallel (default 1; the machines are shared)
#   MUTATION_RESUME=1        keep mutants/ from the last run and test only the mutants that have
#                            no result yet (same MODULE and tests, nothing edited since)
#   OMP_NUM_THREADS          defaults to 1
#
# Python: .venv/bin/python of this repository if there is one, else python3 (either needs
# mutmut 3, pytest and the project's dependencies; e.g. PATH=/path/to/.venv/bin:$PATH).
#
# How it works: base settings are in pyproject.toml [tool.mutmut]. mutmut copies workbench/,
# models/, app/, tests/ and pyproject.toml into mutants/, rewrites MODULE there so that each
# mutant can be switched on by name, and runs pytest inside mutants/ with mutants/ first on
# sys.path (the repository root is taken off it; PYTHONPATH=mutants for tests that start Python
# subprocesses), so the tests import the mutated copies and the working tree is never written
# to. mutmut has no command-line flag for which file to mutate or which tests to collect, so
# this script sets only_mutate and the test selection on mutmut's config object, then calls
# `mutmut run`. Before mutating, mutmut checks that the tests pass and that forcing every
# mutated function to raise makes them fail (so they do import the copies).
# mutants/ (git-ignored) is wiped at each start unless MUTATION_RESUME=1; after a run,
# `mutmut show NAME` and `mutmut browse` (from the repository root) read it. One run at a time
# per checkout: runs share mutants/.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "$1"; }
[[ $# -ge 1 ]] || usage 2
[[ $1 != -h && $1 != --help ]] || usage 0

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

module=${1#./}
shift
case $module in
    workbench/*.py | models/*.py) ;;
    *) echo "mutation.sh: MODULE must be a .py file under workbench/ or models/, not '$module'" >&2; exit 2 ;;
esac
[[ -f $module ]] || { echo "mutation.sh: no such file: $module" >&2; exit 2; }

# Module -> the test files that exercise it (picked with per-test coverage). mutmut runs each
# mutant only against the tests that reached its function, so extra files cost a single run.
# answers.py: is_correct has no unit test; evaluation and trace runs in the last three reach it.
if [[ $# -gt 0 ]]; then
    tests=("$@")
else
    case $module in
        workbench/data/answers.py)   tests=(tests/workbench/test_tasks.py tests/workbench/test_traces.py tests/workbench/test_overflow.py tests/workbench/test_cli.py tests/workbench/test_pinned_numbers.py) ;;
        workbench/dynamics/maps.py)  tests=(tests/workbench/test_maps.py) ;;
        workbench/probing/probes.py) tests=(tests/workbench/test_probes.py tests/workbench/test_pinned_numbers.py) ;;
        workbench/storage/files.py)  tests=(tests/workbench/test_checkpoint_faults.py tests/workbench/test_resume_faults.py tests/integration/test_kills.py tests/workbench/test_integrity.py tests/robustness/test_published_whole.py tests/robustness/test_users_files_kept.py) ;;
        models/full_bandwidth.py)    tests=(tests/models/test_fbt.py tests/models/test_cache.py tests/models/test_hooks.py tests/workbench/test_decoding.py tests/workbench/test_pinned_numbers.py) ;;
        models/hidden_decoding.py)   tests=(tests/models/test_hd.py tests/workbench/test_streams.py tests/workbench/test_pinned_numbers.py) ;;
        *)
            dotted=${module%.py}; dotted=${dotted//\//.}; dotted=${dotted%.__init__}
            mapfile -t tests < <(grep -rlE --include='test_*.py' "(from|import) ${dotted//./\\.}\\b" tests | sort)
            [[ ${#tests[@]} -gt 0 ]] || { echo "mutation.sh: no test file imports $dotted; name the tests: $0 $module TESTS..." >&2; exit 2; }
            ;;
    esac
fi

if [[ -x .venv/bin/python ]]; then py=.venv/bin/python; else py=python3; fi
"$py" -c 'import mutmut, sys; sys.exit(0 if mutmut.__version__.split(".")[0] == "3" else 1)' 2>/dev/null \
    || { echo "mutation.sh: $py has no mutmut 3 (pip install 'mutmut>=3,<4')" >&2; exit 2; }

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Tests that start Python subprocesses (the CLI, kill harnesses) import the mutated copies too.
export PYTHONPATH=$repo/mutants
budget=${MUTATION_BUDGET:-1500}
children=${MUTATION_CHILDREN:-1}
[[ ${MUTATION_RESUME:-0} == 1 ]] || rm -rf mutants
mkdir -p mutants  # before Python starts: a missing PYTHONPATH entry would be cached as absent

echo "mutation.sh: $module against: ${tests[*]}  (python $py, budget ${budget}s, $children worker(s))"
start=$SECONDS
set +e
# SIGINT on the budget: mutmut stops its workers and keeps every result it has.
timeout -s INT -k 60 "$budget" "$py" - "$module" "$children" "${tests[@]}" <<'PY'
import sys

from mutmut.configuration import config

module, children, tests = sys.argv[1], sys.argv[2], sys.argv[3:]
cfg = config()
cfg.only_mutate = [module]
cfg.pytest_add_cli_args_test_selection = tests

from mutmut.__main__ import cli

cli(["run", "--max-children", children], prog_name="mutmut")
PY
rc=$?
set -e
elapsed=$((SECONDS - start))
partial=0
if [[ $rc == 124 || $rc == 130 ]]; then partial=1; rc=0; fi

"$py" - "$module" "$elapsed" "$partial" <<'PY'
import sys
from collections import Counter

from mutmut.mutation.data import SourceFileMutationData
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

module, elapsed, partial = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
data = SourceFileMutationData(path=module)
data.load()
status = {name: status_by_exit_code[code] for name, code in data.exit_code_by_key.items()}
if not status:
    sys.exit(f"mutation.sh: no mutants recorded for {module} (see mutmut's output above)")
count = Counter(status.values())
total = len(status)
killed, timeout, survived = count["killed"], count["timeout"], count["survived"]
no_tests, unchecked = count["no tests"], count["not checked"]
tested = total - unchecked
other = tested - killed - timeout - survived - no_tests

print(f"\n== mutation score: {module} ({elapsed}s{', PARTIAL: budget reached' if partial or unchecked else ''})")
print(f"total {total}  killed {killed}  survived {survived}  timeout {timeout}  "
      f"no tests {no_tests}  other {other}  not checked {unchecked}")
pct = lambda a, b: f"{100 * a / b:.1f}%" if b else "n/a"
print(f"score: killed/total = {killed}/{total} = {pct(killed, total)}"
      f"  (timeouts as killed: {killed + timeout}/{total} = {pct(killed + timeout, total)})")
if unchecked:
    print(f"       killed/tested = {killed}/{tested} = {pct(killed, tested)} of {total} mutants")
for label in ("survived", "no tests"):
    names = sorted(n for n, s in status.items() if s == label)
    if names:
        print(f"\n-- {label} ({len(names)}):")
    for name in names:
        print(f"\n# {name}")
        print(get_diff_for_mutant(name, path=module).rstrip())
PY
exit $rc
