#!/usr/bin/env python3
"""Report import cycles between drover's modules; exit 1 when there is one.

    python3 scripts/module_cycles.py [--depth 1|2|both] [--within MOD] [--tests]

Every file under src/ (but src/main.rs, which is its own crate and sees the
library as `drover::`) is mapped to its module path (src/db/mod.rs and
src/db.rs are `crate::db`, src/db/pools.rs is `crate::db::pools`, inline
`mod x { ... }` blocks are modules too). Its references are the paths it
names: `use` trees and inline paths that start with `crate::`, `super::`,
`self::` or the name of one of the module's own child modules. A path
through a re-export (`pub use gate::WriteTx;` in src/db/mod.rs, named as
`crate::db::WriteTx`) counts as a reference to where the item lives
(`crate::db::gate`), not to the module that re-exports it.

Modules are then grouped at a depth and the strongly connected components
of the graph printed with one example (file:line) per edge:
- depth 1: the top-level modules (`crate::db`, `crate::http`, ...);
- depth 2: inside each top-level module `crate::x`, its children
  (`crate::x::y`), with `crate::x` itself (its mod.rs or x.rs) a node of its
  own: a mod.rs that both uses its children and is used by them is a cycle,
  the one "AppState lives in app.rs" makes.

Test code (`#[cfg(test)] mod ...`) is left out unless --tests is given: a
test reaching into its parent is not a dependency of the program.
Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
RAW_PREFIX = re.compile(r"(?:br|r)(#*)\"")


def strip_code(text: str) -> str:
    """Blank out comments, string and char literals, keeping newlines (so line
    numbers hold) and braces outside them (so nesting can be tracked)."""
    out = []
    i, n = 0, len(text)

    def blank(s: str) -> str:
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := RAW_PREFIX.match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append(blank(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(blank(text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            m = re.match(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'])'", text[i:i + 12])
            if m:
                out.append(blank(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_of(path: Path, src: Path) -> tuple[str, ...]:
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts.pop()
    return ("crate", *parts)


def expand_use(tree: str) -> list[str]:
    """`a::{b, c::{self, d}}` -> ['a::b', 'a::c', 'a::c::d'] (aliases dropped)."""
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = re.sub(r"\s+", "", tree)
    results: list[str] = []

    def parse(s: str, prefix: str) -> None:
        depth, start, items = 0, 0, []
        for k, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:k])
                start = k + 1
        items.append(s[start:])
        for item in items:
            if not item:
                continue
            brace = item.find("{")
            if brace >= 0 and item.endswith("}"):
                head = item[:brace].rstrip(":")
                parse(item[brace + 1:-1], join(prefix, head))
            else:
                if item in ("self", "*"):
                    results.append(prefix)
                else:
                    results.append(join(prefix, item.removesuffix("::*")))

    def join(a: str, b: str) -> str:
        return f"{a}::{b}" if a and b else a or b

    parse(tree, "")
    return results


class Module:
    def __init__(self, path: tuple[str, ...], file: Path, test: bool):
        self.path = path
        self.file = file
        self.test = test
        self.children: set[str] = set()


def scan(src: Path):
    """Returns (modules by path, references as (from, to-path-segments, file,
    line, test), re-exports as {(module, name): path-segments})."""
    modules: dict[tuple[str, ...], Module] = {}
    refs = []
    reexports: dict[tuple[tuple[str, ...], str], list[str]] = {}
    test_files: set[tuple[str, ...]] = set()
    files = sorted(p for p in src.rglob("*.rs") if p != src / "main.rs")
    stripped = {}
    for f in files:
        stripped[f] = strip_code(f.read_text(encoding="utf-8"))
        mod = module_of(f, src)
        modules[mod] = Module(mod, f, False)

    # Declared children, inline modules and test-only modules.
    mod_decl = re.compile(r"(#\[cfg\(test\)\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([;{])")
    for f in files:
        text, base = stripped[f], module_of(f, src)
        # Track inline nesting: a stack of (module path, brace depth at which it closes, is test).
        stack = [(base, -1, False)]
        depth = 0
        events = []  # (offset, module path, is test) wherever the current module changes
        for m in re.finditer(r"[{}]|" + mod_decl.pattern, text):
            tok = m.group(0)
            if tok == "{":
                depth += 1
            elif tok == "}":
                depth -= 1
                if len(stack) > 1 and stack[-1][1] == depth:
                    stack.pop()
                    events.append((m.end(), stack[-1][0], stack[-1][2]))
            else:
                cur, _, cur_test = stack[-1]
                name, is_test = m.group(2), bool(m.group(1)) or cur_test
                child = (*cur, name)
                modules.setdefault(cur, Module(cur, f, cur_test)).children.add(name)
                if m.group(3) == "{":
                    modules[child] = Module(child, f, is_test)
                    stack.append((child, depth, is_test))
                    depth += 1
                    events.append((m.end(), child, is_test))
                elif is_test:
                    test_files.add(child)
        stripped[f] = (text, [(0, base, False)] + events)

    for t in list(test_files):
        for p, m in modules.items():
            if p[: len(t)] == t:
                m.test = True

    use_re = re.compile(r"(\bpub(?:\s*\([^)]*\))?\s+)?\buse\s+([^;]+);")
    for f in files:
        text, events = stripped[f]
        line_starts = [0] + [k + 1 for k, ch in enumerate(text) if ch == "\n"]

        def where(off: int):
            cur = (None, False)
            for e_off, e_mod, e_test in events:
                if e_off <= off:
                    cur = (e_mod, e_test)
                else:
                    break
            return cur

        def line_of(off: int) -> int:
            lo, hi = 0, len(line_starts)
            while lo + 1 < hi:
                mid = (lo + hi) // 2
                if line_starts[mid] <= off:
                    lo = mid
                else:
                    hi = mid
            return lo + 1

        spans = []
        for m in use_re.finditer(text):
            spans.append((m.start(), m.end()))
            mod, is_test = where(m.start())
            for p in expand_use(m.group(2)):
                refs.append((mod, p.split("::"), f, line_of(m.start()), is_test))
                if m.group(1) and not is_test and not m.group(2).rstrip().endswith("*") and " as " not in m.group(2):
                    reexports[(mod, p.split("::")[-1])] = p.split("::")
        in_use = lambda off: any(a <= off < b for a, b in spans)  # noqa: E731
        path_re = re.compile(r"(?<![A-Za-z0-9_:])(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)")
        for m in path_re.finditer(text):
            if in_use(m.start()):
                continue
            segs = [m.group(1)] + [s for s in re.split(r"\s*::\s*", m.group(2)) if s]
            mod, is_test = where(m.start())
            refs.append((mod, segs, f, line_of(m.start()), is_test))
    return modules, refs, reexports


def resolve(modules, here: tuple[str, ...], segs: list[str], reexports=None, hops: int = 0):
    """The deepest known module a path names (following re-exports), or None
    for an outside crate."""
    first = segs[0]
    if first == "crate":
        base, rest = ("crate",), segs[1:]
    elif first in ("self", "super"):
        base, rest = here, segs
        while rest and rest[0] in ("self", "super"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    elif here in modules and first in modules[here].children:
        base, rest = here, segs
    else:
        return None
    target = base
    for k, s in enumerate(rest):
        if (*target, s) in modules:
            target = (*target, s)
            continue
        again = (reexports or {}).get((target, s))
        if again is not None and hops < 8:
            through = resolve(modules, target, again + rest[k + 1:], reexports, hops + 1)
            return through if through is not None else target
        break
    return target


def tarjan(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(Path(__file__).resolve().parent.parent / "src"))
    ap.add_argument("--depth", choices=["1", "2", "both"], default="both")
    ap.add_argument("--within", help="at depth 2, only this top-level module (e.g. http)")
    ap.add_argument("--tests", action="store_true", help="count references made by test code")
    args = ap.parse_args()
    src = Path(args.src)
    root = src.parent
    modules, refs, reexports = scan(src)

    def group(path: tuple[str, ...], depth: int) -> str:
        return "::".join(path[: 1 + depth])

    found = 0
    levels = [1, 2] if args.depth == "both" else [int(args.depth)]
    for depth in levels:
        graph: dict[str, set[str]] = defaultdict(set)
        example: dict[tuple[str, str], str] = {}
        for here, segs, f, line, is_test in refs:
            if here is None or (is_test and not args.tests):
                continue
            target = resolve(modules, here, segs, reexports)
            if target is None or len(target) < 2:
                continue
            if depth == 2 and (here[:2] != target[:2] or len(here) < 2):
                continue
            if depth == 2 and args.within and here[1] != args.within:
                continue
            a, b = group(here, depth), group(target, depth)
            if a == b:
                continue
            graph[a].add(b)
            example.setdefault((a, b), f"{f.relative_to(root)}:{line}")
        for comp in tarjan(graph):
            found += 1
            members = set(comp)
            print(f"cycle at depth {depth}: {' , '.join(comp)}")
            for a in comp:
                for b in sorted(graph[a] & members):
                    print(f"    {a} -> {b}    ({example[(a, b)]})")
    if found:
        print(f"{found} cycle(s)")
        return 1
    print("no import cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
