"""The distribution itself: one version everywhere, the console scripts' ``--version`` and
names, the interpreter floor, and that every third-party module the package imports is
declared in pyproject.toml. Fast: nothing here builds a wheel (``.ci/wheel-smoke`` does)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import bursarcore
from bursarcore import __main__ as bursar_cli
from bursarcore._version import __version__
from bursarcore.runtime import cli as run_cli
from bursarcore.runtime import worker as worker_cli

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "bursarcore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

SCRIPTS = {"bursar": bursar_cli.main, "bursar-run": run_cli.main,
           "bursar-worker": worker_cli.main}


# ------------------------------------------------------------------------- version
def test_version_is_written_once():
    assert bursarcore.__version__ == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.dev\d+)?", __version__)
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "bursarcore._version.__version__"}
    # no other module spells the version out
    literal = re.compile(r"""__version__\s*=\s*["']""")
    writers = [p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")
               if literal.search(p.read_text())]
    assert writers == ["_version.py"]


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_version_flag(prog, capsys):
    with pytest.raises(SystemExit) as exc:
        SCRIPTS[prog](["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"{prog} {__version__}"


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_help_names_the_installed_script(prog, capsys):
    with pytest.raises(SystemExit) as exc:
        SCRIPTS[prog](["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog} ")
    assert "python -m" not in out.splitlines()[0]


def test_console_scripts_point_at_these_mains():
    scripts = PYPROJECT["project"]["scripts"]
    assert sorted(scripts) == sorted(SCRIPTS)
    for name, target in scripts.items():
        module, func = target.split(":")
        assert sys.modules[module].__dict__[func] is SCRIPTS[name]


def test_worker_version_as_a_module():
    # the form the Slurm batch scripts run: a fresh interpreter, light imports only
    out = subprocess.run([sys.executable, "-m", "bursarcore.runtime.worker", "--version"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == f"bursar-worker {__version__}"


# --------------------------------------------------------------------- interpreter
def test_requires_python_is_the_real_floor():
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(PYPROJECT["project"]["requires-python"])
    # 3.11: dataclass(weakref_slot=True) in the broker, tomllib in the simulator
    assert "3.10" not in spec and "3.11" in spec
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in spec
    listed = [c.rsplit(" :: ", 1)[1] for c in PYPROJECT["project"]["classifiers"]
              if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert listed and min(listed, key=lambda v: tuple(map(int, v.split(".")))) == "3.11"
    assert all(v in spec for v in listed)


# -------------------------------------------------------------------- dependencies
#: the distribution that provides each third-party module the package may import
DISTRIBUTION = {
    "numpy": "numpy", "fastapi": "fastapi", "starlette": "starlette", "pydantic": "pydantic",
    "uvicorn": "uvicorn", "httpx": "httpx", "matplotlib": "matplotlib", "tqdm": "tqdm",
    "numba": "numba", "parsl": "parsl", "limits": "limits", "pyrate_limiter": "pyrate-limiter",
    "token_bucket": "token-bucket", "pytest": "pytest", "cffi": "cffi",
    "prometheus_client": "prometheus-client", "msgpack": "msgpack", "websockets": "websockets",
    "msgspec": "msgspec",
}

#: which extra a module of src/bursarcore belongs to (first match); the rest is the core
OWNER = [("service/", "service"), ("client/", "service"), ("sim/kernels.py", "numba"),
         ("sim/", "sim"), ("adapters/parsl.py", "parsl"), ("bench.py", "bench"),
         ("_cffi_build.py", "cffi")]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(extra: str | None) -> dict[str, object]:
    """Distribution name -> Requirement, for the core (None) or an extra with the core and
    the extras it names (``bursarcore[sim]``)."""
    from packaging.requirements import Requirement

    project = PYPROJECT["project"]
    out: dict[str, object] = {}
    todo = [None] if extra is None else [None, extra]
    seen: set[str | None] = set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for line in (project["dependencies"] if e is None
                     else project["optional-dependencies"][e]):
            req = Requirement(line)
            if _norm(req.name) == "bursarcore":
                todo.extend(req.extras)
            else:
                out[_norm(req.name)] = req
    return out


def _third_party_imports(root: Path) -> dict[str, set[str]]:
    """Top-level module -> the files (relative to ``root``) that import it, for every
    absolute import that is neither the standard library, bursarcore, nor a module (or a
    compiled .pyx) that lives under ``root``."""
    local = ({p.stem for p in root.rglob("*.py")} | {p.stem for p in root.rglob("*.pyx")}
             | {p.name for p in root.rglob("*") if p.is_dir()})
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "bursarcore" or top in local:
                    continue
                found.setdefault(top, set()).add(path.relative_to(root).as_posix())
    return found


def _owner(relpath: str) -> str | None:
    return next((extra for prefix, extra in OWNER if relpath.startswith(prefix)), None)


def test_every_import_of_the_package_is_declared_where_it_is_used():
    imports = _third_party_imports(SRC)
    assert {"numpy", "fastapi", "starlette", "pydantic", "uvicorn"} <= set(imports)
    missing = []
    for module, files in sorted(imports.items()):
        assert module in DISTRIBUTION, f"{module} ({sorted(files)}): name its distribution"
        for f in sorted(files):
            extra = _owner(f)
            if _norm(DISTRIBUTION[module]) not in _requirements(extra):
                missing.append(f"{f} imports {module}: not in {extra or 'dependencies'}")
    assert not missing, "\n".join(missing)


def test_the_bench_extra_covers_the_benchmarks():
    declared = _requirements("bench")
    imports = _third_party_imports(ROOT / "benchmarks")
    missing = sorted(f"{m} ({sorted(files)[0]})" for m, files in imports.items()
                     if _norm(DISTRIBUTION.get(m, m)) not in declared)
    assert not missing


def test_every_requirement_has_a_tested_floor_and_bounds_only_where_known():
    from packaging.requirements import Requirement

    project = PYPROJECT["project"]
    lines = list(project["dependencies"]) + [
        r for reqs in project["optional-dependencies"].values() for r in reqs]
    lines += PYPROJECT["build-system"]["requires"]
    upper = set()
    for line in lines:
        req = Requirement(line)
        if _norm(req.name) == "bursarcore":
            continue
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops, f"{line}: every requirement states its floor (>=)"
        if ops & {"<", "<="}:
            upper.add(_norm(req.name))
    # pytest < 9.1 (schemathesis' plugin), Cython < 4 (the .pyx are Cython 3)
    assert upper == {"pytest", "cython"}


def test_the_floor_constraints_pin_every_declared_requirement():
    # .ci/min-deps installs these pins and runs the smoke test: a floor raised or a new
    # dependency declared is tested there without editing the script
    import importlib.util

    spec = importlib.util.spec_from_file_location("floors", ROOT / ".ci" / "floors.py")
    floors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floors)
    # .ci/min-deps tests every extra but the test tools
    (line,) = [ln for ln in (ROOT / ".ci" / "min-deps").read_text().splitlines()
               if ln.startswith("EXTRAS=")]
    extras = line.split("=", 1)[1].split(",")
    assert set(extras) == set(PYPROJECT["project"]["optional-dependencies"]) - {"test"}
    pins = floors.floors(PYPROJECT, extras)
    declared: dict[str, object] = {}
    for extra in extras:
        declared.update(_requirements(extra))
    assert set(pins) == set(declared)
    for name, req in declared.items():
        (floor,) = [s.version for s in req.specifier if s.operator == ">="]
        assert pins[name] == floor
    assert pins["pydantic"] and pins["starlette"] and pins["numpy"]
    with pytest.raises(SystemExit, match="no extra 'nope'"):
        floors.floors(PYPROJECT, ["nope"])


def test_an_old_setuptools_is_refused_in_one_line():
    pytest.importorskip("Cython")
    code = ("import runpy, setuptools; setuptools.__version__ = '65.5.0'; "
            "runpy.run_path('setup.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip() == ("setup.py: setuptools 65.5.0 is too old: the build needs "
                                "setuptools>=77 (pyproject.toml [build-system] requires); "
                                "pip install 'setuptools>=77'")
