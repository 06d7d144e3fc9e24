#!/usr/bin/env python3
"""Checks that the library's imports obey the layering written in ARCHITECTURE.md.

ARCHITECTURE.md holds the layering as a fenced block tagged `layers`: one line per layer, lowest first, each a
list of modules of `crates/cuda-pinned/src` (`driver::stream`, `memory`, ...). Code in a module may name items
of its own module and of the modules of earlier lines; never those of a later line, nor of another module on its
own line. A module that is not listed belongs to its nearest listed ancestor. Paths are followed through
re-exports to where an item is defined, so `crate::memory::Pinned` counts as a use of `memory::pinned` if that
is where `Pinned` lives. Code compiled only for tests or fuzzing (`#[cfg(test)]`, `#[cfg(fuzzing)]`, ...) may
use anything and is not read.

Every run also checks itself: the same tree with a deliberate import of the top layer into the bottom one must
fail, so a check that sees nothing fails too. Exit status 0 when the layering holds, 1 with every offending
import listed otherwise.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "crates" / "cuda-pinned" / "src"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(text):
    """The code without comments, string and character literals (kept as empty literals), same line count."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    out.append("\n" if text[i] == "\n" else "")
                    i += 1
        elif c == '"' or (c == "r" and re.match(r'r#*"', text[i:]) and not re.match(r"\w", text[i - 1 : i])):
            if c == "r":
                hashes = re.match(r"r(#*)\"", text[i:]).group(1)
                end = text.index('"' + hashes, i + 2 + len(hashes)) + 1 + len(hashes)
            else:
                j = i + 1
                while text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                end = j + 1
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == "'":
            m = re.match(r"'(\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", text[i:])
            if m:
                out.append("' '")
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def item_end(code, i):
    """The end of the item starting at `i`: its `;` or the `}` closing its first brace, whichever comes first."""
    depth = 0
    while i < len(code):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif code[i] == ";" and depth == 0:
            return i + 1
        i += 1
    return i


TEST_ONLY = re.compile(r"#\[cfg\((test|fuzzing|any\((test|fuzzing),\s*(test|fuzzing)\))\)\]")


def drop_test_only(code):
    """The code without the items compiled only for tests or fuzzing, and the names of such `mod x;` files."""
    test_modules = set()
    while True:
        m = TEST_ONLY.search(code)
        if not m:
            return code, test_modules
        start = m.end()
        # Further attributes of the same item.
        while True:
            a = re.match(r"\s*#\[", code[start:])
            if not a:
                break
            start = code.index("]", start) + 1
        decl = re.match(r"\s*(pub(\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", code[start:])
        if decl:
            test_modules.add(decl.group(3))
        end = item_end(code, start)
        code = code[: m.start()] + "\n" * code.count("\n", m.start(), end) + code[end:]


def expand(tree):
    """The paths of a `use` tree: `a::{b, c::{d, e as f}}` -> [[a, b], [a, c, d], [a, c, e]]."""
    tree = re.sub(r"\s+", " ", tree).strip()
    tree = re.sub(r"\s+as\s+" + IDENT, "", tree)
    tree = tree.replace(" ", "")
    if "{" not in tree:
        return [tree.split("::")] if tree else []
    prefix, rest = tree.split("{", 1)
    inner = rest[: rest.rindex("}")]
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
    head = [p for p in prefix.split("::") if p]
    paths = []
    for part in parts:
        for sub in expand(part):
            paths.append(head + ([] if sub == ["self"] else sub))
    return paths


def module_files():
    """Every module of the library built outside tests: its path and file."""
    modules = {}

    def visit(path, file):
        code, test_modules = drop_test_only(strip(file.read_text()))
        modules[path] = (file, code)
        for m in re.finditer(r"(?m)^\s*(pub(\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", code):
            name = m.group(3)
            if name in test_modules:
                continue
            base = file.parent if file.name in ("lib.rs", "mod.rs") else file.parent / file.stem
            child = base / f"{name}.rs"
            if not child.exists():
                child = base / name / "mod.rs"
            visit(path + (name,), child)

    visit((), SRC / "lib.rs")
    return modules


def inline_modules(code):
    """(start, end, name) of every `mod x { ... }` in the code."""
    found = []
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", code):
        found.append((m.start(), item_end(code, m.start()), m.group(1)))
    return found


def uses(path, code, known):
    """(line, module path of the code, absolute path named, whether a `pub use`) for every path of the crate: those
    from `crate::`, `super::` and `self::`, and `use` paths from a child module (`use stream::Stream;`)."""
    inline = inline_modules(code)

    def scope(at):
        inner = tuple(name for start, end, name in inline if start < at < end)
        return path + inner

    def absolute(at, segments):
        here = scope(at)
        if segments[0] == "crate":
            return tuple(segments[1:])
        if segments[0] in ("super", "self"):
            base = list(here)
            while segments and segments[0] in ("super", "self"):
                if segments[0] == "super":
                    base.pop()
                segments = segments[1:]
            return tuple(base + segments)
        if here + (segments[0],) in known:
            return here + tuple(segments)
        return None

    found = []
    spans = []
    for m in re.finditer(r"\buse\s+([^;]*);", code):
        spans.append((m.start(), m.end()))
        line = code.count("\n", 0, m.start()) + 1
        for segments in expand(m.group(1)):
            target = absolute(m.start(), segments)
            if target is not None:
                public = re.search(r"\bpub(\([^)]*\))?\s*$", code[: m.start()]) is not None
                found.append((line, scope(m.start()), target, public))
    for m in re.finditer(r"(?<!\$)\b(crate|super)((?:::" + IDENT + r")+)", code):
        if any(s <= m.start() < e for s, e in spans):
            continue
        segments = [m.group(1)] + m.group(2).split("::")[1:]
        line = code.count("\n", 0, m.start()) + 1
        found.append((line, scope(m.start()), absolute(m.start(), segments), False))
    return found


def read_layers(architecture):
    block = re.search(r"```layers\n(.*?)```", architecture, re.S)
    if not block:
        sys.exit("check-layers: ARCHITECTURE.md has no ```layers block")
    layers = [line.split() for line in block.group(1).splitlines() if line.strip()]
    return {tuple(m.split("::")): (i, m) for i, line in enumerate(layers) for m in line}


def check(modules, layers):
    """The offending imports, as messages."""
    known = set(modules)
    # Inline modules are modules too.
    for path, (_, code) in list(modules.items()):
        for _, _, name in inline_modules(code):
            known.add(path + (name,))
    reexports = {}
    for path, (_, code) in modules.items():
        for line, here, target, public in uses(path, code, known):
            if public and here == path and target:
                reexports.setdefault(path, {})[target[-1]] = target

    def resolve(target, seen=0):
        """Where the item `target` is defined: the module holding it."""
        for cut in range(len(target), -1, -1):
            if target[:cut] in known:
                module = target[:cut]
                rest = target[cut:]
                if rest and rest[0] in reexports.get(module, {}) and seen < 16:
                    return resolve(reexports[module][rest[0]] + rest[1:], seen + 1)
                return module
        return ()

    def layer(module):
        for cut in range(len(module), -1, -1):
            if module[:cut] in layers:
                return module[:cut]
        return None

    errors = []
    for path, (file, code) in modules.items():
        for line, here, target, public in uses(path, code, known):
            # A module's re-export of its own descendants is its interface; a re-export of anything else is a
            # use like any other.
            # The crate root is above every layer.
            if here == () or not target or target[0] in ("sys", "driver_call"):
                continue
            if public and target[: len(here)] == here:
                continue
            defined = resolve(target)
            importer, imported = layer(here), layer(defined)
            where = f"{file.relative_to(ROOT)}:{line}"
            if importer is None or imported is None:
                if imported is None and defined == ():
                    continue  # an item of the crate root (a re-export or macro): not a layer
                missing = "::".join(here if importer is None else defined) or "the crate root"
                errors.append(f"{where}: module {missing} is in no layer of ARCHITECTURE.md")
                continue
            if importer == imported:
                continue
            (i, a), (j, b) = layers[importer], layers[imported]
            if j >= i:
                why = "a later layer" if j > i else "another module of its own layer"
                errors.append(f"{where}: {a} uses {'::'.join(target)} ({b}, {why})")
    return errors


def main():
    layers = read_layers((ROOT / "ARCHITECTURE.md").read_text())
    modules = module_files()
    errors = check(modules, layers)
    # The control: the lowest layer's first module importing the highest layer's must be caught.
    order = sorted(layers.items(), key=lambda kv: kv[1][0])
    low, high = order[0][0], order[-1][0]
    file, code = modules[low]
    planted = dict(modules)
    planted[low] = (file, code + "\nuse crate::" + "::".join(high) + "::planted;\n")
    if not any(f"{'::'.join(low)} uses {'::'.join(high)}" in e for e in check(planted, layers)):
        errors.append(f"check-layers: a planted import of {'::'.join(high)} in {'::'.join(low)} was not caught")
    for e in errors:
        print(e)
    if errors:
        print(f"check-layers: {len(errors)} import(s) against the layering of ARCHITECTURE.md", file=sys.stderr)
        return 1
    print(f"check-layers: {len(modules)} modules, {len(layers)} layered, every import within the layering")
    return 0


if __name__ == "__main__":
    sys.exit(main())
