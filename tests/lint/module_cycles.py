#!/usr/bin/env python3
"""Checks that no crate of the workspace has an import cycle between its
top-level modules.

A crate's top-level module `m` is `src/m.rs` or `src/m/` (a binary's:
`src/bin/<name>/m.rs`). `m` depends on `n` when code of `m` names
`crate::n` (in a `use`, a `use crate::{...}` group, or inline) or, from
`m`'s own submodules, `super::n`. Test code is left out: files named
`tests.rs` or under a `tests/` folder, and everything from a
`#[cfg(test)]` line on. The dependencies must form a DAG: each cycle is
printed with the lines that close it, and the exit status is 1.

Usage: module_cycles.py [crate dirs...]  (default: every workspace
member with a `src/` folder, found from the root Cargo.toml).
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
USE_GROUP = re.compile(r"\bcrate::\{([^;]*?)\}", re.S)
CRATE_PATH = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def members():
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
    return [ROOT / m for m in cargo["workspace"]["members"]]


def code_of(path):
    """The file's code before its tests, comments blanked (a doc link to a
    module is no dependency on it); line numbers kept."""
    text = path.read_text()
    cut = text.find("#[cfg(test)]")
    text = text if cut < 0 else text[:cut]
    return "\n".join(re.sub(r"//.*", "", line) for line in text.split("\n"))


def names_in_group(group):
    """Top-level names of a `crate::{a, b::c, d::{e, f}}` group."""
    depth, cur, out = 0, "", []
    for ch in group:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        if depth == 0:
            cur += ch
    out.append(cur)
    return [re.split(r"::|\s", n.strip())[0] for n in out if n.strip()]


def deps_of(text, own, modules, nested):
    found = {}
    for m in USE_GROUP.finditer(text):
        for n in names_in_group(m.group(1)):
            found.setdefault(n, text[: m.start()].count("\n") + 1)
    for m in CRATE_PATH.finditer(text):
        found.setdefault(m.group(1), text[: m.start()].count("\n") + 1)
    if nested:
        for m in re.finditer(r"\bsuper::([a-z_][a-z0-9_]*)", text):
            found.setdefault(m.group(1), text[: m.start()].count("\n") + 1)
    return {n: line for n, line in found.items() if n in modules and n != own}


def graph(src):
    """{module: {dependency: (file, line)}} for the crate rooted at `src`."""
    modules = {}
    for p in src.iterdir():
        if p.name in ("lib.rs", "main.rs", "bin") or p.name == "tests.rs":
            continue
        if p.suffix == ".rs":
            modules.setdefault(p.stem, []).append((p, False))
        elif p.is_dir():
            for f in sorted(p.rglob("*.rs")):
                if f.name == "tests.rs" or "tests" in f.relative_to(p).parts[:-1]:
                    continue
                # Files of the folder are `m`'s submodules, except `m/mod.rs`.
                modules.setdefault(p.name, []).append((f, f.name != "mod.rs"))
    edges = {}
    for m, files in modules.items():
        for f, nested in files:
            for n, line in deps_of(code_of(f), m, modules, nested).items():
                edges.setdefault(m, {}).setdefault(n, (f, line))
    return modules, edges


def cycles(nodes, edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
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

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def roots(crate):
    src = crate / "src"
    if not src.is_dir():
        return []
    out = [(crate.relative_to(ROOT).as_posix(), src)]
    bins = src / "bin"
    if bins.is_dir():
        out += [(f"{crate.relative_to(ROOT).as_posix()} (bin {b.name})", b) for b in sorted(bins.iterdir()) if b.is_dir()]
    return out


def main(argv):
    crates = [Path(a).resolve() for a in argv[1:]] or members()
    bad = 0
    for crate in crates:
        for name, src in roots(crate):
            modules, edges = graph(src)
            for comp in cycles(modules, edges):
                bad += 1
                print(f"{name}: modules {', '.join(comp)} import each other:")
                for a in comp:
                    for b, (f, line) in sorted(edges.get(a, {}).items()):
                        if b in comp:
                            print(f"  {a} -> {b}  ({f.relative_to(ROOT)}:{line})")
    if bad:
        print(f"{bad} import cycle(s) between modules; move what both sides need into a module below them")
        return 1
    print(f"no import cycles between the modules of {len(crates)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
