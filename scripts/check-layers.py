#!/usr/bin/env python3
"""Checks that modules import only from their own layer or the layers below it.

Reads every `use` declaration and every `crate::` / `super::` / `self::` path in the Rust
sources of the crates in LAYERS (comments and string literals are skipped), resolves each to a
module, and fails, naming file:line, when a module imports from a layer above its own, when the
files of layered modules import each other (directly or round a longer circle), or when an
import breaks a narrower rule (ONLY). Crate rules check a crate's Cargo.toml for dependencies
it must not have.

    scripts/check-layers.py              # checks the repository this script is in
    scripts/check-layers.py --root DIR   # checks another tree laid out the same way
    scripts/check-layers.py --self-test  # checks that bad trees fail and a good one passes

Python 3 standard library only.
"""

import argparse
import os
import re
import sys
import tempfile

# ---------------------------------------------------------------------------------------------
# The table. Per crate source directory: its layers, lowest first, each a name and the modules
# in it (paths as written after `crate::`; a module's submodules belong to it). A module may
# import from its own layer and the layers before it; modules of no layer are not checked, nor
# are imports of them. The root of a layered module (here `ads`, its `mod.rs`) is its public
# face: it may re-export anything, and no layered module may import through it.
# ---------------------------------------------------------------------------------------------
LAYERS = {
    "xds-server/src": [
        # ADS, as `ads/mod.rs` lists it: resource maps and frames first, the transport last.
        ("ads: maps and frames", ["ads::map_diff", "ads::compressed", "ads::payload", "ads::frames"]),
        ("ads: snapshots", ["ads::snapshot"]),
        ("ads: protocol", ["ads::protocol"]),
        ("ads: codec", ["ads::codec"]),
        # The push side builds snapshots and reads what streams publish (the layers before it);
        # the stream and the server register with its hub (the layers after it).
        ("push", ["push::hub", "push::status", "push::push_loop"]),
        ("ads: stream", ["ads::pacing", "ads::budget", "ads::stream"]),
        ("ads: server", ["ads::server"]),
        ("ads: transport", ["ads::wire"]),
    ],
    "xds-core/src": [
        # What everything stands on: hashing, bounds, the kinds table, the credential question.
        ("core: foundations", ["hash", "bounds", "kinds", "credentials", "test_choices"]),
        ("core: model", ["model", "manifest", "config_events"]),
        ("core: translation", ["translate"]),
        ("core: EnvoyFilters", ["envoyfilter"]),
        # The seam the server drives and the channels the index publishes on.
        ("core: generator seam", ["outputs", "generator"]),
        # The index: its state says what an event changed, the render cache acts on it.
        ("core: tenant state", ["index::keyed", "index::state"]),
        ("core: render cache", ["index::interner", "index::route_encoding", "index::render_cache"]),
    ],
}

# Faces of layered modules: importable only from outside their layers.
FACES = {"xds-server/src": ["ads"], "xds-core/src": ["index"]}

# Narrower rules inside the order: (importer, module imported, the only paths it may use).
ONLY = {
    "xds-server/src": [
        # Push reads the value a stream publishes, never the protocol state itself.
        ("push", "ads::protocol", ["ads::protocol::status", "ads::protocol::Protocol", "ads::protocol::Nack"]),
    ],
}

# ---------------------------------------------------------------------------------------------
# Crate rules: (Cargo.toml of a crate, dependencies it must not have). A listed manifest that
# does not exist is an error, so a rule cannot silently stop checking.
# ---------------------------------------------------------------------------------------------
CRATE_RULES = [
    # The pure core: no server, no runtime, no client, no transport, no file watching, no codec.
    # tokio only for its channels (the index publishes its outputs on watch channels): no
    # default features, nothing but `sync`, so no runtime, timer, I/O or process can come in.
    (
        "xds-core/Cargo.toml",
        ["meshplane-xds", ("tokio", ["sync"]), "kube", "tonic", "axum", "hyper", "notify", "zstd"],
    ),
]


# --- reading Rust sources --------------------------------------------------------------------

CHAR_LITERAL = re.compile(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'")


def strip_code(text):
    """The text with comments, string and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
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
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            m = CHAR_LITERAL.match(text, i)
            if m:
                out.append(" " * (m.end() - i))
                i = m.end()
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def module_of(rel):
    """Module path of a source file relative to its crate's src (`ads/protocol/mod.rs` ->
    ["ads", "protocol"])."""
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def expand_use(tree):
    """The paths of a use tree (`a::{b, c::{d as e}, self}` -> a::b, a::c::d, a)."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix, s):
        if s.endswith("}") and "{" in s:
            head, body = s[: s.index("{")], s[s.index("{") + 1 : -1]
            base = prefix + [p for p in head.split("::") if p]
            for part in split_top(body):
                yield from walk(base, part)
            return
        segs = prefix + [p for p in s.split("::") if p]
        if segs and segs[-1] == "self":
            segs = segs[:-1]
        yield segs

    yield from walk([], tree)


USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH = re.compile(r"(?<![\w:])((?:crate|super|self)(?:\s*::\s*(?:super|\w+))+)")
INLINE_MOD = re.compile(r"\bmod\s+(\w+)\s*\{")


def imports(path, rel):
    """(line, module path of the importing code, resolved path, path as written, whether it is
    a re-export) per import."""
    with open(path, encoding="utf-8") as f:
        code = strip_code(f.read())
    file_module = module_of(rel)
    child_modules = set()
    base = os.path.dirname(path) if os.path.basename(path) == "mod.rs" else path[:-3]
    if os.path.isdir(base):
        for name in os.listdir(base):
            if name.endswith(".rs"):
                child_modules.add(name[:-3])
            elif os.path.isdir(os.path.join(base, name)):
                child_modules.add(name)
    # Inline modules (`mod tests { .. }`): where each opens and closes.
    spans = []
    for m in INLINE_MOD.finditer(code):
        depth, j = 0, m.end() - 1
        while j < len(code):
            depth += code[j] == "{"
            depth -= code[j] == "}"
            if depth == 0:
                break
            j += 1
        spans.append((m.start(), j, m.group(1)))

    def module_at(pos):
        inner = [name for start, end, name in sorted(spans) if start < pos < end]
        return file_module + inner

    def resolve(segs, here):
        if not segs:
            return None
        if segs[0] == "crate":
            return segs[1:]
        if segs[0] in ("super", "self"):
            cur = list(here)
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    if not cur:
                        return None
                    cur.pop()
                segs = segs[1:]
            return cur + segs
        if segs[0] in child_modules and here == file_module:
            return here + segs
        return None

    found = []
    taken = set()
    for m in USE.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        here = module_at(m.start())
        for segs in expand_use(m.group(2)):
            target = resolve(segs, here)
            if target is not None:
                found.append((line, here, target, "::".join(segs), bool(m.group(1))))
        taken.update(range(m.start(), m.end()))
    for m in PATH.finditer(code):
        if m.start() in taken:
            continue
        segs = [s.strip() for s in m.group(1).split("::")]
        line = code.count("\n", 0, m.start()) + 1
        here = module_at(m.start())
        target = resolve(segs, here)
        if target is not None:
            found.append((line, here, target, "::".join(segs), False))
    return found


# --- the check -------------------------------------------------------------------------------


def layer_of(module, layers, faces):
    """(rank, layer name, table entry) of a module path, or None. Faces rank above all."""
    best = None
    for rank, (name, entries) in enumerate(layers):
        for entry in entries:
            e = entry.split("::")
            if module[: len(e)] == e and (best is None or len(e) > len(best[2].split("::"))):
                best = (rank, name, entry)
    if best is None and module and module[0] in faces and len(module) >= 1:
        # An item of the face itself (`crate::ads::AdsServer`), not of a layered module.
        return (len(layers), "the face of " + module[0], module[0])
    return best


def under(path, prefix):
    p = prefix.split("::")
    return path[: len(p)] == p


def check_crate(root, src, layers, faces, only=()):
    errors = []
    src_dir = os.path.join(root, src)
    if not os.path.isdir(src_dir):
        return ["%s: no such directory (named in LAYERS)" % src]
    files = []
    for dirpath, _, names in os.walk(src_dir):
        for name in sorted(names):
            if name.endswith(".rs"):
                path = os.path.join(dirpath, name)
                files.append((path, os.path.relpath(path, src_dir).replace(os.sep, "/")))
    modules = {tuple(module_of(rel)) for _, rel in files}

    def file_module(path):
        """The module of the file that defines `path` (its longest prefix that is a file)."""
        for n in range(len(path), -1, -1):
            if tuple(path[:n]) in modules:
                return tuple(path[:n])
        return ()

    # Imports between the files of layered modules: no circles, whatever the layers say.
    edges = {}
    for path, rel in sorted(files):
        shown = os.path.join(src, rel)
        for line, here, target, written, reexport in imports(path, rel):
            own = layer_of(here, layers, faces)
            if own is None or own[1].startswith("the face of"):
                continue
            for importer, imported, allowed in only:
                if under(here, importer) and under(target, imported) and not any(under(target, a) for a in allowed):
                    errors.append(
                        "%s:%d: %s imports %s: of %s it may use only %s"
                        % (shown, line, "::".join(here), written, imported, ", ".join(allowed))
                    )
            theirs = layer_of(target, layers, faces)
            if theirs is None:
                continue
            if theirs[0] > own[0]:
                errors.append(
                    "%s:%d: %s (layer %r) imports %s (layer %r, above it)"
                    % (shown, line, "::".join(here), own[1], written, theirs[1])
                )
            a, b = "::".join(file_module(here)), "::".join(file_module(target))
            # A module re-exporting what its own submodules define is their face, not a user.
            if a == b or (reexport and b.startswith(a + "::")):
                continue
            edges.setdefault(a, {}).setdefault(b, (shown, line, written))
    errors.extend(circles(edges))
    return errors


def circles(edges):
    """Every circle of imports between table entries, once each."""
    found, seen = [], set()

    def visit(node, stack):
        for nxt in sorted(edges.get(node, {})):
            if nxt in stack:
                ring = stack[stack.index(nxt) :] + [nxt]
                key = frozenset(ring)
                if key not in seen:
                    seen.add(key)
                    hops = []
                    for a, b in zip(ring, ring[1:]):
                        shown, line, written = edges[a][b]
                        hops.append("%s:%d: %s imports %s" % (shown, line, a, written))
                    found.append("import circle %s:\n    %s" % (" -> ".join(ring), "\n    ".join(hops)))
            elif len(stack) < 32:
                visit(nxt, stack + [nxt])

    for start in sorted(edges):
        visit(start, [start])
    return found


def dependencies(manifest):
    """(name, how it is declared) of each dependency a Cargo.toml declares, in any dependency
    table: the text after `=` for an inline declaration, None for a table of its own."""
    found, in_deps = [], False
    with open(manifest, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            header = re.match(r"^\[(.+)\]$", line)
            if header:
                table = header.group(1).strip()
                in_deps = bool(re.search(r"(^|\.)(dev-|build-)?dependencies$", table))
                sub = re.match(r"^(?:.*\.)?(?:dev-|build-)?dependencies\.([\w-]+)$", table)
                if sub:
                    found.append((sub.group(1), None))
                continue
            if in_deps:
                m = re.match(r"^([\w-]+)\s*(?:\.\s*\w+\s*)?=(.*)$", line)
                if m:
                    found.append((m.group(1), m.group(2).strip()))
                    pkg = re.search(r'package\s*=\s*"([\w-]+)"', line)
                    if pkg:
                        found.append((pkg.group(1), m.group(2).strip()))
    return found


def confined_breach(declared, allowed):
    """Why a dependency allowed only with `allowed` features breaks that, or None: it must be
    an inline table with `default-features = false` and features drawn from `allowed`."""
    if declared is None or not declared.startswith("{"):
        return "must be declared inline with default-features = false"
    if not re.search(r"default-features\s*=\s*false", declared):
        return "must turn default features off"
    if re.search(r"workspace\s*=\s*true", declared):
        return "must not take the workspace's features"
    listed = re.search(r"features\s*=\s*\[([^\]]*)\]", declared)
    features = re.findall(r'"([\w-]+)"', listed.group(1)) if listed else []
    extra = [f for f in features if f not in allowed]
    if extra:
        return "may use only features %s, not %s" % (allowed, extra)
    return None


def check_crate_rules(root, rules):
    errors = []
    for manifest, banned in rules:
        path = os.path.join(root, manifest)
        if not os.path.exists(path):
            errors.append("%s: no such manifest (named in CRATE_RULES)" % manifest)
            continue
        outright = [b for b in banned if isinstance(b, str)]
        confined = dict(b for b in banned if not isinstance(b, str))
        for dep, declared in dependencies(path):
            if dep in outright:
                errors.append("%s: depends on %s, which this crate must not" % (manifest, dep))
            elif dep in confined:
                why = confined_breach(declared, confined[dep])
                if why:
                    errors.append("%s: depends on %s, which %s" % (manifest, dep, why))
    return errors


def check(root, layers=None, faces=None, rules=None, only=None):
    layers = LAYERS if layers is None else layers
    faces = FACES if faces is None else faces
    rules = CRATE_RULES if rules is None else rules
    only = ONLY if only is None else only
    errors = []
    for src, table in sorted(layers.items()):
        errors.extend(check_crate(root, src, table, set(faces.get(src, [])), only.get(src, [])))
    errors.extend(check_crate_rules(root, rules))
    return errors


# --- self-test -------------------------------------------------------------------------------


def self_test():
    """Runs the check on small trees: each bad one must fail naming its import, the good one
    must pass."""
    layers = {
        "app/src": [
            ("low", ["ads::low"]),
            ("mid", ["ads::mid", "push"]),
            ("high", ["ads::high"]),
        ]
    }
    faces = {"app/src": ["ads"]}
    only = {"app/src": [("push", "ads::low", ["ads::low::Map"])]}
    good = {
        "app/src/ads/mod.rs": "pub mod low;\npub mod mid;\npub mod high;\npub use high::Server;\n",
        "app/src/ads/low/mod.rs": "pub struct Map;\npub mod a;\npub use a::A;\n// use super::high::Server;\nconst S: &str = \"crate::ads::high\";\n",
        "app/src/ads/low/a.rs": "use super::Map;\npub struct A;\n",
        "app/src/ads/mid.rs": "use super::low::Map;\nuse crate::push::Hub;\nfn f(_: &'static str) { let _ = crate::ads::low::Map; }\n",
        "app/src/ads/high.rs": "use super::{low::Map, mid};\npub struct Server;\n#[cfg(test)]\nmod tests {\n    use super::super::low::Map;\n}\n",
        "app/src/push.rs": "use crate::ads::low::Map;\npub struct Hub;\n",
        "app/src/other.rs": "use crate::ads::high::Server;\nuse crate::ads::Server as S;\n",
        "app/Cargo.toml": "[package]\nname = \"app\"\n\n[dependencies]\nserde = \"1\"\n# tokio = \"1\"\nsync-lib = { version = \"1\", default-features = false, features = [\"sync\"] }\n",
    }
    rules = [("app/Cargo.toml", ["tokio", ("sync-lib", ["sync"])])]
    bad = [
        # (file, its text, what the report must name)
        ("app/src/ads/low/mod.rs", "use super::high::Server;\n", "app/src/ads/low/mod.rs:1: ads::low (layer 'low') imports super::high::Server"),
        ("app/src/ads/low/mod.rs", "pub struct Map;\nfn f() { crate::ads::mid::g(); }\n", "app/src/ads/low/mod.rs:2:"),
        ("app/src/ads/low/a.rs", "use crate::ads::{mid::X, high::{Server as S}};\n", "imports crate::ads::high::Server"),
        ("app/src/ads/mid.rs", "use crate::ads::Server;\n", "imports crate::ads::Server (layer 'the face of ads'"),
        ("app/src/push.rs", "use crate::ads::high::Server;\n", "app/src/push.rs:1: push (layer 'mid') imports"),
        ("app/src/ads/low/a.rs", "#[cfg(test)]\nmod tests {\n    use super::super::super::high::Server;\n}\n", "app/src/ads/low/a.rs:3: ads::low::a::tests"),
        ("app/src/push.rs", "use crate::ads::mid::X;\npub struct Hub;\n", "import circle"),
        # Files of one module: a parent may re-export its submodules, not use them.
        ("app/src/ads/low/mod.rs", "use a::A;\n", "import circle ads::low -> ads::low::a -> ads::low"),
        ("app/src/push.rs", "use crate::ads::low::{Map, Other};\n", "app/src/push.rs:1: push imports crate::ads::low::Other: of ads::low it may use only ads::low::Map"),
        ("app/Cargo.toml", "[dependencies]\ntokio = { version = \"1\" }\n", "app/Cargo.toml: depends on tokio"),
        ("app/Cargo.toml", "[dependencies]\nrt = { package = \"tokio\", version = \"1\" }\n", "app/Cargo.toml: depends on tokio"),
        ("app/Cargo.toml", "[target.'cfg(unix)'.dependencies.tokio]\nversion = \"1\"\n", "app/Cargo.toml: depends on tokio"),
        # A dependency allowed with some features only.
        ("app/Cargo.toml", "[dependencies]\nsync-lib = \"1\"\n", "depends on sync-lib, which must be declared inline"),
        ("app/Cargo.toml", "[dependencies]\nsync-lib = { version = \"1\", features = [\"sync\"] }\n", "must turn default features off"),
        ("app/Cargo.toml", "[dependencies]\nsync-lib = { version = \"1\", default-features = false, features = [\"sync\", \"rt\"] }\n", "not ['rt']"),
        ("app/Cargo.toml", "[dependencies.sync-lib]\nversion = \"1\"\n", "depends on sync-lib, which must be declared inline"),
        ("app/Cargo.toml", "[dependencies]\nsync-lib = { workspace = true, default-features = false }\n", "workspace"),
    ]
    failures = []

    def run(files):
        with tempfile.TemporaryDirectory() as tmp:
            for rel, text in files.items():
                path = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
            return check(tmp, layers, faces, rules, only)

    errors = run(good)
    if errors:
        failures.append("the good tree failed:\n  " + "\n  ".join(errors))
    for rel, text, expect in bad:
        files = dict(good)
        if expect == "import circle":
            files[rel] = files[rel] + text
        else:
            files[rel] = text
        errors = run(files)
        if not any(expect in e for e in errors):
            failures.append("%s with %r: expected an error naming %r, got %r" % (rel, text, expect, errors))
    missing = dict(good)
    del missing["app/Cargo.toml"]
    if not any("no such manifest" in e for e in run(missing)):
        failures.append("a crate rule on a missing manifest passed")
    if failures:
        print("check-layers self-test FAILED:\n" + "\n".join(failures), file=sys.stderr)
        return 1
    print("check-layers self-test: %d bad trees fail, the good one passes" % (len(bad) + 1))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    errors = check(args.root)
    if errors:
        print("layering check FAILED:", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 1
    print("layering check: %s pass" % ", ".join(sorted(LAYERS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
