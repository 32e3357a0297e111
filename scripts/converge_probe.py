#!/usr/bin/env python3
"""How long a fleet takes to converge, for finding what grows with it.

One `drover serve --runtime simulated` on SQLite (a fresh data dir), N
pools of 10 machines created through the API by 8 clients, then the time
from the last create until every machine is ready (counted in the store,
read-only), then the process's CPU while idle. Quicker than
`cargo bench --bench scale` (any build, no wrk, no release build needed),
and meant for comparing two builds at two sizes, not for absolute figures.

    python3 scripts/converge_probe.py POOLS BINARY [IDLE_SECONDS]
    python3 scripts/converge_probe.py 8000 target/debug/drover 30

Needs `requests` (python3-requests).
"""
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

import requests

LIMIT = int(os.environ.get("DROVER_PROBE_LIMIT", "900"))


def main():
    n, binary = int(sys.argv[1]), sys.argv[2]
    idle = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    data = tempfile.mkdtemp(prefix="drover-probe")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    proc = subprocess.Popen(
        [binary, "serve", "--runtime", "simulated", "--log-level", "warn", "--max-replicas", "100",
         "--listen", f"127.0.0.1:{port}", "--data-dir", data],
        stdout=subprocess.DEVNULL)
    try:
        run(n, idle, data, f"http://127.0.0.1:{port}", proc.pid)
    finally:
        proc.kill()
        proc.wait()


def run(n, idle, data, base, pid):
    while True:
        try:
            requests.get(base + "/healthz", timeout=1)
            break
        except requests.RequestException:
            time.sleep(0.1)
    token = open(os.path.join(data, "admin.token")).read().strip()
    headers = {"Authorization": "Bearer " + token}
    next_pool, lock = [0], threading.Lock()

    def creator():
        session = requests.Session()
        while True:
            with lock:
                i = next_pool[0]
                next_pool[0] += 1
            if i >= n:
                return
            body = {"name": f"p{i:06d}", "replicas": 10, "version": "v1.29.2", "image": "sim/node:1"}
            r = session.post(base + "/v1/pools", json=body, headers=headers)
            assert r.status_code == 201, r.text

    started = time.time()
    creators = [threading.Thread(target=creator) for _ in range(8)]
    for t in creators:
        t.start()
    for t in creators:
        t.join()
    print(f"{n} pools created in {time.time() - started:.1f} s", flush=True)
    last = time.time()
    db = sqlite3.connect(f"file:{data}/drover.db?mode=ro", uri=True)
    while True:
        ready = db.execute("select count(*) from machines where ready = 1").fetchone()[0]
        if ready == n * 10:
            break
        if time.time() - last > LIMIT:
            print(f"not ready {LIMIT} s after the last create: {ready} of {n * 10}")
            return
        time.sleep(0.5)
    print(f"all {n * 10} machines ready {time.time() - last:.1f} s after the last create", flush=True)
    if idle:
        def cpu():
            f = open(f"/proc/{pid}/stat").read().split()
            return (int(f[13]) + int(f[14])) / os.sysconf("SC_CLK_TCK")
        time.sleep(3)
        c0 = cpu()
        time.sleep(idle)
        print(f"idle CPU over {idle} s: {100 * (cpu() - c0) / idle:.2f}% of a core", flush=True)


if __name__ == "__main__":
    main()
