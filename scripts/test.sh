#!/usr/bin/env bash
# The test command of README.md: set-up, lint, type-check, import contracts, then the whole pytest suite
# (tests/ and the widgets example's tests, examples/widgets/tests).
#
# Set-up on a fresh machine: installs Debian's chromium (apt-get, as root or through `sudo -n`) when
# missing, creates ./.venv and installs the project with its dev extras if needed (re-installs when
# pyproject.toml changed), runs `npm ci` for the JavaScript client. Extra arguments go to pytest.
# The suite runs on RANGESHARD_TEST_WORKERS pytest-xdist worker processes (default 2, one file per
# worker at a time: module fixtures stay in one process); 0 runs it in this process.
# pytest's exit code 5 ("no tests collected") is turned into a failure:
# a run that executes no test is a defect.
# RANGESHARD_TEST_PYTEST_ONLY=1 skips the set-up and the checks: only pytest runs (with the ./.venv
# there is; tests/e2e/test_test_script.py uses it).
#
# Stopping: one Ctrl-C (SIGINT), SIGTERM or SIGHUP ends the run within about 10 s and leaves no
# process behind. Every step runs as a job of its own process group (`set -m`), so the signal reaches
# this script at once; the script forwards it to the step's group, gives it RANGESHARD_TEST_STOP_GRACE
# seconds (default 5) to tear down, then SIGKILLs the group. The suite's own children die with their
# pytest process (a parent-death signal, rangeshard.core.process.popen). Last, every process whose
# environment carries this run's RANGESHARD_TEST_RUN_ID (a fresh id per run: each child inherits it)
# is waited for briefly, then SIGKILLed and named on stderr (e.g. what a test's `up --detach` left).
# The script then dies of the signal it got. A second signal kills at once.
set -euo pipefail
cd "$(dirname "$0")/.."

# A fresh id also when run from inside another run (tests/e2e/test_test_script.py): never the outer one's.
RANGESHARD_TEST_RUN_ID=$(cat /proc/sys/kernel/random/uuid)
export RANGESHARD_TEST_RUN_ID
grace=${RANGESHARD_TEST_STOP_GRACE:-5}
case "$grace" in ''|*[!0-9]*) echo "RANGESHARD_TEST_STOP_GRACE must be a whole number, got '$grace'" >&2; exit 2;; esac
marked=$(mktemp "${TMPDIR:-/tmp}/rangeshard-test-run.XXXXXX")

job=""
trap 'rm -f "$marked" "$marked.grep"' EXIT

# Start "$@" in the background as a job with a process group of its own (`set -m` only around the start:
# such a job does not ignore SIGINT, and short foreground commands stay in this script's group).
background() {
    set -m
    "$@" &
    set +m
}

# Pids of processes (but this script) whose environment has this run's marker, one per line into $marked.
# The glob is expanded before grep starts, so grep never lists itself.
list_marked() {
    local pid
    grep -lszxF "RANGESHARD_TEST_RUN_ID=$RANGESHARD_TEST_RUN_ID" /proc/[0-9]*/environ > "$marked.grep" || true
    : > "$marked"
    while IFS=/ read -r _ _ pid _; do
        [ "$pid" = "$$" ] || echo "$pid" >> "$marked"
    done < "$marked.grep"
    [ -s "$marked" ]
}

# Wait up to $1 tenths of a second for every marked process to end on its own; then SIGKILL and name them.
sweep() {
    local tenths=$1 pid
    while list_marked && [ "$tenths" -gt 0 ]; do
        sleep 0.1  # polling /proc with a deadline
        tenths=$((tenths - 1))
    done
    if list_marked; then
        echo "test.sh: $(wc -l < "$marked") process(es) outlived the run; killing them:" >&2
        while read -r pid; do
            echo "  $pid $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-160)" >&2
            kill -KILL "$pid" 2>/dev/null || true
        done < "$marked"
        tenths=20
        while list_marked && [ "$tenths" -gt 0 ]; do sleep 0.1; tenths=$((tenths - 1)); done
    fi
    rm -f "$marked"
}

# The signal handler: forward, wait up to $grace s, SIGKILL the group, sweep, then die of the same signal.
stop_run() {
    local sig=$1 timer
    trap 'trap - INT TERM HUP; [ -z "$job" ] || kill -KILL -- "-$job" 2>/dev/null || true' INT TERM HUP
    echo "test.sh: SIG$sig: stopping (at most ${grace} s of teardown, then SIGKILL)" >&2
    if [ -n "$job" ]; then
        kill -s "$sig" -- "-$job" 2>/dev/null || true
        background "$BASH" -c 'sleep "$1"; kill -KILL -- "-$2" 2>/dev/null' timer "$grace" "$job"
        timer=$!
        wait "$job" 2>/dev/null || true
        kill -KILL -- "-$job" 2>/dev/null || true  # what the step left in its group (e.g. xdist workers)
        kill -- "-$timer" 2>/dev/null || true
        wait "$timer" 2>/dev/null || true
    fi
    sweep 10
    trap - INT TERM HUP
    kill -s "$sig" $$
}
trap 'stop_run INT' INT
trap 'stop_run TERM' TERM
trap 'stop_run HUP' HUP

# Run "$@" as a job (its own process group) and wait for it; a signal interrupts the wait at once.
step() {
    background "$@"
    job=$!
    local rc=0
    wait "$job" || rc=$?
    job=""
    return "$rc"
}

# Install Debian packages: as root, or through passwordless sudo; 1 if neither is possible.
apt_install() {
    local sudo=()
    command -v apt-get >/dev/null || return 1
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null && sudo -n true 2>/dev/null || return 1
        sudo=(sudo -n)
    fi
    echo "== apt-get install $*"
    step ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    step ${sudo[@]+"${sudo[@]}"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

if [ "${RANGESHARD_TEST_PYTEST_ONLY:-0}" != 1 ]; then
    # Debian's chromium for tests/dashboard (playwright drives it; it downloads no browser).
    chromium=${CHROMIUM:-$(command -v chromium || echo /usr/bin/chromium)}
    if [ ! -x "$chromium" ]; then
        if [ -n "${CHROMIUM:-}" ]; then
            echo "CHROMIUM=$CHROMIUM is not an executable (tests/dashboard needs headless chromium)" >&2; exit 1
        fi
        apt_install chromium fonts-dejavu-core && [ -x /usr/bin/chromium ] || {
            echo "chromium is required for tests/dashboard and could not be installed here (needs apt-get and root" \
                "or passwordless sudo): run apt-get install -y chromium fonts-dejavu-core, or set CHROMIUM=PATH" >&2
            exit 1
        }
    fi

    PYTHON=${PYTHON:-python3}
    if [ ! -x .venv/bin/python ]; then
        step "$PYTHON" -m venv .venv
    fi
    if [ ! -f .venv/.rangeshard-installed ] || [ pyproject.toml -nt .venv/.rangeshard-installed ] \
        || [ examples/widgets/pyproject.toml -nt .venv/.rangeshard-installed ]; then
        step .venv/bin/python -m pip install --quiet --upgrade pip
        step .venv/bin/python -m pip install --quiet -e '.[dev]'
        # The worked example is its own package; its tests (examples/widgets/tests, in pytest's testpaths) import it.
        step .venv/bin/python -m pip install --quiet -e examples/widgets
        touch .venv/.rangeshard-installed
    fi

    # The official JavaScript client for tests/e2e/test_external_js.py (Node.js and npm on PATH).
    command -v node >/dev/null || { echo "node (Node.js) is required on PATH for tests/e2e/test_external_js.py" >&2; exit 1; }
    if [ ! -d tests/e2e/js/node_modules/@kubernetes/client-node ] || [ tests/e2e/js/package-lock.json -nt tests/e2e/js/node_modules ]; then
        step npm ci --prefix tests/e2e/js --no-audit --no-fund --loglevel=error
    fi
    command -v kubectl >/dev/null || { echo "kubectl is required on PATH for the end-to-end tests" >&2; exit 1; }
    command -v openssl >/dev/null || { echo "openssl is required on PATH for the TLS tests" >&2; exit 1; }
    .venv/bin/python -c "import cryptography" 2>/dev/null || { echo "the cryptography package is required (pip install -e '.[dev]')" >&2; exit 1; }

    echo "== ruff check"; step .venv/bin/ruff check .
    echo "== ruff format --check"; step .venv/bin/ruff format --check .
    echo "== mypy"; step .venv/bin/mypy
    echo "== import-linter"; step .venv/bin/lint-imports --no-cache
fi
# Any test that would skip for a missing prerequisite fails instead (tests/helpers.py: missing_prerequisite).
export RANGESHARD_REQUIRE_ALL=1
workers=${RANGESHARD_TEST_WORKERS:-2}
case "$workers" in ''|*[!0-9]*) echo "RANGESHARD_TEST_WORKERS must be a whole number, got '$workers'" >&2; exit 2;; esac
echo "== pytest ($workers workers)"
rc=0
step .venv/bin/python -m pytest -n "$workers" --dist loadfile "$@" || rc=$?
sweep 30  # nothing of the run may stay behind a finished run either
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: treating as failure" >&2
    exit 1
fi
exit "$rc"
