"""``bursar serve``: the broker as an HTTP service (uvicorn + FastAPI).

``add_serve(subparsers)`` registers the command in the style of ``bursar bench``;
``python -m bursarcore.service`` runs the same command on its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
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


class _Given(argparse.Action):
    """``store``, remembering that the flag was given: a flag given on the command line
    overrides the configuration file's ``[server]`` key, a default does not."""

    def __call__(self, parser: Any, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(ns, self.dest, values)
        # a new set each time: the parser's default is shared by every parse
        ns.given = {*(getattr(ns, "given", None) or ()), self.dest}


class _GivenTrue(_Given):
    def __init__(self, option_strings: Any, dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=False, **kw)

    def __call__(self, parser: Any, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        super().__call__(parser, ns, True, option_string)


#: the flags a configuration file's [server] table may also set (ServerConfig's fields)
SERVER_FLAGS = ("host", "port", "journal", "tokens", "synchronous", "rate", "burst",
                "tenant_rate", "tenant_burst",
                "auth_fail_rate", "max_longpoll", "max_body", "keep_alive", "request_timeout",
                "max_connections", "limit_concurrency", "commit_timeout", "tick", "backend",
                "log_level", "log_format", "access_log")


def _arguments(p: argparse.ArgumentParser) -> None:
    def arg(*names: str, **kw: Any) -> None:
        # every flag records that it was given (see _Given)
        kw["action"] = _GivenTrue if kw.pop("action", None) == "store_true" else _Given
        p.add_argument(*names, **kw)

    p.set_defaults(given=frozenset())
    arg("--host", default="127.0.0.1",
        help="address to bind (default 127.0.0.1, loopback only; 0.0.0.0 or :: "
             "for every interface: put TLS in front, docs/service.md)")
    arg("--port", type=_port, default=8000,
        help="port (default 8000; 0 picks a free one, see --ready-file)")
    arg("--config", metavar="PATH",
        help="configuration file, TOML (.toml) or JSON: pool, classes, campaigns, "
             "[server], [metrics] (docs/config.md); flags given override [server]")
    arg("--check-config", metavar="PATH",
        help="validate PATH (as --config) and exit: 0 and a one-line summary, or "
             "2 and one line per mistake")
    arg("--demo", action="store_true",
        help="the SPEC §10 scenario (512 GPUs, five campaigns) with fresh tokens "
             "for its campaigns written to --credentials")
    arg("--journal", metavar="PATH", default=None,
        help="SQLite journal, replayed on start (default bursar.db, or "
             "bursar-demo.db with --demo); a missing or empty one is refused "
             "unless --init")
    arg("--init", action="store_true",
        help="make a new journal at --journal (refused where a journal with "
             "records is); --demo makes its own when there is none")
    arg("--memory", action="store_true",
        help="keep the journal in memory: nothing survives a restart (tests)")
    arg("--synchronous", choices=["NORMAL", "FULL", "EXTRA"], default="FULL",
        help="SQLite synchronous level (default FULL: a commit survives power loss)")
    arg("--tokens", metavar="PATH",
        help="hashed token store (default: <journal>.tokens.json)")
    arg("--mint", metavar="CAMPAIGN",
        help="mint a token for CAMPAIGN, print it once, and exit")
    arg("--mint-operator", action="store_true",
        help="mint an operator token, print it once, and exit")
    arg("--credentials", metavar="PATH", default="bursar-demo-credentials.json",
        help="with --demo: where the plaintext demo tokens go (mode 0600)")
    arg("--rate", type=float, default=100.0,
        help="requests per second per token (default 100; 0: no limit)")
    arg("--burst", type=float, default=200.0,
        help="request burst per token (default 200)")
    arg("--tenant-rate", type=float, default=1000.0,
        help="requests per second per tenant, a top-level node with its subtree's tokens "
             "(default 1000; 0: no limit)")
    arg("--tenant-burst", type=float, default=2000.0,
        help="request burst per tenant (default 2000)")
    arg("--auth-fail-rate", type=float, default=10.0,
        help="failed authentications per second per client address (10; 0: no limit)")
    arg("--max-longpoll", type=float, default=60.0,
        help="longest wait of an events long-poll, seconds (60)")
    arg("--max-body", type=int, default=1 << 20,
        help="largest request body in bytes (default 1 MiB)")
    arg("--max-batch-items", type=_positive, default=100_000, metavar="N",
        help="items at most in one columnar batch, /v1/batch/... (100000)")
    arg("--max-batch-body", type=_positive, default=64 << 20, metavar="BYTES",
        help="largest body of a columnar batch, /v1/batch/..., in bytes (64 MiB)")
    arg("--stream-window", type=_window, default=4096, metavar="N",
        help="decision stream: messages at most read and not yet answered on one "
             "connection; the server reads no further frame until answers make room "
             "(4096)")
    arg("--stream-frame", type=_window, default=1000, metavar="N",
        help="decision stream: messages at most in one frame, the client's and the "
             "server's answer frames alike; at most --stream-window (1000)")
    arg("--keep-alive", type=_seconds, default=5.0, metavar="SECONDS",
        help="close a keep-alive connection idle this long after a response (5)")
    arg("--request-timeout", type=_seconds, default=10.0, metavar="SECONDS",
        help="time to send a whole request (headers and body) from its first "
             "byte, or from connecting; slower ones are closed (10; 0: no limit)")
    arg("--max-connections", type=_count, default=2048, metavar="N",
        help="open connections at most; more are answered 503 and closed "
             "(2048; 0: no limit)")
    arg("--limit-concurrency", type=_count, default=1024, metavar="N",
        help="requests in progress at most; more are answered 503 (1024; 0: no "
             "limit)")
    arg("--commit-timeout", type=_seconds, default=30.0, metavar="SECONDS",
        help="longest wait for the journal to commit a request's records before "
             "it answers 503 (30; 0: no limit)")
    arg("--tick", type=float, default=0.5,
        help="seconds between clock ticks that fire expiries and events (0.5)")
    arg("--backend", choices=["compiled", "reference"], default=None)
    arg("--ready-file", metavar="PATH",
        help="write the base URL here once the server accepts connections")
    arg("--log-level", default="info",
        choices=["critical", "error", "warning", "info", "debug"])
    arg("--log-format", choices=["text", "json"], default="text",
        help="text lines, or one JSON object a line for bursar's and uvicorn's "
             "own (error and access) lines alike (docs/operations.md)")
    arg("--access-log", action="store_true",
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
_positive = _bounded(int, 1, 1 << 40, "a whole number")
_window = _bounded(int, 1, 1 << 20, "a whole number")


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
        import pydantic  # noqa: F401
    except ImportError:
        raise SystemExit("bursar serve needs the service extra: pip install 'bursarcore[service]'")
    if args.check_config:
        return _check_config(args.check_config)
    from ..errors import InvalidArgument, JournalCorrupt, JournalUnavailable
    from .app import ServiceSettings, create_app
    from .auth import OPERATOR, TokenStore
    from .config import MetricsConfig
    from .core import DEMO_CONFIG, BrokerService
    from .logs import log_config

    file_cfg = load_config(args.config) if args.config else None
    args = _with_file(args, file_cfg)
    wrong = _flag_problems(args)
    if wrong:
        for line in wrong:
            print(f"bursar serve: {line}", file=sys.stderr)
        return 2
    if args.stream_frame > args.stream_window:
        print(f"bursar serve: --stream-frame: must be at most --stream-window "
              f"({args.stream_window}) (got {args.stream_frame})", file=sys.stderr)
        return 2
    journal, tokens_path = _paths(args)
    if args.init and journal is None:
        return _refuse("--init makes a new SQLite journal: it does not go with --memory")
    # a journal is made only when asked: --init, or --demo's own where there is none
    create = args.init or (args.demo and journal is not None and not os.path.exists(journal))

    config: dict[str, Any] = {}
    if args.demo:
        config = json.loads(json.dumps(DEMO_CONFIG))
    if file_cfg is not None:
        mine = file_cfg.broker_config()
        camps = {**config.get("campaigns", {}), **(mine.get("campaigns") or {})}
        config.update(mine)
        if camps:
            config["campaigns"] = camps

    if args.mint_operator or args.mint:
        if tokens_path is None:
            raise SystemExit("bursar serve: --mint needs a token store (--tokens or --journal)")
        return _mint(args, journal, tokens_path, config)

    logging_config = log_config(args.log_level, args.log_format)
    logging.config.dictConfig(logging_config)
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
    metrics = file_cfg.metrics if file_cfg is not None else MetricsConfig()
    settings = ServiceSettings(rate=args.rate, burst=args.burst,
                               tenant_rate=args.tenant_rate, tenant_burst=args.tenant_burst,
                               max_body=args.max_body,
                               max_batch_items=args.max_batch_items,
                               max_batch_body=args.max_batch_body,
                               auth_fail_rate=args.auth_fail_rate,
                               auth_fail_burst=max(1.0, 2 * args.auth_fail_rate),
                               max_longpoll=args.max_longpoll,
                               commit_timeout=args.commit_timeout or None,
                               metrics_campaigns=metrics.campaigns,
                               metrics_require_token=metrics.require_token,
                               stream_window=args.stream_window,
                               stream_frame=args.stream_frame)
    app = create_app(service, store, settings)
    return _run(app, args.host, args.port, args.ready_file, logging_config, args.access_log,
                keep_alive=args.keep_alive, request_timeout=args.request_timeout,
                max_connections=args.max_connections,
                limit_concurrency=args.limit_concurrency, ws_max_size=args.max_body)


def _with_file(args: argparse.Namespace, file_cfg: Any) -> argparse.Namespace:
    """``args`` with the file's ``[server]`` keys for the flags not given on the command
    line (a flag given wins; a key the file leaves out keeps the flag's default)."""
    out = argparse.Namespace(**vars(args))
    if file_cfg is None:
        return out
    server = file_cfg.server
    for name in server.model_fields_set:
        if name in SERVER_FLAGS and name not in args.given:
            setattr(out, name, getattr(server, name))
    return out


def _flag_problems(args: argparse.Namespace) -> list[str]:
    """The server's settings, flags and file alike, against the ranges of ``[server]``
    (docs/config.md): a flag outside them is refused as the file's key would be."""
    from pydantic import ValidationError

    from .config import ServerConfig, problems

    try:
        ServerConfig.model_validate({k: getattr(args, k) for k in SERVER_FLAGS})
    except ValidationError as e:
        out = []
        for line in problems(e):
            key, _, rule = line.partition(": ")
            out.append(f"--{key.replace('_', '-')}: {rule}")
        return out
    return []


def _check_config(path: str) -> int:
    """``--check-config``: 0 and a summary line on stdout, or 2 and a line per mistake."""
    from .config import ConfigError, read_config

    try:
        cfg = read_config(path)
    except ConfigError as e:
        for line in e.problems:
            print(f"bursar serve: {path}: {' '.join(line.split())}", file=sys.stderr)
        return 2
    print(f"bursar serve: {path}: valid: {cfg.summary()}")
    return 0


def load_config(path: str) -> Any:
    """The ``--config`` file as a :class:`~bursarcore.service.config.ServeConfig`, read and
    checked in full (the library's own rules, by building a broker from it on a scratch
    clock); any mistake exits 2, one line per mistake naming the file and the field."""
    from .config import ConfigError, read_config

    try:
        return read_config(path)
    except ConfigError as e:
        for line in e.problems:
            print(f"bursar serve: --config {path}: {' '.join(line.split())}", file=sys.stderr)
        raise SystemExit(2) from None


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


def _run(app: Any, host: str, port: int, ready_file: str | None,
         logging_config: dict[str, Any], access_log: bool, *, keep_alive: float = 5.0, request_timeout: float = 10.0,
         max_connections: int = 2048, limit_concurrency: int = 1024,
         ws_max_size: int = 1 << 20) -> int:
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

    config = uvicorn.Config(app, log_config=logging_config, access_log=access_log,
                            lifespan="on",
                            timeout_graceful_shutdown=5, server_header=False,
                            http=bounded_protocol(request_timeout, max_connections),
                            timeout_keep_alive=keep_alive,  # type: ignore[arg-type]
                            limit_concurrency=limit_concurrency or None,
                            # headers larger than this are a 400, not buffered without end
                            h11_max_incomplete_event_size=64 * 1024,
                            # the decision stream: a frame is at most a body's size, few
                            # frames wait unread (back pressure reaches the client's TCP
                            # window), and no compression (CPU per message, for messages
                            # of a hundred bytes)
                            ws="auto", ws_max_size=ws_max_size, ws_max_queue=4,
                            ws_per_message_deflate=False)
    server = _Server(config)
    _tune_gc()
    server.run(sockets=[sock])
    return 0


def _tune_gc() -> None:
    """The cyclic garbage collector for a server: what exists now (the broker replayed
    from its journal, the app) lives as long as the process, so collections stop
    scanning it (``gc.freeze``); and a collection runs after 50,000 new container
    objects rather than 700, since every request and every message of a decision stream
    makes a few short-lived ones (each collection scans what is still alive, and the
    answers waiting for a commit are)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bursar serve", description="bursarcore HTTP service")
    _arguments(parser)
    args = parser.parse_args(argv)
    return serve(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
