#!/usr/bin/env python3
"""Checks rules of the code's layering that the compiler does not:

1. HTTP handlers only parse, call a service and answer: nothing under
   src/http opens a transaction, calls a store function or runs SQL.
2. Every background task is tracked, so that shutdown waits for it and
   cancels it: no bare `tokio::spawn` (or thread) outside tests.
3. The reconciler reads the time only through its clock (`ctx.clock`), so
   that paused-clock tests see every deadline: no `Utc::now()` in
   src/reconcile outside tests.
4. SQL lives in src/db: no query (`sqlx::query*`, the `on_store!` macro,
   a statement's text) anywhere else in src.
5. The bottom layers use only what docs/architecture.md says they use:
   src/domain nothing but itself (and `telemetry::truncate`, a pure
   helper); src/db the domain, the store's location (`config`), the
   types of what it stores from `k8s` and `runtime`, the scrape gauges
   (`metrics`), `error` and `clock`.

Test code is left out: a file named tests.rs, and everything from a
`#[cfg(test)]` module to the end of a file (tests come last; clippy's
items_after_test_module enforces it).
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

RULES = [
    (
        "src/http",
        re.compile(r"\bdb::(\w+::)*[a-z_]+\s*\(|\.begin_write\(|\.begin_background\(|\.commit\(\)|\bsqlx::query"),
        "handlers call services; the store is theirs (no db:: call, transaction or SQL in src/http)",
    ),
    (
        "src",
        re.compile(r"\btokio::spawn\(|\btokio::task::spawn\(|\bstd::thread::spawn\(|\bthread::spawn\(|Handle::current\(\)\.spawn"),
        "spawn on a TaskTracker (or a JoinSet that is awaited) so that shutdown waits for the task",
    ),
    (
        "src/reconcile",
        re.compile(r"\bUtc::now\(\)"),
        "the reconciler reads the time through ctx.clock, so that tests can move it",
    ),
    (
        "src",
        re.compile(
            r"\bsqlx::query|\bquery_as\(|\bquery_scalar\(|\bon_store!|\bpg_notify\b"
            r"|\"\s*(select\s.*\sfrom\s|insert\s+into\s|update\s+\w+\s+set\s|delete\s+from\s)",
            re.I,
        ),
        "SQL lives in src/db: add a function to the table's module there and call it",
        "src/db",
    ),
    (
        "src/domain",
        re.compile(r"\bcrate::(?!(domain|telemetry)\b)\w+"),
        "src/domain is pure: it uses nothing of the crate but itself (docs/architecture.md)",
    ),
    (
        "src/db",
        re.compile(r"\bcrate::(?!(domain|db|config|k8s|runtime|metrics|error|clock)\b)\w+"),
        "src/db uses the domain and the few types docs/architecture.md lists; move the call up to a service",
    ),
]


def production_code(path: pathlib.Path) -> str:
    if path.name == "tests.rs":
        return ""
    text = path.read_text()
    cut = re.search(r"^#\[cfg\(test\)\]\s*\nmod tests", text, re.M)
    return text[: cut.start()] if cut else text


def main() -> int:
    failures = []
    for scope, pattern, why, *exempt in RULES:
        for path in sorted((ROOT / scope).rglob("*.rs")):
            if any(path.is_relative_to(ROOT / e) for e in exempt):
                continue
            for n, line in enumerate(production_code(path).splitlines(), 1):
                code = line.split("//", 1)[0]
                if pattern.search(code):
                    failures.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}\n    -> {why}")
    if failures:
        print("layering rules broken:\n" + "\n".join(failures))
        return 1
    print(
        "layering rules hold: http calls services, every task is tracked, the reconciler uses its clock, "
        "SQL is in src/db, db and domain use only what docs/architecture.md says"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
