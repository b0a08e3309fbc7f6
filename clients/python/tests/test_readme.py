"""The root README's "From Python" program, run as a user would run it."""

import os
import pathlib
import re
import subprocess
import sys

from .conftest import Server

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def readme_program() -> str:
    text = README.read_text()
    match = re.search(r"<!-- from-python: [^>]*-->\n```python\n(.*?)\n```", text, re.S)
    assert match, "README.md has no From Python program"
    return match.group(1)


def test_the_readme_program_writes_and_is_refused_with_its_old_grant(
    server: Server, schema_dsn: str, tmp_path: pathlib.Path
) -> None:
    program = tmp_path / "from_python.py"
    program.write_text(readme_program())
    env = dict(os.environ, PALISADE_ENDPOINT=server.endpoint, DATABASE_URL=schema_dsn)
    result = subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    refused = re.fullmatch(
        r"refused: stale sequencer for lock 'reports/nightly': token (\d+) is older than the accepted token (\d+)"
        r" \(set by session \d+\); .*\n",
        result.stdout,
    )
    assert refused, result.stdout
    old, newer = int(refused.group(1)), int(refused.group(2))
    assert old < newer

    import psycopg

    with psycopg.connect(schema_dsn) as conn:
        row = conn.execute("SELECT body FROM reports WHERE name = 'nightly'").fetchone()
    assert row is not None, "the program wrote no report"
    body = row[0]
    assert body.split("\n") == [f"written with token {old}", f"written with token {newer}"]
