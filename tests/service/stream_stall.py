"""A stream client that sends and never reads, for the back-pressure tests of the decision
stream: the frames go out from a thread until the server stops reading the connection
(its received counter in ``/metrics`` stays put), with a bounded wait."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx


def metric(url: str, token: str, name: str) -> float:
    """One unlabelled series of the service's ``/metrics``."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"},
                     timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


@contextmanager
def stalled(ws: Any, frame: str, per_frame: int, url: str, token: str,
            cap: int = 3_000_000) -> Iterator[tuple[threading.Thread, float, list[int]]]:
    """Send `frame` (`per_frame` messages) on the open connection `ws` from a thread, up to
    `cap` messages, until the server has stopped reading it (60 s at most, else the test
    fails); yields the thread, the messages the server received and [messages sent]. On
    exit the sender stops and the connection is shut down and closed."""
    sent = [0]
    stop = threading.Event()

    def flood() -> None:
        try:
            while not stop.is_set() and sent[0] < cap:
                ws.send(frame)
                sent[0] += per_frame
        except Exception:  # noqa: BLE001 - the socket is shut down at the end
            pass

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        last, end = -1.0, time.monotonic() + 60
        while time.monotonic() < end:
            got = metric(url, token, "bursar_stream_received")
            if got == last and got > 0:
                break
            last = got
            time.sleep(0.5)
        else:
            raise AssertionError("the server kept reading a client that does not read")
        yield t, got, sent
    finally:
        stop.set()
        try:
            ws.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        ws.close()
        t.join(10)
