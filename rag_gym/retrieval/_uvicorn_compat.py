"""A request-head deadline for uvicorn's HTTP protocols (written and tested against uvicorn 0.54).

uvicorn times out an idle keep-alive connection, but not a client that sends part of a request
head and stalls: any byte received cancels the keep-alive timer, and nothing re-arms it until a
response is sent. A few hundred such connections hold every file descriptor the process may
open, and good requests are then refused (slowloris). :func:`guarded_protocol` returns a
subclass of uvicorn's protocol class that closes a connection whose request head is not
complete ``head_timeout`` seconds after the connection opened or after its previous response,
or whose head is longer than ``max_head_bytes``, however it arrives (in one write or many; answered
431 before uvicorn's parser sees it), and, when
the open connections reach ``max_open``, closes the one that has waited longest for a head or
for the rest of a body. A stalled body's deadline is the endpoint's business (it reads the body
under its own timer).

This is the one place that relies on uvicorn internals: the protocol methods
``connection_made``, ``data_received``, ``on_response_complete``, ``connection_lost`` and the
attributes ``loop``, ``transport``, ``connections`` and ``cycle`` (a new ``RequestResponseCycle``
is set once a request head has been parsed; its ``more_body`` is true until the body is in,
``response_complete`` true once the response is sent, and ``disconnected`` true once the client
has gone, which :func:`disconnect_probe` reads through the cycle's ``receive``). :func:`guarded_protocol` checks that they exist and otherwise
returns the base class unchanged with a warning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

logger = logging.getLogger("rag_gym.retrieval.server")

_HOOKS = ("connection_made", "data_received", "on_response_complete", "connection_lost")
_LINGER_S = 2.0  # how long a refused connection's further bytes are read and dropped


def base_protocol(http: str = "auto") -> type:
    """uvicorn's protocol class for ``http`` (``"auto"``: httptools when installed, else h11)."""
    if http not in ("auto", "httptools", "h11"):
        raise ValueError(f"expected http 'auto', 'httptools' or 'h11', got {http!r}")
    if http in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

            return HttpToolsProtocol
        except ImportError:
            if http == "httptools":
                raise ImportError(
                    "http='httptools' needs httptools: pip install 'rag-gym[server]'"
                ) from None
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


def guarded_protocol(
    base: type, head_timeout: float, max_head_bytes: int, max_open: int | None = None
) -> type:
    """``base`` with a deadline and a size cap on each request head (see the module doc).

    With ``max_open``, a new connection that brings the open ones to ``max_open`` closes the
    connection that has waited longest for a request head (a stalled or idle one), so the
    process never runs out of file descriptors while stalled clients hold them: at that point
    the event loop could accept nothing, and libuv resets what it cannot accept.
    """
    if not all(callable(getattr(base, name, None)) for name in _HOOKS):
        logger.warning(
            "uvicorn %s lacks the protocol hooks rag-gym's head timeout uses; stalled "
            "connections are then held until the client goes away",
            getattr(__import__("uvicorn"), "__version__", "?"),
        )
        return base

    waiting: dict = {}  # connections waiting for a request head, the longest-waiting first

    class Guarded(base):  # type: ignore[misc, valid-type]
        _head_timer = None
        _cycle_at_arm = None
        _head_bytes = 0
        _head_tail = b""
        _lingering = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()
            if max_open is not None and len(self.connections) >= max_open:
                oldest = next((c for c in waiting if c is not self), None)
                if oldest is not None:
                    oldest._evict()

        def data_received(self, data: bytes) -> None:
            if self._lingering is not None:
                return  # refused: what the client still sends is read and dropped
            head = self._head_timer is not None
            if head:
                # the head's size however it arrives: up to its first blank line when that is
                # in this data (the rest may be a body), else all of it; an over-long head is
                # refused before the parser sees it, so no request of it ever starts
                seen = self._head_bytes
                self._head_bytes += len(data)
                if _head_size(self._head_tail, data, seen) > max_head_bytes:
                    self._disarm()
                    self._refuse(b"431 Request Header Fields Too Large", linger=True)
                    return
                if self._head_tail or data.strip(b"\r\n"):
                    self._head_tail = (self._head_tail + data.lstrip(b"\r\n"))[-2:].rjust(2)
            super().data_received(data)
            cycle = self.cycle
            if head and cycle is not self._cycle_at_arm:
                self._disarm()  # a new request head was parsed
                if getattr(cycle, "more_body", False):
                    waiting[self] = None  # its body is still coming: evictable too
            elif head and self._head_bytes > max_head_bytes:
                self._disarm()
                self._refuse(b"431 Request Header Fields Too Large", linger=True)
            elif not head and self in waiting and not getattr(cycle, "more_body", False):
                del waiting[self]  # the body is complete

        def _evict(self) -> None:
            """Make room: close this connection, which waits for a request head or body, or
            lingers after a refusal."""
            if self._lingering is not None:
                waiting.pop(self, None)
                self._lingering.cancel()
                self.transport.close()
            elif self._head_timer is not None:
                self._disarm()
                self._close_waiting()
            else:
                waiting.pop(self, None)
                if not self.transport.is_closing():
                    self.transport.close()  # the endpoint sees a disconnect

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            if self._lingering is not None:
                self._lingering.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._cycle_at_arm = self.cycle
            self._head_bytes = 0
            self._head_tail = b""
            self._head_timer = self.loop.call_later(head_timeout, self._expire)
            waiting[self] = None

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            waiting.pop(self, None)

        def _expire(self) -> None:
            self._head_timer = None
            waiting.pop(self, None)
            self._close_waiting()

        def _close_waiting(self) -> None:
            cycle = self.cycle
            # still no new request head, and no request of this connection in progress
            if cycle is self._cycle_at_arm and (cycle is None or cycle.response_complete):
                if self._head_bytes:
                    self._refuse(b"408 Request Timeout")
                elif self.transport.get_write_buffer_size():
                    _reset(self.transport)  # a reply its client never read: free it now
                elif not self.transport.is_closing():
                    self.transport.close()  # idle: close quietly, as keep-alive expiry does

        def _refuse(self, status: bytes, linger: bool = False) -> None:
            """Answer ``status`` and close. With ``linger`` (a client still sending), a
            lingering close: the reply, then this side's end (a FIN once the reply is out), then
            whatever the client still sends is read and dropped until it closes its side or
            ``_LINGER_S`` pass (or the connection is evicted to make room). A plain close with
            unread bytes in the socket makes the kernel reset the connection, and a reset can
            discard the reply before the client has read it."""
            transport = self.transport
            if transport.is_closing() or self._lingering is not None:
                return
            transport.write(
                b"HTTP/1.1 " + status + b"\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
            )
            if not (linger and transport.can_write_eof()):
                transport.close()
                return
            transport.write_eof()  # the client's end then closes the transport (eof_received)
            self._lingering = self.loop.call_later(_LINGER_S, transport.close)
            waiting[self] = None

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def _head_size(tail: bytes, data: bytes, seen: int) -> int:
    """The bytes of a request head so far, ``seen`` of them before ``data`` (``tail``: the last
    two of those after the first byte of the request line, or none yet): up to the head's end (a
    line feed, an optional carriage return and a line feed, the earliest end any parser takes)
    when ``data`` holds it, else all of them. Blank lines before a request line (which parsers
    skip) never count as its end."""
    if not tail:  # the request line has not begun: skip the blank lines before it
        skip = len(data) - len(data.lstrip(b"\r\n"))
        seen, data = seen + skip, data[skip:]
    buf = tail + data
    ends = [
        i + len(m)
        for m in (b"\n\n", b"\n\r\n")
        if (i := buf.find(m, max(0, len(tail) - len(m) + 1))) >= 0
    ]
    if not ends:
        return seen + len(data)
    return seen - len(tail) + min(ends)


def drop_connection(receive) -> None:
    """Close the connection of the request whose ``receive`` this is at once, discarding what
    is still buffered for it (``transport.abort()``; ``close()`` would wait for a client that
    reads nothing to read it all) with a reset. Nothing under another server."""
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    if transport is not None and hasattr(transport, "abort"):
        _reset(transport)


def _reset(transport) -> None:
    import socket
    import struct

    sock = transport.get_extra_info("socket")
    with contextlib.suppress(AttributeError, OSError):  # a reset, not a FIN queued behind the
        # unread bytes: the kernel frees its buffer too, and the client learns at once
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def disconnect_probe(receive) -> Callable[[], bool] | None:
    """A check, cheap enough to call before every batch, of whether a request's client has
    gone: uvicorn's ``receive`` is a method of its ``RequestResponseCycle``, whose
    ``disconnected`` turns true once the event loop has read the connection's end, and its
    ``transport``'s socket is polled for a hang-up the loop has not read yet (a client that
    closes as soon as it has sent its request is seen gone before its work is handed to a
    worker). The ASGI way, awaiting ``http.disconnect`` from ``receive``, needs a task per
    request and sees only what the loop has read. ``None`` under another server (or a uvicorn
    without that attribute): the request is then served to the end."""
    cycle = getattr(receive, "__self__", None)
    if not isinstance(getattr(cycle, "disconnected", None), bool):
        return None
    hung_up = _hang_up_check(getattr(cycle, "transport", None))
    if hung_up is None:
        return lambda: cycle.disconnected
    return lambda: cycle.disconnected or hung_up()


def _hang_up_check(transport) -> Callable[[], bool] | None:
    """Whether the peer of ``transport``'s socket has closed or shut down its side (Linux's
    ``POLLRDHUP``), by a ``poll`` that does not wait; ``None`` where it cannot be asked."""
    import select

    rdhup = getattr(select, "POLLRDHUP", None)
    if rdhup is None or not hasattr(select, "poll"):
        return None  # not Linux: the loop's own reading of the end has to do
    try:
        fd = transport.get_extra_info("socket").fileno()
    except (AttributeError, OSError, ValueError):
        return None
    if fd < 0:
        return None
    flags = rdhup | select.POLLHUP | select.POLLERR | select.POLLNVAL

    def hung_up() -> bool:
        poller = select.poll()  # one per call: the loop and worker threads may ask at once
        try:
            poller.register(fd, flags)
            return any(events & flags for _, events in poller.poll(0))
        except (OSError, ValueError):  # the descriptor is gone: so is the connection
            return True

    return hung_up
