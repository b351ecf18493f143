"""The configuration reference (docs/configuration.md), generated from source.

Every environment variable the platform reads is found by parsing the
source with ``ast``, never by importing it: the settings (``config/
settings.py``, or each module of a ``config/settings/`` package) and the
other packages' modules (the engine's switches, tracing, seed_demo...).
Each variable's meaning comes from ``config/settings_reference.toml``; its
default comes from the code, unless the TOML words it better.

    python -m config.settings_reference           # print the reference
    python -m config.settings_reference --write   # rewrite docs/configuration.md
    python -m config.settings_reference --check   # exit 1 if undocumented or stale

``tests/config/test_settings_reference.py`` runs the check, so a variable
added without a meaning, or a reference not regenerated, fails the tests.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEANINGS = Path(__file__).with_name("settings_reference.toml")
OUTPUT = ROOT / "docs" / "configuration.md"
# The settings, in either layout: one module, or a package of them.
SETTINGS_SOURCES = ("config/settings.py", "config/settings/*.py")
# Other code that reads the environment of the process it runs in.
PACKAGES = ("config", "console", "inference", "safety", "fleet", "billing", "tenants", "wire")
PACKAGES += ("gpuworkers", "batches")
NAME = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")
# Calls that look like environment reads but write (or are another mapping's).
NOT_READS = {"setdefault", "pop", "setenv", "delenv"}


@dataclass(slots=True)
class EnvRead:
    """One place the source reads a variable."""

    name: str
    # The default as source text; None when unset means "not set".
    default: str | None
    path: str
    line: int


@dataclass(slots=True)
class Variable:
    """A variable with every place that reads it and its documented meaning."""

    name: str
    reads: list[EnvRead] = field(default_factory=list)
    section: str = ""
    meaning: str = ""
    default_text: str | None = None

    @property
    def paths(self) -> list[str]:
        return sorted({r.path for r in self.reads})


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


class _Reads(ast.NodeVisitor):
    """Collects the environment reads of one module (see ``source_reads``)."""

    def __init__(self, path: str, constants: dict[str, str]):
        self.path = path
        self.constants = constants
        self.reads: list[EnvRead] = []
        self.unresolved: list[str] = []
        self._or_rest: dict[int, str] = {}

    def _name(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return self.constants.get(node.id)
        return None

    def _add(self, name: str, default: str | None, node: ast.AST) -> None:
        if NAME.match(name):
            self.reads.append(EnvRead(name, default, self.path, node.lineno))

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        # os.environ.get("X") or "fallback": the fallback is the default.
        if isinstance(node.op, ast.Or) and len(node.values) > 1:
            rest = node.values[1:]
            # Unless the fallback is another variable: that one is read too.
            if not any("env" in _dotted(c.func).lower() for v in rest for c in _calls(v)):
                self._or_rest[id(node.values[0])] = " or ".join(ast.unparse(v) for v in rest)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = _dotted(node.func)
        last = func.rsplit(".", 1)[-1]
        if node.args and "env" in func.lower() and last not in NOT_READS:
            name = self._name(node.args[0])
            if name is not None:
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                if default is None and len(node.args) > 1:
                    default = node.args[1]
                text = ast.unparse(default) if default is not None else None
                self._add(name, text if text is not None else self._or_rest.get(id(node)), node)
            elif not isinstance(node.args[0], ast.Name) or node.args[0].id not in self._params:
                # A read by a computed name cannot be documented: say where.
                self.unresolved.append(f"{self.path}:{node.lineno}: {ast.unparse(node)}")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        # "X" in os.environ
        if (
            len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
            and _dotted(node.comparators[0]).endswith("environ")
        ):
            name = self._name(node.left)
            if name is not None:
                self._add(name, None, node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        # os.environ["X"], read (an assignment to it is a write).
        if isinstance(node.ctx, ast.Load) and _dotted(node.value) == "os.environ":
            name = self._name(node.slice)
            if name is not None:
                self._add(name, "(required)", node)
        self.generic_visit(node)

    _params: frozenset[str] = frozenset()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # A helper such as env_int(name, default) reads by its parameter;
        # its callers are the reads, found by their own "env" call.
        outer = self._params
        args = node.args
        names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        self._params = outer | frozenset(names)
        self.generic_visit(node)
        self._params = outer

    visit_AsyncFunctionDef = visit_FunctionDef


def source_reads(source: str, path: str) -> tuple[list[EnvRead], list[str]]:
    """The env reads of one module's source, and the reads by computed names.

    A read is a call whose dotted name contains "env" with a variable name
    (a literal, or a module constant) as first argument (``env.str``,
    ``env_int``, ``os.environ.get``, ``os.getenv``), ``"X" in os.environ``
    or ``os.environ["X"]``.
    """
    tree = ast.parse(source, filename=path)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    visitor = _Reads(path, constants)
    visitor.visit(tree)
    return visitor.reads, visitor.unresolved


def source_files(root: Path = ROOT) -> tuple[list[Path], list[Path]]:
    """(settings modules, other modules) under ``root``, in a stable order."""
    settings = sorted({p for pattern in SETTINGS_SOURCES for p in root.glob(pattern)})
    others = sorted(
        p
        for package in PACKAGES
        for p in (root / package).rglob("*.py")
        if p not in settings and "migrations" not in p.parts and p != Path(__file__).resolve()
    )
    return settings, others


def collect(root: Path = ROOT) -> tuple[dict[str, Variable], list[str]]:
    """Every variable read under ``root`` by name, and the unresolved reads."""
    variables: dict[str, Variable] = {}
    unresolved: list[str] = []
    settings, others = source_files(root)
    for path in settings + others:
        reads, computed = source_reads(path.read_text(), str(path.relative_to(root)))
        unresolved += computed
        for read in reads:
            variables.setdefault(read.name, Variable(read.name)).reads.append(read)
    return variables, unresolved


@dataclass(slots=True)
class Meanings:
    """config/settings_reference.toml: sections of variables, and names to skip."""

    # name -> (section, meaning, default wording or None)
    entries: dict[str, tuple[str, str, str | None]]
    # Documented here though the code does not read them (tools and libraries do).
    external: set[str]
    # Names the scan finds that are not environment variables.
    ignored: set[str]
    sections: list[str]
    intro: str


def load_meanings(path: Path = MEANINGS) -> Meanings:
    data = tomllib.loads(path.read_text())
    entries, external, sections = {}, set(), []
    for section in data["section"]:
        sections.append(section["title"])
        for name, spec in section["variables"].items():
            if isinstance(spec, str):
                spec = {"meaning": spec}
            entries[name] = (section["title"], spec["meaning"].strip(), spec.get("default"))
            if spec.get("external"):
                external.add(name)
    return Meanings(entries, external, set(data.get("ignored", [])), sections, data["intro"])


@dataclass(slots=True)
class Problems:
    undocumented: list[str]
    unread: list[str]
    unresolved: list[str]

    def __bool__(self) -> bool:
        return bool(self.undocumented or self.unread or self.unresolved)

    def report(self) -> str:
        lines = []
        if self.undocumented:
            lines.append(
                "Read from the environment but not described in "
                f"{MEANINGS.relative_to(ROOT)}: " + ", ".join(self.undocumented)
            )
        if self.unread:
            lines.append(
                f"Described in {MEANINGS.relative_to(ROOT)} but read nowhere "
                "(remove them, or mark them external = true): " + ", ".join(self.unread)
            )
        if self.unresolved:
            lines.append("Read by a computed name (use a literal): " + "; ".join(self.unresolved))
        return "\n".join(lines)


def check(variables: dict[str, Variable], unresolved: list[str], meanings: Meanings) -> Problems:
    read = set(variables) - meanings.ignored
    return Problems(
        undocumented=sorted(read - set(meanings.entries)),
        unread=sorted(set(meanings.entries) - read - meanings.external),
        unresolved=unresolved,
    )


def _default_cell(variable: Variable) -> str:
    if variable.default_text is not None:
        return variable.default_text
    texts = []
    for read in variable.reads:
        text = "unset" if read.default in (None, "None") else read.default
        try:
            value = ast.literal_eval(read.default) if read.default else None
        except (ValueError, SyntaxError):
            value = None
        if isinstance(value, str):
            text = f"`{value}`" if value else "empty"
        elif isinstance(value, list | tuple):
            text = ", ".join(f"`{v}`" for v in value) or "empty"
        elif isinstance(value, bool | int | float):
            text = f"`{str(value).lower() if isinstance(value, bool) else value}`"
        elif text not in ("unset", "(required)"):
            text = f"`{text}`"
        if text not in texts:
            texts.append(text)
    return "; ".join(texts)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(variables: dict[str, Variable], meanings: Meanings) -> str:
    """docs/configuration.md's text."""
    by_section: dict[str, list[Variable]] = defaultdict(list)
    for name, (section, meaning, default) in meanings.entries.items():
        variable = variables.get(name, Variable(name))
        variable.section, variable.meaning, variable.default_text = section, meaning, default
        by_section[section].append(variable)
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m config.settings_reference --write` from the",
        "source and config/settings_reference.toml; edit those, not this file. -->",
        "",
        meanings.intro.strip(),
        "",
    ]
    for section in meanings.sections:
        out += [
            f"## {section}",
            "",
            "| Variable | Default | Meaning | Read in |",
            "|---|---|---|---|",
        ]
        for variable in sorted(by_section[section], key=lambda v: v.name):
            where = ", ".join(f"`{p}`" for p in variable.paths) or "(a script or library)"
            default = _default_cell(variable) if variable.reads else (variable.default_text or "")
            out.append(
                f"| `{variable.name}` | {_cell(default)} | {_cell(variable.meaning)} | {where} |"
            )
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite {OUTPUT.relative_to(ROOT)}")
    mode.add_argument("--check", action="store_true", help="exit 1 if undocumented or stale")
    args = parser.parse_args(argv)
    variables, unresolved = collect()
    meanings = load_meanings()
    problems = check(variables, unresolved, meanings)
    if problems:
        print(problems.report(), file=sys.stderr)
        return 1
    text = render(variables, meanings)
    if args.write:
        OUTPUT.write_text(text)
        print(f"wrote {OUTPUT.relative_to(ROOT)} ({len(meanings.entries)} variables)")
    elif args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(
                f"{OUTPUT.relative_to(ROOT)} is stale: python -m config.settings_reference --write",
                file=sys.stderr,
            )
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
