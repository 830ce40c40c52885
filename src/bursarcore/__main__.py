"""Command line: ``python -m bursarcore <command>`` (also installed as ``bursar``).

Each subcommand is a function ``add_<name>(subparsers)`` that registers its parser and sets
``func`` to a handler taking the parsed namespace and returning an exit status; adding a
command is one such function and one entry in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from ._version import __version__

__all__ = ["main", "build_parser", "COMMANDS"]


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="throughput of the token-bucket core on this machine",
                       description="Decisions per second: compiled single calls and batches, "
                                   "the reference model, and peer rate limiters if installed.")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, a few repetitions (well under 20 s)")
    p.add_argument("--no-peers", dest="peers", action="store_false",
                   help="skip token-bucket, limits and pyrate-limiter")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # for the tests
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    from . import bench  # imported here so other commands don't pay for numpy setup twice

    bench.main(quick=args.quick, tiny=args.tiny, peers=args.peers)
    return 0


def add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="one simulated hour of a 512-GPU pool under a storm",
                       description="A scripted, seeded demonstration on a pool of the local "
                                   "binding's pilots: an adversarial storm, a guaranteed "
                                   "interactive campaign and opportunistic backfill; then real "
                                   "processes launched and revoked through the binding.")
    p.add_argument("--seconds", type=int, default=3600, help="simulated seconds (default 3600)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--backend", choices=["compiled", "reference"], default=None,
                   help="engine backend (default: compiled when built)")
    p.add_argument("--journal", metavar="PATH", help="write the decision journal (JSON lines)")
    p.add_argument("--no-processes", dest="processes", action="store_false",
                   help="skip the real processes launched through the local binding at the end")
    p.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from .demo import format_demo, run_demo
    from .errors import InvalidArgument

    try:
        res = run_demo(seconds=args.seconds, seed=args.seed, backend=args.backend,
                       journal_path=args.journal, processes=args.processes)
    except InvalidArgument as e:   # checked before the demo starts: nothing was done
        field = {"seconds": "--seconds", "seed": "--seed", "journal": "--journal",
                 "backend": "--backend"}.get(e.field, e.field)
        print(f"bursar demo: error: {field}: {e.rule} (got {e.value!r})", file=sys.stderr)
        return 2
    print(format_demo(res))
    return 0


from .service.cli import add_serve  # noqa: E402  (loads no web framework)
from .sim.cli import add_experiments, add_simulate  # noqa: E402

COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_bench, add_demo,
                                                                add_simulate, add_experiments,
                                                                add_serve]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bursar", description="bursarcore command line.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
