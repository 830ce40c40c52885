"""``bursar serve``: the broker as an HTTP service (uvicorn + FastAPI).

``add_serve(subparsers)`` registers the command in the style of ``bursar bench``;
``python -m bursarcore.service`` runs the same command on its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from typing import Any, NoReturn, Sequence

__all__ = ["add_serve", "serve", "main", "load_config"]

log = logging.getLogger("bursarcore.service")


def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="run the broker as an HTTP service (needs the 'service' extra)",
        description="Serve one broker over HTTP: supply, quotes, intents, leases, events, "
                    "consumption and the journal, with campaign-scoped bearer tokens. The "
                    "SQLite journal is replayed on start, so a restart keeps every lease "
                    "and balance. OpenAPI at /openapi.json, docs at /docs.")
    _arguments(p)
    p.set_defaults(func=serve)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, loopback only; 0.0.0.0 or :: "
                        "for every interface: put TLS in front, docs/service.md)")
    p.add_argument("--port", type=_port, default=8000,
                   help="port (default 8000; 0 picks a free one, see --ready-file)")
    p.add_argument("--config", metavar="PATH",
                   help="broker configuration, JSON: pool, classes, campaigns (docs/service.md)")
    p.add_argument("--demo", action="store_true",
                   help="the SPEC §10 scenario (512 GPUs, five campaigns) with fresh tokens "
                        "for its campaigns written to --credentials")
    p.add_argument("--journal", metavar="PATH", default=None,
                   help="SQLite journal, replayed on start (default bursar.db, or "
                        "bursar-demo.db with --demo); a missing or empty one is refused "
                        "unless --init")
    p.add_argument("--init", action="store_true",
                   help="make a new journal at --journal (refused where a journal with "
                        "records is); --demo makes its own when there is none")
    p.add_argument("--memory", action="store_true",
                   help="keep the journal in memory: nothing survives a restart (tests)")
    p.add_argument("--synchronous", choices=["NORMAL", "FULL", "EXTRA"], default="FULL",
                   help="SQLite synchronous level (default FULL: a commit survives power loss)")
    p.add_argument("--tokens", metavar="PATH",
                   help="hashed token store (default: <journal>.tokens.json)")
    p.add_argument("--mint", metavar="CAMPAIGN",
                   help="mint a token for CAMPAIGN, print it once, and exit")
    p.add_argument("--mint-operator", action="store_true",
                   help="mint an operator token, print it once, and exit")
    p.add_argument("--credentials", metavar="PATH", default="bursar-demo-credentials.json",
                   help="with --demo: where the plaintext demo tokens go (mode 0600)")
    p.add_argument("--rate", type=float, default=100.0,
                   help="requests per second per token (default 100; 0: no limit)")
    p.add_argument("--burst", type=float, default=200.0,
                   help="request burst per token (default 200)")
    p.add_argument("--auth-fail-rate", type=float, default=10.0,
                   help="failed authentications per second per client address (10; 0: no limit)")
    p.add_argument("--max-longpoll", type=float, default=60.0,
                   help="longest wait of an events long-poll, seconds (60)")
    p.add_argument("--max-body", type=int, default=1 << 20,
                   help="largest request body in bytes (default 1 MiB)")
    p.add_argument("--keep-alive", type=_seconds, default=5.0, metavar="SECONDS",
                   help="close a keep-alive connection idle this long after a response (5)")
    p.add_argument("--request-timeout", type=_seconds, default=10.0, metavar="SECONDS",
                   help="time to send a whole request (headers and body) from its first "
                        "byte, or from connecting; slower ones are closed (10; 0: no limit)")
    p.add_argument("--max-connections", type=_count, default=2048, metavar="N",
                   help="open connections at most; more are answered 503 and closed "
                        "(2048; 0: no limit)")
    p.add_argument("--limit-concurrency", type=_count, default=1024, metavar="N",
                   help="requests in progress at most; more are answered 503 (1024; 0: no "
                        "limit)")
    p.add_argument("--commit-timeout", type=_seconds, default=30.0, metavar="SECONDS",
                   help="longest wait for the journal to commit a request's records before "
                        "it answers 503 (30; 0: no limit)")
    p.add_argument("--tick", type=float, default=0.5,
                   help="seconds between clock ticks that fire expiries and events (0.5)")
    p.add_argument("--backend", choices=["compiled", "reference"], default=None)
    p.add_argument("--ready-file", metavar="PATH",
                   help="write the base URL here once the server accepts connections")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true",
                   help="log every request line (never headers, so never tokens)")


def _bounded(kind: type, lo: float, hi: float, what: str) -> Any:
    """An argparse ``type=``: ``kind(text)`` within ``[lo, hi]``, or a usage error
    saying which ``what`` was wanted."""
    def convert(text: str) -> Any:
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} (got {text!r})") from None
        if not lo <= x <= hi:
            top = "" if hi == float("inf") else f", at most {hi:g}"
            raise argparse.ArgumentTypeError(f"must be {what} >= {lo:g}{top} (got {text})")
        return x
    return convert


_port = _bounded(int, 0, 65535, "a port number")
_seconds = _bounded(float, 0, 86400, "a number of seconds")
_count = _bounded(int, 0, float("inf"), "a whole number")


def _paths(args: argparse.Namespace) -> tuple[str | None, str | None]:
    journal = None if args.memory else (args.journal or ("bursar-demo.db" if args.demo
                                                         else "bursar.db"))
    tokens = args.tokens
    if tokens is None and journal is not None:
        tokens = journal + ".tokens.json"
    return journal, tokens


def serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401
        import fastapi  # noqa: F401
    except ImportError:
        raise SystemExit("bursar serve needs the service extra: pip install 'bursarcore[service]'")
    from ..errors import InvalidArgument, JournalCorrupt, JournalUnavailable
    from .app import ServiceSettings, create_app
    from .auth import OPERATOR, TokenStore
    from .core import DEMO_CONFIG, BrokerService

    journal, tokens_path = _paths(args)
    if args.init and journal is None:
        return _refuse("--init makes a new SQLite journal: it does not go with --memory")
    # a journal is made only when asked: --init, or --demo's own where there is none
    create = args.init or (args.demo and journal is not None and not os.path.exists(journal))

    config: dict[str, Any] = {}
    if args.demo:
        config = json.loads(json.dumps(DEMO_CONFIG))
    if args.config:
        mine = load_config(args.config)
        camps = {**config.get("campaigns", {}), **(mine.get("campaigns") or {})}
        config.update(mine)
        if camps:
            config["campaigns"] = camps

    if args.mint_operator or args.mint:
        if tokens_path is None:
            raise SystemExit("bursar serve: --mint needs a token store (--tokens or --journal)")
        return _mint(args, journal, tokens_path, config)

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the journal first: a missing, damaged or locked one stops the start before anything
    # else (the token store included) is read or written
    try:
        service = BrokerService.open(config, journal, create=create,
                                     synchronous=args.synchronous, backend=args.backend,
                                     tick=args.tick)
    except (JournalUnavailable, JournalCorrupt) as e:
        return _refuse(_journal_problem(e, journal, args.init))
    except InvalidArgument as e:       # a --config campaign the journal's pool refuses
        return _refuse(f"--config {args.config}: {e}")
    try:
        store = TokenStore(tokens_path)
    except BaseException:
        service.journal.close()
        raise
    if args.demo:
        _demo_credentials(store, service.broker.campaigns, args.credentials)
    if not any(t["role"] == OPERATOR for t in store.listing()):
        log.warning("no operator token: mint one with 'bursar serve --mint-operator'")
    settings = ServiceSettings(rate=args.rate, burst=args.burst, max_body=args.max_body,
                               auth_fail_rate=args.auth_fail_rate,
                               auth_fail_burst=max(1.0, 2 * args.auth_fail_rate),
                               max_longpoll=args.max_longpoll,
                               commit_timeout=args.commit_timeout or None)
    app = create_app(service, store, settings)
    return _run(app, args.host, args.port, args.ready_file, args.log_level, args.access_log,
                keep_alive=args.keep_alive, request_timeout=args.request_timeout,
                max_connections=args.max_connections,
                limit_concurrency=args.limit_concurrency)


def load_config(path: str) -> dict[str, Any]:
    """The ``--config`` file, read and checked by building a broker from it (on a scratch
    clock, no journal); any mistake exits 2 with one line naming the file and the field."""
    from ..clock import ManualClock
    from ..errors import InvalidArgument
    from .core import build_broker, envelope_from_json

    def refuse(problem: str) -> NoReturn:
        print(f"bursar serve: --config {path}: {' '.join(problem.split())}", file=sys.stderr)
        raise SystemExit(2)

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        refuse(f"cannot read it: {getattr(e, 'strerror', None) or e}")
    try:
        config = json.loads(text)
    except ValueError as e:
        refuse(f"not valid JSON: {e}")
    if not isinstance(config, dict):
        refuse(f"must be a JSON object (got {type(config).__name__})")
    where = "config"
    try:
        # without a pool the campaigns join a journal's pool (checked when they register):
        # here only their envelopes can be checked
        broker = build_broker(config, ManualClock(0.0)) if "pool" in config else None
        for name, env in (config.get("campaigns") or {}).items():
            where = f"campaigns.{name}"
            envelope = envelope_from_json(env, where)
            if broker is not None:
                broker.register(name, envelope)
    except InvalidArgument as e:
        field = e.field if e.field.startswith(("config", where)) else f"{where}.{e.field}"
        got = "" if e.value is None else f" (got {repr(e.value)[:80]})"
        refuse(f"{field}: {e.rule}{got}")
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        refuse(f"{where}: {type(e).__name__}: {e}")
    return config


def _refuse(message: str) -> int:
    """One line on stderr and exit status 2: the server does not start."""
    print(f"bursar serve: {message}", file=sys.stderr)
    return 2


def _journal_problem(e: Exception, journal: str | None, init: bool) -> str:
    from ..errors import JournalCorrupt

    if isinstance(e, JournalCorrupt):
        return f"journal {journal} is damaged at record {e.record}: {e.problem}"
    text = str(e)
    kind = getattr(e, "kind", "")
    if kind in ("missing", "empty") and not init:
        text += ": start with --init to make a new journal there"
    elif kind == "exists":
        text += ": start without --init to replay it"
    return text


def _mint(args: argparse.Namespace, journal: str | None, tokens_path: str,
          config: dict[str, Any]) -> int:
    """``--mint CAMPAIGN`` / ``--mint-operator``: a token printed once. A campaign token
    only for a campaign the journal registered or the configuration would register; the
    journal is opened (and locked) to read its campaigns, so minting beside a running
    server, whose token store would overwrite this one's, is refused."""
    from ..errors import JournalCorrupt, JournalUnavailable
    from ..journal import SQLiteJournal
    from .auth import CAMPAIGN, OPERATOR, TokenStore

    known = set(config.get("campaigns") or {})
    if journal is not None and os.path.exists(journal):
        try:
            j = SQLiteJournal(journal)
        except (JournalUnavailable, JournalCorrupt) as e:
            text = _journal_problem(e, journal, args.init)
            if getattr(e, "kind", "") == "locked":
                text += "; mint through the running server: POST /v1/campaigns/<c>/tokens"
            return _refuse(text)
        known.update(j.names)
        j.close()
    if args.mint and args.mint not in known:
        where = (f"journal {journal}" if journal is not None and os.path.exists(journal)
                 else "the journal (there is none yet)")
        return _refuse(f"--mint {args.mint}: no such campaign: it is not registered in "
                       f"{where} nor in --config/--demo")
    store = TokenStore(tokens_path)
    token = store.mint(OPERATOR) if args.mint_operator else store.mint(CAMPAIGN, args.mint)
    print(token)
    return 0


def _demo_credentials(store: Any, campaigns: list[str], path: str) -> None:
    """Fresh tokens for the demo campaigns and an operator, replacing earlier demo ones;
    the plaintext goes to ``path`` (0600) for examples/demo_client.py — demo only."""
    from .auth import CAMPAIGN, OPERATOR

    creds: dict[str, Any] = {"campaigns": {}}
    for c in campaigns:
        store.revoke_campaign(c)
        creds["campaigns"][c] = store.mint(CAMPAIGN, c)
    for t in store.listing():
        if t["role"] == OPERATOR:
            store.revoke(t["id"])
    creds["operator"] = store.mint(OPERATOR)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(creds, f, indent=1)
    log.info("demo tokens for %d campaigns written to %s", len(campaigns), path)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP
    # (without it every response waits ~40 ms for a delayed ACK)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _run(app: Any, host: str, port: int, ready_file: str | None, log_level: str,
         access_log: bool, *, keep_alive: float = 5.0, request_timeout: float = 10.0,
         max_connections: int = 2048, limit_concurrency: int = 1024) -> int:
    import uvicorn

    from .connections import bounded_protocol

    try:
        sock = _bind(host, port)
    except (OSError, OverflowError) as e:   # in use, not an address of this host, ...
        raise SystemExit(f"bursar serve: cannot listen on {host} port {port}: {e}") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                log.info("bursar serving on %s (OpenAPI at %s/openapi.json)", url, url)
                if ready_file:
                    tmp = ready_file + ".tmp"
                    with open(tmp, "w", encoding="utf-8") as f:
                        f.write(url + "\n")
                    os.replace(tmp, ready_file)

    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=5, server_header=False,
                            http=bounded_protocol(request_timeout, max_connections),
                            timeout_keep_alive=keep_alive,  # type: ignore[arg-type]
                            limit_concurrency=limit_concurrency or None,
                            # headers larger than this are a 400, not buffered without end
                            h11_max_incomplete_event_size=64 * 1024)
    server = _Server(config)
    server.run(sockets=[sock])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bursar serve", description="bursarcore HTTP service")
    _arguments(parser)
    args = parser.parse_args(argv)
    return serve(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
