#!/usr/bin/env python3
"""Cost of the run history per attempt, against a real `leaseagent serve`.

Usage: benches/history_cost.py BINARY [ATTEMPTS]

Starts `BINARY serve` on a fresh database, runs ATTEMPTS acquire+release
pairs on one keep-alive connection (one task at a time, so every release is
its own commit), and prints the release latency (median, p90, p99, as the
client sees it) and, when the database has a history table, its bytes per
row (the file size with and without the table, after VACUUM, divided by
the rows). Run it with a build before and after a change to compare.
"""
import http.client
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    binary = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    with tempfile.TemporaryDirectory() as d:
        db = os.path.join(d, "leases.db")
        # Builds from before --no-auth existed run without it.
        helptext = subprocess.run([binary, "serve", "--help"], capture_output=True,
                                  text=True).stdout
        no_auth = ["--no-auth"] if "--no-auth" in helptext else []
        serve = subprocess.Popen(
            [binary, "serve", *no_auth, "--listen", "127.0.0.1:0", "--db", db],
            stderr=subprocess.PIPE, text=True)
        try:
            addr = None
            deadline = time.monotonic() + 30
            while addr is None and time.monotonic() < deadline:
                line = serve.stderr.readline()
                if "listening on " in line:
                    addr = line.split("://")[1].split()[0]
            host, port = addr.rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=10)

            def post(path, body):
                conn.request("POST", path, json.dumps(body),
                             {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                if r.status != 200:
                    raise SystemExit(f"{path}: {r.status} {data!r}")
                return json.loads(data)

            lat = []
            for i in range(n):
                g = post("/v1/acquire", {"task": f"bench-{i % 16}", "holder": "bench/1",
                                         "ttl_ms": 30000})
                t0 = time.perf_counter()
                post("/v1/release", {"lease_id": g["lease_id"], "token": g["token"],
                                     "outcome": "succeeded", "exit_code": 0})
                lat.append((time.perf_counter() - t0) * 1e3)
            conn.close()
        finally:
            serve.terminate()
            serve.wait(timeout=10)
        lat.sort()
        q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
        print(f"releases: {n}; release latency ms: median {statistics.median(lat):.3f} "
              f"p90 {q(0.90):.3f} p99 {q(0.99):.3f}")
        c = sqlite3.connect(db)
        has = c.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'history'").fetchone()[0]
        if has:
            rows = c.execute("SELECT COUNT(*) FROM history").fetchone()[0]
            c.execute("VACUUM")
            c.close()
            with_table = os.path.getsize(db)
            c = sqlite3.connect(db)
            c.execute("DROP TABLE history")
            c.commit()
            c.execute("VACUUM")
            c.close()
            without = os.path.getsize(db)
            print(f"history rows: {rows}; bytes per row on disk: {(with_table - without) / rows:.1f}")
        else:
            print("no history table (a build without history)")


if __name__ == "__main__":
    main()
