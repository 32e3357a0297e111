#!/usr/bin/env python3
"""What one periodic pass of a converged pool costs on PostgreSQL, build
against build.

For each binary, in turns (A, B, A, B...): a private PostgreSQL 15
(`initdb` as the `postgres` user, a loopback port, removed afterwards),
one `drover serve --runtime simulated` replica on it with
`--resync-interval 10s`, POOLS pools of 10 machines created by 8 clients,
a wait for convergence, then a window of WINDOW seconds with nothing but
periodic passes (POOLS / 10 a second): drover's CPU, PostgreSQL's CPU (every
process of the private server) and its transactions, each divided by the
passes drover counted (`drover_reconcile_passes_total`). The idle cost of a
fleet is this times pools / `--resync-interval`.

    python3 scripts/pass_cost.py POOLS WINDOW ROUNDS BINARY...
    python3 scripts/pass_cost.py 1000 30 3 /tmp/drover-before target/release/drover

Needs root (PostgreSQL runs as `postgres`), Debian's postgresql and psql.
"""
import concurrent.futures
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ticks(pid):
    """utime + stime + the reaped children's, in seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class Postgres:
    def __init__(self):
        self.bin = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        self.dir = tempfile.mkdtemp(prefix="drover-pass-cost-pg")
        shutil.chown(self.dir, "postgres")
        self.port = free_port()
        self.as_postgres(f"{self.bin}/initdb -D {self.dir}/data -U drover --auth=trust -E UTF8 --no-sync --no-instructions")
        self.as_postgres(f"{self.bin}/pg_ctl -D {self.dir}/data -l {self.dir}/log -w start "
                         f"-o '-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1'")
        self.psql("create database d")
        self.postmaster = int(open(f"{self.dir}/data/postmaster.pid").readline())

    def as_postgres(self, cmd):
        subprocess.run(["su", "postgres", "-s", "/bin/sh", "-c", cmd], check=True, stdout=subprocess.DEVNULL,
                       timeout=60)

    def psql(self, query, db="postgres"):
        out = subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "drover", "-d", db, "-Atc", query],
                             capture_output=True, text=True, check=True, timeout=30)
        return out.stdout.strip()

    def cpu(self):
        """The postmaster's own and reaped children's time, plus every live child's."""
        total = ticks(self.postmaster)
        for child in open(f"/proc/{self.postmaster}/task/{self.postmaster}/children").read().split():
            try:
                total += ticks(int(child))
            except OSError:
                pass
        return total

    def transactions(self):
        return int(self.psql("select xact_commit + xact_rollback from pg_stat_database where datname = 'd'"))

    def stop(self):
        self.as_postgres(f"{self.bin}/pg_ctl -D {self.dir}/data -m fast -w stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def measure(binary, pools, window):
    pg = Postgres()
    data = tempfile.mkdtemp(prefix="drover-pass-cost")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "serve", "--runtime", "simulated", "--log-level", "warn", "--max-replicas", "100",
         "--resync-interval", "10s", "--listen", f"127.0.0.1:{port}", "--data-dir", data,
         "--database-url", f"postgres://drover@127.0.0.1:{pg.port}/d"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while not os.path.exists(f"{data}/admin.token"):
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{binary} did not start")
            time.sleep(0.1)
        token = open(f"{data}/admin.token").read().strip()

        def call(method, path, body=None):
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}{path}", method=method,
                data=json.dumps(body).encode() if body is not None else None,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as res:
                return res.read()

        time.sleep(1)
        body = lambda i: {"name": f"p-{i}", "replicas": 10, "version": "v1.29.2", "image": "sim/node:1"}
        with concurrent.futures.ThreadPoolExecutor(8) as clients:
            list(clients.map(lambda i: call("POST", "/v1/pools", body(i)), range(pools)))
        want = pools * 10
        deadline = time.time() + 300
        while int(pg.psql("select count(*) from machines where ready", "d") or 0) < want:
            if time.time() > deadline:
                raise RuntimeError("the fleet did not converge in 300 s")
            time.sleep(1)
        time.sleep(15)  # the passes that converged it are done; what is left is periodic

        def passes():
            lines = call("GET", "/metrics").decode().splitlines()
            return sum(float(l.split()[-1]) for l in lines if l.startswith("drover_reconcile_passes_total"))

        before = (passes(), ticks(proc.pid), pg.cpu(), pg.transactions(), time.time())
        time.sleep(window)
        after = (passes(), ticks(proc.pid), pg.cpu(), pg.transactions(), time.time())
        n = after[0] - before[0]
        return {"passes/s": n / (after[4] - before[4]), "drover ms": 1e3 * (after[1] - before[1]) / n,
                "postgres ms": 1e3 * (after[2] - before[2]) / n, "transactions": (after[3] - before[3]) / n}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)
        pg.stop()


def main():
    pools, window, rounds, binaries = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    runs = {b: [] for b in binaries}
    for r in range(rounds):
        for b in binaries:
            m = measure(b, pools, window)
            runs[b].append(m)
            print(f"round {r + 1}, {b}: " + ", ".join(f"{k} {v:.3f}" for k, v in m.items()), flush=True)
    print(f"\n{pools} pools x 10, one replica, --resync-interval 10s, {window} s windows, median of {rounds}:\n")
    print("| build | passes a second | drover CPU a pass (ms) | PostgreSQL CPU a pass (ms) | transactions a pass |")
    print("|---|---:|---:|---:|---:|")
    for b, ms in runs.items():
        med = {k: statistics.median(m[k] for m in ms) for k in ms[0]}
        print(f"| `{b}` | {med['passes/s']:.1f} | {med['drover ms']:.3f} | {med['postgres ms']:.3f} | "
              f"{med['transactions']:.2f} |")


if __name__ == "__main__":
    main()
