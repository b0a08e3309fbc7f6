"""A lock holder for the pause test: takes the lock, says so, then (on a line on stdin) appends
to the report under the fence, as if it still held the lock, whatever happened meanwhile.

    python holder.py ENDPOINT LOCK DSN

Prints ``granted <token>``. Exit status: 0 written, 3 refused as stale, 1 anything else.
"""

import sys

import psycopg

import palisade
from palisade import fence
from palisade.fence import postgres


def main() -> int:
    endpoint, lock, dsn = sys.argv[1:4]
    client = palisade.Client([endpoint])
    verifier = fence.Verifier(client.public_keys())
    session = client.session(ttl=1)
    grant = session.acquire(lock, wait=10)
    print(f"granted {grant.token}", flush=True)
    sys.stdin.readline()  # frozen here by the test (SIGSTOP), then told to write
    with psycopg.connect(dsn) as conn:
        try:
            with postgres.transaction(conn, "reports/nightly", verifier.verify(grant.sequencer)):
                row = conn.execute("SELECT body FROM reports WHERE name = 'nightly'").fetchone()
                body = "frozen holder" if row is None else f"{row[0]}\nfrozen holder"
                conn.execute(
                    "INSERT INTO reports (name, body) VALUES ('nightly', %s) "
                    "ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body",
                    (body,),
                )
        except fence.Stale as stale:
            print(f"refused: {stale}", file=sys.stderr)
            return 3
    print("written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
