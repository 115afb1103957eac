#!/usr/bin/env python3
# A discarding TCP sink on argv[1]:argv[2]; every 200 ms writes the bytes
# received so far to argv[3].
import socket, sys, threading, time
total = [0]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen(16)
def drain(c):
    while True:
        d = c.recv(65536)
        if not d:
            return
        total[0] += len(d)
def report():
    while True:
        time.sleep(0.2)
        open(sys.argv[3], "w").write(str(total[0]))
threading.Thread(target=report, daemon=True).start()
while True:
    c, _ = srv.accept()
    threading.Thread(target=drain, args=(c,), daemon=True).start()
