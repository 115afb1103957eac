#!/usr/bin/env python3
# Forks sleeping children until the fork is refused, writes how many it made
# to $OUT (when set), stays like that for argv[1] seconds, then kills its
# children and exits 0.
import os, sys, time, signal
kids = []
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(3600)
        os._exit(0)
    kids.append(pid)
if os.environ.get("OUT"):
    open(os.environ["OUT"], "w").write("%d\n" % len(kids))
time.sleep(float(sys.argv[1]))
for k in kids:
    os.kill(k, signal.SIGKILL)
for k in kids:
    os.waitpid(k, 0)
