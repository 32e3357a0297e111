#!/usr/bin/env python3
"""A bounded soak of drover's HTTP edge (the limits of SECURITY.md); results in BENCHMARKS.md.

    cargo build --release -j2 && python3 scripts/soak_edge.py

Starts `drover serve --runtime simulated` on a fresh data directory and
measures, with the Python standard library only:

1. Growth without a token: 10,000 DELETE requests for a pool with a 60 KB
   name, no token, over 16 kept-alive connections. Every answer must be
   401; the store (database + WAL) must grow by less than GROWTH_BOUND and
   the audit trail by at most one record per burst window.
2. Idle sockets and streams: 100 connections that never send a byte, 100
   kept-alive connections idle after one request, and 200 event streams.
   Reports the server's resident memory before, with all of them open, and
   after; every socket must be closed by the server within its limit plus
   a margin (header timeout; idle timeout; a stream's lifetime, after which
   its connection is idle and closes with the idle timeout).

Limits are shortened so that the soak ends in about a minute; they are
printed with the results. Exits non-zero when a bound is broken.
Environment: DROVER (binary, default target/release/drover).
"""

import asyncio
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time

DROVER = os.environ.get("DROVER", "target/release/drover")
REQUESTS = 10_000
CONNECTIONS = 16
PATH_BYTES = 60_000
BURST_WINDOW_S = 10
GROWTH_BOUND = 1024 * 1024  # bytes for the 10,000 refusals
HEADER_TIMEOUT_S = 5
IDLE_TIMEOUT_S = 10
STREAM_LIFETIME_S = 20
IDLE_SOCKETS = 100
KEPT_ALIVE = 100
STREAMS = 200
RSS_BOUND_KIB = 64 * 1024  # growth of resident memory with all 400 open
MARGIN_S = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def store_bytes(data):
    return sum(os.path.getsize(os.path.join(data, f"drover.db{s}"))
               for s in ("", "-wal") if os.path.exists(os.path.join(data, f"drover.db{s}")))


async def read_response(reader):
    """Reads one HTTP/1.1 response with a Content-Length; returns its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    if length:
        await reader.readexactly(length)
    return status


async def refusals(port, count, statuses):
    name = "p" * PATH_BYTES
    request = (f"DELETE /v1/pools/{name} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(count):
        writer.write(request)
        await writer.drain()
        statuses.append(await read_response(reader))
    writer.close()


async def closed_within(reader, limit):
    """Seconds until the server closes the connection (None past `limit`),
    and until a chunked body ended (None if none did)."""
    started = time.monotonic()
    ended = None
    tail = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), timeout=limit - (time.monotonic() - started))
            if not chunk:
                return time.monotonic() - started, ended
            tail = (tail + chunk)[-16:]
            if ended is None and tail.endswith(b"\r\n0\r\n\r\n"):
                ended = time.monotonic() - started
    except (asyncio.TimeoutError, ValueError):
        return None, ended
    except ConnectionError:
        return time.monotonic() - started, ended


async def soak_sockets(port, token, pid):
    before = rss_kib(pid)
    opened = []
    for _ in range(IDLE_SOCKETS):
        opened.append(("silent", HEADER_TIMEOUT_S, await asyncio.open_connection("127.0.0.1", port)))
    for _ in range(KEPT_ALIVE):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        await read_response(reader)
        opened.append(("kept-alive", IDLE_TIMEOUT_S, (reader, writer)))
    for _ in range(STREAMS):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write((f"GET /v1/pools/demo/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Authorization: Bearer {token}\r\n\r\n").encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:80]
        # The stream ends with its lifetime; its connection is then idle.
        opened.append(("stream", STREAM_LIFETIME_S + IDLE_TIMEOUT_S, (reader, writer)))
    await asyncio.sleep(1)
    peak = rss_kib(pid)
    started = time.monotonic()
    results = await asyncio.gather(*(closed_within(rw[0], limit + MARGIN_S) for _, limit, rw in opened))
    elapsed = time.monotonic() - started
    open_left = {}
    slowest = {}
    for (kind, _, _), (took, ended) in zip(opened, results):
        if took is None:
            open_left[kind] = open_left.get(kind, 0) + 1
        else:
            slowest[kind] = max(slowest.get(kind, 0), took)
        if ended is not None:
            slowest[kind + " body"] = max(slowest.get(kind + " body", 0), ended)
    for _, _, (_, writer) in opened:
        writer.close()
    await asyncio.sleep(1)
    return before, peak, rss_kib(pid), open_left, slowest, elapsed


def main():
    data = tempfile.mkdtemp(prefix="drover-soak-")
    port = free_port()
    args = [DROVER, "serve", "--runtime", "simulated", "--listen", f"127.0.0.1:{port}",
            "--data-dir", data, "--log-level", "warn",
            "--audit-burst-window", f"{BURST_WINDOW_S}s",
            "--header-read-timeout", f"{HEADER_TIMEOUT_S}s",
            "--idle-timeout", f"{IDLE_TIMEOUT_S}s",
            "--stream-lifetime", f"{STREAM_LIFETIME_S}s"]
    server = subprocess.Popen(args)
    failures = []
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        with open(os.path.join(data, "admin.token")) as f:
            token = f.read().strip()
        import urllib.request
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/pools", method="POST",
            data=json.dumps({"name": "demo", "replicas": 0, "version": "v1.29.2", "paused": True}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        urllib.request.urlopen(req).read()
        time.sleep(1)

        # 1. Growth without a token.
        before = store_bytes(data)
        statuses = []
        started = time.monotonic()
        per = REQUESTS // CONNECTIONS
        async def flood():
            await asyncio.gather(*(refusals(port, per, statuses) for _ in range(CONNECTIONS)))
        asyncio.run(asyncio.wait_for(flood(), 600))
        took = time.monotonic() - started
        time.sleep(BURST_WINDOW_S + 2)  # let the last burst close and write its count
        grown = store_bytes(data) - before
        db = sqlite3.connect(f"file:{os.path.join(data, 'drover.db')}?mode=ro", uri=True)
        rows, repeats, longest = db.execute(
            "select count(*), sum(repeats), max(length(path)) from audit where outcome = 'unauthenticated'").fetchone()
        db.close()
        windows = int(took // BURST_WINDOW_S) + 1
        print(f"refusals: {len(statuses)} in {took:.1f} s ({len(statuses) / took:.0f}/s), "
              f"all 401: {set(statuses) == {401}}")
        print(f"store grew {grown} bytes (bound {GROWTH_BOUND}); audit records {rows} "
              f"(bound {windows + 1}) counting {repeats} refusals; longest audited path {longest} bytes")
        if set(statuses) != {401} or len(statuses) != per * CONNECTIONS:
            failures.append("not every refusal answered 401")
        if grown >= GROWTH_BOUND:
            failures.append(f"the store grew {grown} bytes")
        if rows > windows + 1:
            failures.append(f"{rows} audit records for {windows} windows")

        # 2. Idle sockets and streams.
        before, peak, after, left, slowest, elapsed = asyncio.run(soak_sockets(port, token, server.pid))
        print(f"RSS: {before} KiB before, {peak} KiB with {IDLE_SOCKETS} silent + {KEPT_ALIVE} kept-alive "
              f"sockets and {STREAMS} streams open (+{peak - before} KiB, bound +{RSS_BOUND_KIB} KiB), "
              f"{after} KiB after they closed")
        print(f"closed by the server: slowest silent {slowest.get('silent', 0):.1f} s "
              f"(limit {HEADER_TIMEOUT_S} s), kept-alive {slowest.get('kept-alive', 0):.1f} s "
              f"(limit {IDLE_TIMEOUT_S} s), stream ended {slowest.get('stream body', 0):.1f} s "
              f"(lifetime {STREAM_LIFETIME_S} s) and its connection closed {slowest.get('stream', 0):.1f} s "
              f"(lifetime + idle {STREAM_LIFETIME_S + IDLE_TIMEOUT_S} s); still open: {left or 'none'}")
        if left:
            failures.append(f"sockets left open: {left}")
        if peak - before > RSS_BOUND_KIB:
            failures.append(f"RSS grew {peak - before} KiB")
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(data, ignore_errors=True)
    if failures:
        print("FAILED: " + "; ".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
