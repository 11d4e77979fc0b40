#!/usr/bin/env python3
"""Checks that node/src's modules form layers whose imports only point down, and that no
two modules import each other, directly or through others.

A module's imports are its `crate::...` paths outside comments and its test module. Layers,
lowest first; a module may import its own layer's modules (without a cycle) and any lower
layer's, never a higher one's. Prints every offending import and exits 1 when there is one.
"""
import glob
import os
import re
import sys

LAYERS = ["error", "wire", "security", "config", "cluster", "ops", "api", "server"]

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node", "src")
files = [f for f in glob.glob(os.path.join(root, "**", "*.rs"), recursive=True)]
mods = {}
for f in files:
    rel = os.path.relpath(f, root)[:-3]
    if rel.startswith("bin" + os.sep) or rel == "lib":
        continue
    name = rel.replace(os.sep + "mod", "").replace(os.sep, "::")
    mods[name] = f


def resolve(path):
    parts = path.split("::")
    for k in range(len(parts), 0, -1):
        cand = "::".join(parts[:k])
        if cand in mods:
            return cand
    return None


deps = {}
for name, f in mods.items():
    text = open(f, encoding="utf-8").read()
    cut = text.find("#[cfg(test)]")
    if cut >= 0:
        text = text[:cut]
    text = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
    found = set()
    for path in re.findall(r"crate::([a-z_:]+)", text):
        found.add(resolve(path))
    for group in re.findall(r"use crate::\{([^}]*)\}", text, re.S):
        for part in re.split(r",", group):
            found.add(resolve(part.strip()))
    found.discard(None)
    found.discard(name)
    deps[name] = found

problems = []
for name in sorted(deps):
    top = name.split("::")[0]
    if top not in LAYERS:
        problems.append(f"{name}: not in any layer; add its folder to LAYERS in {__file__}")
        continue
    for d in sorted(deps[name]):
        dtop = d.split("::")[0]
        if dtop != top and LAYERS.index(dtop) > LAYERS.index(top):
            problems.append(f"{name} imports {d}: {dtop} is above {top}")

# Cycles among modules (Tarjan's strongly connected components).
index, low, stack, on, sccs = {}, {}, [], set(), []
counter = [0]


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in deps[v]:
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
            sccs.append(sorted(comp))


sys.setrecursionlimit(10000)
for v in sorted(deps):
    if v not in index:
        visit(v)
for comp in sccs:
    problems.append("import cycle among " + ", ".join(comp))

if problems:
    print("node/src layering: " + str(len(problems)) + " problem(s)")
    for p in problems:
        print("  " + p)
    sys.exit(1)
print(f"node/src layering: {len(mods)} modules in {len(LAYERS)} layers, imports only point down, no cycle")
