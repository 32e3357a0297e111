#!/usr/bin/env python3
"""Checks rules of the code's layering that the compiler does not:

1. HTTP handlers only parse, call a service and answer: nothing under
   src/http opens a transaction, calls a store function or runs SQL.
2. Every background task is tracked, so that shutdown waits for it and
   cancels it: no bare `tokio::spawn` (or thread) outside tests.
3. The reconciler reads the time only through its clock (`ctx.clock`), so
   that paused-clock tests see every deadline: no `Utc::now()` in
   src/reconcile outside tests.

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
]


def production_code(path: pathlib.Path) -> str:
    if path.name == "tests.rs":
        return ""
    text = path.read_text()
    cut = re.search(r"^#\[cfg\(test\)\]\s*\nmod tests", text, re.M)
    return text[: cut.start()] if cut else text


def main() -> int:
    failures = []
    for scope, pattern, why in RULES:
        for path in sorted((ROOT / scope).rglob("*.rs")):
            for n, line in enumerate(production_code(path).splitlines(), 1):
                code = line.split("//", 1)[0]
                if pattern.search(code):
                    failures.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}\n    -> {why}")
    if failures:
        print("layering rules broken:\n" + "\n".join(failures))
        return 1
    print("layering rules hold: http calls services, every task is tracked, the reconciler uses its clock")
    return 0


if __name__ == "__main__":
    sys.exit(main())
