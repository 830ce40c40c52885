"""Print a pip constraints file pinning each requirement of the named extras (with the core
dependencies and the extras they name) to the floor pyproject.toml declares (its ``>=``).

    python .ci/floors.py service sim numba parsl > constraints.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def _parse(line: str) -> tuple[str, list[str], dict[str, str]]:
    """``name[extra,...] op version, ...`` (no markers) -> (name, extras, {op: version})."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*(.*)", line)
    if m is None or ";" in line:
        raise SystemExit(f"floors: cannot read the requirement {line!r}")
    name, extras, spec = m.group(1), m.group(2), m.group(3)
    ops = dict((op, v.strip()) for op, v in
               re.findall(r"(>=|<=|==|!=|~=|<|>)\s*([^,\s]+)", spec))
    return name, [e.strip() for e in extras.split(",")] if extras else [], ops


def floors(pyproject: dict, extras: list[str]) -> dict[str, str]:
    project = pyproject["project"]
    self = project["name"].lower()
    out: dict[str, str] = {}
    todo: list[str | None] = [None, *extras]
    seen: set[str | None] = set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        if extra is not None and extra not in project["optional-dependencies"]:
            raise SystemExit(f"floors: no extra {extra!r} in pyproject.toml")
        for line in (project["dependencies"] if extra is None
                     else project["optional-dependencies"][extra]):
            name, sub, ops = _parse(line)
            key = re.sub(r"[-_.]+", "-", name).lower()
            if key == self:
                todo.extend(sub)
                continue
            if ">=" not in ops:
                raise SystemExit(f"floors: {line!r} (extra {extra or 'core'}) has no floor")
            out[key] = ops[">="]
    return out


def main(argv: list[str]) -> int:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml")
                              .read_text())
    for name, version in sorted(floors(pyproject, argv).items()):
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
