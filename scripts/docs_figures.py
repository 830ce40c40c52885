"""Write the default simulation's figures into the docs, from a run of it.

    python scripts/docs_figures.py            # rewrite the marked blocks in place
    python scripts/docs_figures.py --check    # exit 1 (and say where) if a block is stale

A page holds each generated block between two markers::

    <!-- begin generated: NAME (scripts/docs_figures.py) -->
    ...
    <!-- end generated: NAME -->

and everything between them is replaced by what ``BLOCKS[NAME]`` renders from a fresh run
of the shipped ``default`` scenario. The run is deterministic (seed, manual clock, the
same decisions in every backend), so the figures change only when the code's decisions
do; ``tests/docs/test_docs_figures.py`` fails when a page and the code disagree. Nothing here
is a timing: wall-clock figures depend on the machine and live in ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "simulator.md"]
MARK = re.compile(r"(<!-- begin generated: (?P<name>[\w-]+) \(scripts/docs_figures\.py\) -->\n)"
                  r"(?P<body>.*?)"
                  r"(<!-- end generated: (?P=name) -->)", re.S)


def run_default() -> Any:
    """The shipped default scenario, as ``bursar simulate`` runs it (without the report)."""
    from bursarcore.sim import Simulation, load_scenario

    return Simulation(load_scenario("default")).run()


def _n(x: float) -> str:
    return f"{x:,.0f}"


def default_run(res: Any) -> str:
    """The table of the default run's figures that docs/simulator.md cites."""
    s = res.summary
    fac = s["facility"]
    rows = [
        ("run", f"`{s['scenario']}` scenario, seed {s['seed']}, {_n(s['duration'])} "
                f"simulated s, {s['capacity']:,} GPUs"),
        ("pool", f"{fac['pilots_joined']} pilots of {fac['nodes_per_pilot']} node × "
                 f"{fac['slots_per_node']} GPUs, joined at t = 0 (`add_nodes`)"),
        ("broker calls by the simulator", f"{res.timing['broker_calls']:,} (the pool "
                                          "manager's are not counted)"),
    ]
    rows += [(f"claim ({c['claim']}): {c['verdict']}", c["measured"]) for c in res.claims]
    lines = ["| figure | this version's run |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


BLOCKS: dict[str, Callable[[Any], str]] = {"default-run": default_run}


def rewrite(text: str, rendered: dict[str, str]) -> str:
    """``text`` with every marked block's body replaced by ``rendered[name]``; a marked
    block of an unknown name is an error (a typo would otherwise never be refreshed)."""
    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in rendered:
            raise KeyError(f"unknown generated block {name!r} (known: {sorted(rendered)})")
        return m.group(1) + rendered[name] + m.group(4)
    return MARK.sub(sub, text)


def blocks_in(text: str) -> dict[str, str]:
    """The current body of every marked block of a page, by name."""
    return {m.group("name"): m.group("body") for m in MARK.finditer(text)}


def render(res: Any | None = None) -> dict[str, str]:
    res = run_default() if res is None else res
    return {name: f(res) for name, f in BLOCKS.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if a page's block differs from a fresh run")
    args = p.parse_args(argv)
    rendered = render()
    stale = []
    for page in PAGES:
        old = page.read_text(encoding="utf-8")
        new = rewrite(old, rendered)
        if new != old:
            stale.append(page.relative_to(ROOT))
            if not args.check:
                page.write_text(new, encoding="utf-8")
    for page in stale:
        print(f"{page}: {'stale' if args.check else 'rewritten'}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
