#!/usr/bin/env bash
# Runs the Python client's tests: a virtualenv in clients/python/.venv with the package and its
# test extras from PyPI, the `palisade` binary the tests start (built if missing), then pytest.
# Arguments go to pytest (e.g. -q, -k keepalive). PostgreSQL and Redis come from
# PALISADE_TEST_POSTGRES and PALISADE_TEST_REDIS; their tests skip, saying so, without them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "$here[test]"

target="${CARGO_TARGET_DIR:-$repo/target}"
# Built every time (a no-op when they are up to date): a binary older than the sources, say
# from before a change of the proto, would test the wrong server.
if [[ -z "${PALISADE_BIN:-}" ]]; then
  (cd "$repo" && cargo build --quiet -p palisade-cli)
fi
export PALISADE_BIN="${PALISADE_BIN:-$target/debug/palisade}"
(cd "$repo" && cargo build --quiet -p palisade-fence --example protect_postgres)

cd "$here"
exec "$venv/bin/python" -m pytest "$@"
