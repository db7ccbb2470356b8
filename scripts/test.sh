#!/usr/bin/env bash
# The test command of README.md: lint, type-check, import contracts, then the whole pytest suite
# (tests/ and the widgets example's tests, examples/widgets/tests).
#
# Creates ./.venv and installs the project with its dev extras if needed
# (re-installs when pyproject.toml changed). Extra arguments go to pytest.
# The suite runs on RANGESHARD_TEST_WORKERS pytest-xdist worker processes (default 2, one file per
# worker at a time: module fixtures stay in one process); 0 runs it in this process.
# pytest's exit code 5 ("no tests collected") is turned into a failure:
# a run that executes no test is a defect.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
if [ ! -f .venv/.rangeshard-installed ] || [ pyproject.toml -nt .venv/.rangeshard-installed ] \
    || [ examples/widgets/pyproject.toml -nt .venv/.rangeshard-installed ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[dev]'
    # The worked example is its own package; its tests (examples/widgets/tests, in pytest's testpaths) import it.
    .venv/bin/python -m pip install --quiet -e examples/widgets
    touch .venv/.rangeshard-installed
fi

# The official JavaScript client for tests/e2e/test_external_js.py (Node.js and npm on PATH).
command -v node >/dev/null || { echo "node (Node.js) is required on PATH for tests/e2e/test_external_js.py" >&2; exit 1; }
if [ ! -d tests/e2e/js/node_modules/@kubernetes/client-node ] || [ tests/e2e/js/package-lock.json -nt tests/e2e/js/node_modules ]; then
    npm ci --prefix tests/e2e/js --no-audit --no-fund --loglevel=error
fi
command -v kubectl >/dev/null || { echo "kubectl is required on PATH for the end-to-end tests" >&2; exit 1; }
command -v openssl >/dev/null || { echo "openssl is required on PATH for the TLS tests" >&2; exit 1; }
.venv/bin/python -c "import cryptography" 2>/dev/null || { echo "the cryptography package is required (pip install -e '.[dev]')" >&2; exit 1; }
# Any test that would skip for a missing prerequisite fails instead (tests/helpers.py: missing_prerequisite).
export RANGESHARD_REQUIRE_ALL=1
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || { echo "chromium is required for tests/dashboard (apt-get install -y chromium)" >&2; exit 1; }

echo "== ruff check"; .venv/bin/ruff check .
echo "== ruff format --check"; .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
echo "== import-linter"; .venv/bin/lint-imports --no-cache
workers=${RANGESHARD_TEST_WORKERS:-2}
case "$workers" in ''|*[!0-9]*) echo "RANGESHARD_TEST_WORKERS must be a whole number, got '$workers'" >&2; exit 2;; esac
echo "== pytest ($workers workers)"
set +e
.venv/bin/python -m pytest -n "$workers" --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating as failure" >&2
    exit 1
fi
exit "$rc"
