#!/usr/bin/env bash
# Sets up the hosts in other languages (hosts/python, hosts/js, hosts/go) for tests and for use.
#
#   bash hosts/setup.sh        # prints nothing but errors; its last line is the venv's python
#
# * Python: a venv at $CLB_CACHE/venv with ./hosts/python installed (CLB_CACHE defaults to
#   ${XDG_CACHE_HOME:-~/.cache}/clb-reconciler, the user's own; CI sets /var/cache/clb-reconciler)
#   (pip's cache in ${CLB_CACHE}/pip). Needs python3.11+ with pip and access to PyPI the first
#   time; skipped when a stamp (a hash of hosts/python's sources, its pyproject, the schema and
#   the interpreter) says nothing changed.
# * JavaScript: `npm ci --prefix hosts/js` when hosts/js/package-lock.json exists (see the JS
#   section below).
# * Go: the replay command built static (no cgo) at $CLB_CACHE/bin/clb-replay-go (and the
#   per-call bench at $CLB_CACHE/bin/clb-bench-go), its modules
#   from the Go module proxy into $CLB_CACHE/go/mod (the build cache in $CLB_CACHE/go/build);
#   skipped when a stamp (a hash of hosts/go's sources and `go version`) says nothing changed.
#
# Idempotent. Exits non-zero, with the tool's output on stderr, when a step fails.
set -euo pipefail

hosts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${CLB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clb-reconciler}"
venv="$cache/venv"
pkg="$hosts/python"

# Runs a command quietly: its output is shown only if it fails.
quiet() {
    local out
    if ! out="$("$@" 2>&1)"; then
        printf '%s\n' "$out" >&2
        printf 'hosts/setup.sh: failed: %s\n' "$*" >&2
        return 1
    fi
}

# --- Python -----------------------------------------------------------------------------------

find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3 python3.13 python3.12 python3.11; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    echo "hosts/setup.sh: no python3 >= 3.11 found (set PYTHON=...)" >&2
    return 1
}

python_stamp() {
    local py="$1"
    {
        "$py" -c 'import sys; print(sys.version)'
        cd "$pkg"
        find pyproject.toml setup.py README.md clb_reconciler -type f \
            \( -name '*.py' -o -name '*.toml' -o -name '*.md' -o -name 'py.typed' \) \
            ! -path '*/__pycache__/*' ! -name schema.json -print | LC_ALL=C sort | while read -r f; do
            printf '%s ' "$f"
            sha256sum "$f" | cut -d' ' -f1
        done
        printf 'schema '
        sha256sum "$hosts/schema/clb-reconciler.json" 2>/dev/null | cut -d' ' -f1 || echo none
    } | sha256sum | cut -d' ' -f1
}

setup_python() {
    local py stamp
    py="$(find_python)"
    mkdir -p "$cache"
    stamp="$(python_stamp "$py")"
    if [ -x "$venv/bin/python" ] && [ -f "$venv/.clb-stamp" ] && [ "$(cat "$venv/.clb-stamp")" = "$stamp" ] \
        && "$venv/bin/python" -c 'import clb_reconciler' >/dev/null 2>&1; then
        return 0
    fi
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
        rm -rf "$venv"
        # A python without ensurepip (Debian without python3-venv): a venv without pip, filled
        # by the system's pip (`pip --python`, pip >= 22.3).
        if ! "$py" -m venv "$venv" >/dev/null 2>&1; then
            rm -rf "$venv"
            quiet "$py" -m venv --without-pip "$venv"
        fi
    fi
    rm -f "$venv/.clb-stamp"
    local -a pip
    if "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
        pip=("$venv/bin/python" -m pip)
    else
        pip=("$py" -m pip --python "$venv/bin/python")
    fi
    # Built from a copy of hosts/python and hosts/schema, so that the build leaves nothing
    # (build/, *.egg-info) in the work tree.
    local tmp
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    mkdir -p "$tmp/python" "$tmp/schema"
    (cd "$pkg" && tar --exclude=build --exclude='*.egg-info' --exclude=__pycache__ \
        --exclude=clb_reconciler/schema.json -cf - .) | (cd "$tmp/python" && tar -xf -)
    if [ -f "$hosts/schema/clb-reconciler.json" ]; then
        cp "$hosts/schema/clb-reconciler.json" "$tmp/schema/"
    fi
    quiet env PIP_CACHE_DIR="$cache/pip" "${pip[@]}" install --quiet --disable-pip-version-check \
        --no-input --root-user-action=ignore --upgrade "$tmp/python"
    printf '%s\n' "$stamp" >"$venv/.clb-stamp"
}

setup_python

# --- JavaScript (hosts/js) ----------------------------------------------------------------------
# The JS host's part (its engineer may extend it): `npm ci` when its lockfile exists and
# node_modules is missing or older than the lockfile (npm writes node_modules/.package-lock.json
# at each install).
if [ -f "$hosts/js/package-lock.json" ]; then
    if [ ! -f "$hosts/js/node_modules/.package-lock.json" ] \
        || [ "$hosts/js/package-lock.json" -nt "$hosts/js/node_modules/.package-lock.json" ]; then
        command -v npm >/dev/null 2>&1 || { echo "hosts/setup.sh: hosts/js needs npm" >&2; exit 1; }
        quiet npm ci --prefix "$hosts/js" --no-audit --no-fund --loglevel=error --cache "$cache/npm"
    fi
fi
# --- end of the JS part -------------------------------------------------------------------------

# --- Go (hosts/go) ------------------------------------------------------------------------------
go_stamp() {
    {
        go version
        cd "$hosts/go"
        find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum -o -name schema.json \) -print \
            | LC_ALL=C sort | while read -r f; do
            printf '%s ' "$f"
            sha256sum "$f" | cut -d' ' -f1
        done
    } | sha256sum | cut -d' ' -f1
}

setup_go() {
    command -v go >/dev/null 2>&1 || { echo "hosts/setup.sh: hosts/go needs Go (1.25 or later)" >&2; return 1; }
    export GOMODCACHE="${GOMODCACHE:-$cache/go/mod}" GOCACHE="${GOCACHE:-$cache/go/build}"
    export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}"
    local bin="$cache/bin/clb-replay-go" stamp
    mkdir -p "$cache/bin" "$GOMODCACHE" "$GOCACHE"
    stamp="$(go_stamp)"
    if [ -x "$bin" ] && [ -x "$cache/bin/clb-bench-go" ] && [ -f "$bin.stamp" ] && [ "$(cat "$bin.stamp")" = "$stamp" ]; then
        return 0
    fi
    rm -f "$bin.stamp"
    (cd "$hosts/go" && quiet go mod download && quiet env CGO_ENABLED=0 go build -o "$bin" ./cmd/replay \
        && quiet env CGO_ENABLED=0 go build -o "$cache/bin/clb-bench-go" ./cmd/bench)
    printf '%s\n' "$stamp" >"$bin.stamp"
}

setup_go
# --- end of the Go part -------------------------------------------------------------------------

printf '%s\n' "$venv/bin/python"
