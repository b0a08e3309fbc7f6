"""Samples a process's resident memory (VmRSS) every INTERVAL seconds until it exits or this is
stopped, printing `UNIX_SECONDS MIB` lines, for the N4 measurement.

    python3 rss.py PID INTERVAL > rss.txt
"""
import signal, sys, time

pid, interval = int(sys.argv[1]), float(sys.argv[2])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    try:
        with open(f"/proc/{pid}/status") as f:
            kb = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        break
    print(f"{time.time():.1f} {kb/1024:.1f}", flush=True)
    time.sleep(interval)
