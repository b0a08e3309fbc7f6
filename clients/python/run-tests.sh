#!/usr/bin/env bash
# Runs the Python client's checks: a virtualenv in clients/python/.venv with the package and its
# test and lint extras from PyPI, `mypy --strict` over the package, its tests and scripts
# (configured in pyproject.toml: a type error fails the run), the `palisade` binary the tests
# start (built unless PALISADE_BIN names one), then pytest.
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
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "$here[test,lint]"

# Before anything is built: a few seconds, the cache in clients/python/.mypy_cache.
(cd "$here" && "$venv/bin/python" -m mypy)

target="${CARGO_TARGET_DIR:-$repo/target}"
# Built every time (a no-op when they are up to date): a binary older than the sources, say
# from before a change of the proto, would test the wrong server. With PALISADE_BIN set nothing
# is built: the binary is the caller's, and the Rust example writer is taken from beside it
# (its examples/protect_postgres) unless PALISADE_PROTECT_POSTGRES_BIN names it.
if [[ -z "${PALISADE_BIN:-}" ]]; then
  (cd "$repo" && cargo build --quiet -p palisade-cli)
  (cd "$repo" && cargo build --quiet -p palisade-fence --example protect_postgres)
  export PALISADE_BIN="$target/debug/palisade"
  export PALISADE_PROTECT_POSTGRES_BIN="${PALISADE_PROTECT_POSTGRES_BIN:-$target/debug/examples/protect_postgres}"
else
  export PALISADE_PROTECT_POSTGRES_BIN="${PALISADE_PROTECT_POSTGRES_BIN:-$(dirname "$PALISADE_BIN")/examples/protect_postgres}"
fi

cd "$here"
exec "$venv/bin/python" -m pytest "$@"
