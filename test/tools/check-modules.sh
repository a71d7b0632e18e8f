#!/usr/bin/env bash
# The module graph inside a crate: which areas of its source import which.
# A circle between areas (a strongly connected component of the graph) is
# code that cannot be split into crates, so `make lint` fails on a circle
# that is not in the allow-list below, on an allow-list entry that no
# longer matches a circle (the list can only shrink), on an arrow from an
# area to one of a higher layer, and on an area with no layer. Circles
# between the files of one area (a folder's mod.rs and its children) are
# printed, not failed: an area moves into a crate whole.
#
# An arrow is a path the source names: `use crate::…`, `use super::…`,
# `use self::…`, a child module used by name, and `crate::…`/`super::…`
# paths and aliases of imported modules in the code. Comments, strings and
# test modules (`#[cfg(test)]`) do not count. A module is a file (or a
# folder's mod.rs); an area is a top-level module, and under the container
# modules listed in CONTAINERS each child is an area of its own.
#
# Usage: check-modules.sh [--report] [crate-dir]   (default: hub-controller)
#   --report  print every arrow between areas and the file-level arrows of
#             each circle, and exit 0 whatever it finds
set -euo pipefail
cd "$(dirname "$0")/../.."

report=0
if [ "${1:-}" = "--report" ]; then
  report=1
  shift
fi
crate=${1:-hub-controller}

# Modules whose children are areas of their own.
CONTAINERS="transport transport::grpc"

# The layers of the hub-controller's areas, bottom up; an area may import
# its own layer and those below (docs/architecture.md, "Modules and
# layers").
LAYERS=$(cat <<'EOF'
base        compact metrics lease_records transport::grpc::metrics
model       authorized transport::grpc::assign transport::grpc::render transport::grpc::identity transport::grpc::commands
watch       watch
trust       transport::grpc::issued transport::grpc::revoke transport::grpc::tls transport::grpc::holders certs
state       transport::grpc::cluster transport::grpc::claims transport::grpc::config
write       status
hub         transport::grpc::hub transport::grpc::live
serve       transport::grpc::session transport::grpc
transports  transport::manifestwork transport
wiring      report leading crate
EOF
)

# Circles that remain, as the areas they join (space-separated, sorted),
# a tab, and why they are not broken yet. A circle found must be one of
# these or inside one; an entry that matches no circle exactly fails the
# check. None remain in the hub-controller.
ALLOWED=$(cat <<'EOF'
EOF
)

CONTAINERS="$CONTAINERS" LAYERS="$LAYERS" ALLOWED="$ALLOWED" REPORT="$report" \
  python3 - "$crate/src" <<'PY'
import os, re, sys
from collections import defaultdict

src = sys.argv[1]
containers = set(os.environ["CONTAINERS"].split())
report = os.environ["REPORT"] == "1"
layer_of, layer_names = {}, []
for line in os.environ["LAYERS"].splitlines():
    parts = line.split()
    if parts:
        layer_names.append(parts[0])
        for area in parts[1:]:
            layer_of[area] = len(layer_names) - 1
allowed = []
for line in os.environ["ALLOWED"].splitlines():
    if line.strip():
        areas, _, why = line.partition("\t")
        allowed.append((frozenset(areas.split()), why.strip()))

def module_of(rel):
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts) if parts else "crate"

def strip(text):
    # Comments and string literals name no module.
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"'(?:\\.|[^'\\])'", "' '", text)
    text = re.sub(r'(?<!\w)r(#*)"(?:.|\n)*?"\1', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"//[^\n]*", "", text)
    return text

def cut_tests(text):
    # An inline `#[cfg(test)] mod x { … }` holds tests: drop it.
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)

files, texts, test_only = {}, {}, set()
for root, _, names in os.walk(src):
    for n in names:
        if n.endswith(".rs"):
            if root == src and n == "main.rs" and os.path.exists(os.path.join(src, "lib.rs")):
                continue  # the binary's root, a crate of its own
            rel = os.path.relpath(os.path.join(root, n), src)
            mod = module_of(rel)
            files[mod] = rel
            texts[mod] = strip(open(os.path.join(root, n), encoding="utf-8").read())
for mod, text in texts.items():
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
        child = m.group(1) if mod == "crate" else mod + "::" + m.group(1)
        test_only.update(k for k in files if k == child or k.startswith(child + "::"))
modules = set(files) - test_only

def parent(mod):
    return "crate" if "::" not in mod else mod.rsplit("::", 1)[0]

def child(mod, name):
    c = name if mod == "crate" else mod + "::" + name
    return c if c in files else None

def resolve(mod, segs):
    """The module a path names (the longest module prefix), or None."""
    if not segs:
        return None
    cur = mod
    head = segs[0]
    if head == "crate":
        cur, rest = "crate", segs[1:]
    elif head == "self":
        rest = segs[1:]
    elif head == "super":
        rest = segs
        while rest and rest[0] == "super":
            cur, rest = parent(cur), rest[1:]
    elif child(mod, head):
        rest = segs
    else:
        return None
    for s in rest:
        nxt = child(cur, s)
        if not nxt:
            # A name the module re-exports from another crate is that crate's.
            ext = external.get(cur, ())
            if s in ext or ("*" in ext and s not in defined[cur]):
                return None
            return cur
        cur = nxt
    return cur

def expand(tree):
    """`a::{b, c::{d as e}}` -> [(['a','b'], 'b'), (['a','c','d'], 'e')]."""
    tree = re.sub(r"\s+", " ", tree).strip()
    tree = re.sub(r"\s*(::|\{|\}|,)\s*", r"\1", tree)
    tree = re.sub(r"^pub(\([^)]*\))? ", "", tree)
    def split_top(s):
        items, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                items.append(cur); cur = ""; continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        items.append(cur)
        return [i for i in items if i]
    def walk(prefix, s):
        out = []
        for it in split_top(s):
            brace = it.find("{")
            if brace >= 0 and it.endswith("}"):
                head = it[:brace].rstrip(":")
                out += walk(prefix + (head.split("::") if head else []), it[brace + 1:-1])
                continue
            name, _, alias = it.partition(" as ")
            path = prefix + name.split("::")
            out.append((path, alias or path[-1]))
        return out
    return walk([], tree)

external = defaultdict(set)  # module -> names it re-exports from other crates
for mod in modules:
    for m in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", cut_tests(texts[mod])):
        for path, alias in expand(m.group(1)):
            if path[0] not in ("crate", "self", "super") and not child(mod, path[0]):
                external[mod].add(alias)

defined = {mod: set(re.findall(r"\b(?:struct|enum|fn|trait|type|const|static|union|macro_rules!)\s+(\w+)", texts[mod]))
           for mod in modules}

arrows = defaultdict(set)  # module -> modules it imports
for mod in modules:
    text = cut_tests(texts[mod])
    aliases = {}
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        for path, alias in expand(m.group(1)):
            path = [p for p in path if p != "*"]
            target = resolve(mod, path)
            if target:
                arrows[mod].add(target)
                if target != mod and path and path[-1] != "self" and child(parent(target), path[-1]) == target:
                    aliases[alias] = target
                elif path and path[-1] == "self":
                    aliases[path[-2] if len(path) > 1 else alias] = target
    body = re.sub(r"\buse\s+[^;]+;", " ", text)
    for m in re.finditer(r"(?<![\w:])((?:\w+::)+)\w+", body):
        segs = m.group(1).rstrip(":").split("::")
        if segs[0] in aliases:
            target = resolve(aliases[segs[0]], ["self"] + segs[1:])
        else:
            target = resolve(mod, segs)
        if target:
            arrows[mod].add(target)

def area(mod):
    if mod == "crate":
        return "crate"
    parts = mod.split("::")
    depth = 1
    for i in range(1, len(parts)):
        if "::".join(parts[:i]) in containers:
            depth = i + 1
    return "::".join(parts[:depth])

edges = defaultdict(set)       # area -> areas
via = defaultdict(set)         # (area, area) -> file arrows
for a, targets in arrows.items():
    for b in targets:
        if b in modules and area(a) != area(b):
            edges[area(a)].add(area(b))
            via[(area(a), area(b))].add(f"{files[a]} -> {files[b]}")

def sccs(nodes, edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out

areas = {area(m) for m in modules}
circles = sccs(areas, edges)
file_circles = sccs(modules, {m: {t for t in ts if t in modules and t != m} for m, ts in arrows.items()})
n_arrows = sum(len(v) for v in edges.values())
up = sorted((a, b) for a in edges for b in edges[a]
            if a in layer_of and b in layer_of and layer_of[b] > layer_of[a])
unlayered = sorted(a for a in areas if a not in layer_of)

print(f"check-modules: {src}: {len(modules)} modules in {len(areas)} areas, "
      f"{n_arrows} arrows between areas, {len(up)} against the layers, "
      f"{len(circles)} circle(s) between areas, {len(file_circles)} between files")
if report:
    for a in sorted(edges):
        for b in sorted(edges[a]):
            mark = "  UP" if (a, b) in up else ""
            print(f"  {a} -> {b}{mark}")
for i, comp in enumerate(circles, 1):
    members = sorted(files[m] for m in modules if area(m) in comp)
    print(f"circle {i}: {len(comp)} areas, {len(members)} files: {' '.join(comp)}")
    if report:
        for a in comp:
            for b in comp:
                for arrow in sorted(via.get((a, b), ())):
                    print(f"    {arrow}")
for i, comp in enumerate(file_circles, 1):
    print(f"file circle {i}: {' '.join(sorted(files[m] for m in comp))}")
for a, b in up:
    print(f"against the layers: {a} ({layer_names[layer_of[a]]}) -> {b} ({layer_names[layer_of[b]]})")
    if report:
        for arrow in sorted(via[(a, b)]):
            print(f"    {arrow}")

problems = []
for a in unlayered:
    problems.append(f"area {a} has no layer: add it to LAYERS in test/tools/check-modules.sh")
for a, b in up:
    problems.append(f"{a} imports {b}, a higher layer: move the code, or pass what it needs down as a trait or plain data")
for comp in circles:
    if not any(set(comp) <= ok for ok, _ in allowed):
        problems.append(f"new import circle: {' '.join(comp)}")
for ok, why in allowed:
    if not any(set(comp) == ok for comp in circles):
        problems.append(f"allowed circle {' '.join(sorted(ok))} is gone or smaller: shrink the allow-list")
if report:
    sys.exit(0)
for p in problems:
    print(f"check-modules: {p}", file=sys.stderr)
if problems:
    print(f"check-modules: {len(problems)} problem(s)", file=sys.stderr)
    sys.exit(1)
PY
