#!/usr/bin/env python3
"""Lists the pairs of files under src/ that import each other (.ci/run).

A file imports another when it names one of its items: in a `use`, or as
a path from `crate::`, `super::`, `self::` or one of its own child modules.
A module and the submodules it declares are one unit (they reach into
each other's items by design), so only files that are not nested in one
another count: two such files that import each other are a circle, which
the shared items belong out of, into a file both can reach.
Exits 1 if there is such a pair, printing each.
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else "src"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def crate_of(path):
    """The crate root directory and this file's module path in it."""
    rel = os.path.relpath(path, ROOT).split(os.sep)
    if rel[0] == "bin":
        if len(rel) == 2:  # src/bin/name.rs
            return os.path.join(ROOT, "bin"), []
        base, rest = os.path.join(ROOT, "bin", rel[1]), rel[2:]
    else:
        base, rest = ROOT, rel
    if rest[-1] in ("lib.rs", "main.rs", "mod.rs"):
        rest = rest[:-1]
    else:
        rest = rest[:-1] + [rest[-1][:-3]]
    return base, rest


def file_of(base, module):
    """The file that holds `module` in the crate at `base`, if any."""
    if not module:
        for root in ("lib.rs", "main.rs"):
            if os.path.exists(os.path.join(base, root)):
                return os.path.join(base, root)
        return None
    stem = os.path.join(base, *module)
    for candidate in (stem + ".rs", os.path.join(stem, "mod.rs")):
        if os.path.exists(candidate):
            return candidate
    return None


def strip(text):
    """Code without comments, strings and char literals, in one pass."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                depth += text.startswith("/*", i) - text.startswith("*/", i)
                i += 2 if text.startswith(("/*", "*/"), i) else 1
        elif re.match(r'b?r(#*)"', text[i : i + 40]) and not re.match(r"\w", text[i - 1 : i]):
            m = re.match(r'b?r(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + m.end())
            out.append('""')
            i = n if end < 0 else end + 1 + len(m.group(1))
        elif text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif text[i] == "'":
            m = re.match(r"'(?:\\[^']{1,10}|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += m.end()
            else:
                out.append("'")
                i += 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def expand(tree):
    """`a::{b, c::{d}}` -> [a::b, a::c::d]."""
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [tree]
    head, inner = tree[: tree.index("{")], tree[tree.index("{") + 1 : tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    return [p for part in parts if part for p in expand(head + part)]


def scopes(code, module):
    """(module path, text) of the file and of every inline `mod x { }`."""
    stack, depth, start = [(module, -1)], 0, 0
    pieces = []
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{|[{}]", code):
        if m.group(1):
            pieces.append((stack[-1][0], code[start : m.start()]))
            start = m.end()
            depth += 1
            stack.append((stack[-1][0] + [m.group(1)], depth))
        elif m.group(0) == "{":
            depth += 1
        else:
            if stack[-1][1] == depth:
                pieces.append((stack[-1][0], code[start : m.start()]))
                start = m.end()
                stack.pop()
            depth -= 1
    pieces.append((stack[-1][0], code[start:]))
    return pieces


def targets(path):
    """The other files under ROOT that `path` imports or names."""
    base, module = crate_of(path)
    with open(path, encoding="utf-8") as f:
        code = strip(f.read())
    children = set(re.findall(r"\bmod\s+(" + IDENT + r")\s*;", code))
    found = set()
    for scope, text in scopes(code, module):
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            paths += expand(m.group(1))
        text = re.sub(r"\buse\s+[^;]+;", "", text)
        paths += re.findall(r"\b(?:crate|super|self)(?:::" + IDENT + ")+", text)
        for child in children:
            paths += re.findall(r"(?<![:\w])" + child + r"(?:::" + IDENT + ")+", text)
        for p in paths:
            segs = [s for s in re.split(r"::", p.split(" as ")[0]) if s]
            if not segs:
                continue
            if segs[0] == "crate":
                here, segs = [], segs[1:]
            elif segs[0] in ("super", "self"):
                here = list(scope)
                while segs and segs[0] in ("super", "self"):
                    if segs[0] == "super":
                        here = here[:-1]
                    segs = segs[1:]
            elif segs[0] in children and scope == module:
                here = list(module)
            else:
                continue
            target = None
            for n in range(len(segs), -1, -1):
                target = file_of(base, here + segs[:n])
                if target:
                    break
            if target and os.path.abspath(target) != os.path.abspath(path):
                found.add(os.path.normpath(target))
    return found


def nested(a, b):
    """Whether one of the two files is a module the other is part of."""
    (base_a, mod_a), (base_b, mod_b) = crate_of(a), crate_of(b)
    if base_a != base_b:
        return False
    shorter, longer = sorted((mod_a, mod_b), key=len)
    return longer[: len(shorter)] == shorter


def main():
    files = sorted(
        os.path.normpath(os.path.join(d, f))
        for d, _, names in os.walk(ROOT)
        for f in names
        if f.endswith(".rs")
    )
    imports = {f: targets(f) for f in files}
    pairs = sorted(
        (a, b)
        for a in files
        for b in imports[a]
        if a < b and a in imports.get(b, ()) and not nested(a, b)
    )
    for a, b in pairs:
        print(f"{a} <-> {b}")
    return 1 if pairs else 0


if __name__ == "__main__":
    sys.exit(main())
