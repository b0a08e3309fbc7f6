"""The Python writer of the cross-language test (crosslang_test.go): appends a line to one
PostgreSQL row and one Redis list, each under its fence, with the grant in $PALISADE_SEQUENCER.

    python writer.py LINE   # env: PALISADE_SEQUENCER, PALISADE_PUBLIC_KEY, DATABASE_URL, REDIS_URL

The same as palisade-fence's example crosslang_writer (Rust) and writer/ (Go). Exit status: 0
both written, 3 refused as stale (nothing written by this run), 1 anything else.
"""

import os
import sys

import psycopg
import redis

from palisade import fence
from palisade.fence import postgres
from palisade.fence.redis import Op, RedisFence

SCOPE = "crosslang/report"


def main() -> int:
    line = sys.argv[1]
    try:
        sequencer = fence.Verifier(os.environ["PALISADE_PUBLIC_KEY"]).verify(os.environ.get("PALISADE_SEQUENCER"))
        with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
            with postgres.transaction(conn, SCOPE, sequencer):
                row = conn.execute("SELECT body FROM crosslang WHERE name = 'report'").fetchone()
                body = line if row is None else f"{row[0]}\n{line}"
                conn.execute(
                    "INSERT INTO crosslang (name, body) VALUES ('report', %s) "
                    "ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body",
                    (body,),
                )
        with redis.Redis.from_url(os.environ["REDIS_URL"]) as conn:
            RedisFence().write(conn, SCOPE, sequencer, [Op.rpush(SCOPE, line)])
    except fence.Stale as stale:
        print(f"refused: {stale}", file=sys.stderr)
        return 3
    print("written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
