#!/usr/bin/env python3
# Four TCP streams to argv[1]:argv[2], sending as fast as the link takes for
# argv[3] seconds.
import socket, sys, threading, time
host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + secs
buf = b"\0" * 65536
def blast():
    while time.monotonic() < end:
        try:
            s = socket.create_connection((host, port), timeout=5)
            s.settimeout(1)
            while time.monotonic() < end:
                try:
                    s.sendall(buf)
                except socket.timeout:
                    pass
        except OSError:
            time.sleep(0.1)
ts = [threading.Thread(target=blast, daemon=True) for _ in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
