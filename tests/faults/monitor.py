"""Watching the consumer's Redis traffic with MONITOR, to aim kills and classify them.

The consumer has no test hooks. To kill it *inside* a Redis transaction or a score
publication we watch its commands on the dedicated redis-server. Every shared
write of the consumer checks its lease first: a graph transaction as ``WATCH P
lock`` + ``GET P lock`` before its ``MULTI``; a publication first pipelines
plain ZADD/ZREM chunks into its private back buffer ``P scores:{alg}:next:...``
and then swaps it in either the same way or with a script (``GET P lock`` as the
script's first call; MONITOR shows it from the client ``lua``). MONITOR echoes
every command when Redis reads it, the queued commands of a ``MULTI`` included,
stamped with Redis's clock. So from the MONITOR stream we can

* react to the n-th lease check (or back-buffer write, see :meth:`RedisMonitor.arm`)
  of a consumer process: freeze Redis (SIGSTOP) at
  once, give the consumer a random 0-20 ms to write more of its transaction or
  pipeline into the socket (or not), SIGKILL it, thaw Redis;
* afterwards tell what each kill interrupted (:meth:`RedisMonitor.classify`): the
  commands that the dead process had sent but Redis ran only after the kill
  moment are "in flight". If they include an ``EXEC`` or a script, that write was
  executed after its client died (the case exactly-once must survive); if they
  stop before ``EXEC``, the transaction was aborted. Graph transactions write
  ``P offsets``; publications write ``P scores:*`` / ``P meta:*``.

This is written against the documented fencing (docs/redis-keys.md), not against
the consumer's internals, so it keeps working while those change.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

_LINE = re.compile(rb'^\+(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$')
_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')
MAX_ARGS = 6  # enough to see the keys of HSET/ZADD and of the consumer's scripts' ARGV
LUA = "lua"
# Commands that tell what a unit of work was; reads (our probes' too) are ignored.
_WRITES = {b"EXEC", b"EVAL", b"EVALSHA", b"HSET", b"SET", b"PEXPIRE", b"DEL", b"RENAME",
           b"ZADD", b"ZREM", b"SADD", b"SREM", b"UNLINK"}
_FRAMING = _WRITES | {b"WATCH", b"MULTI"}


@dataclass(frozen=True)
class Command:
    """One command as MONITOR reports it (only the first arguments are kept)."""

    at: float  # Redis's wall clock, seconds
    client: str  # "ip:port" of the connection, or "lua" inside a script
    args: tuple[bytes, ...]

    @property
    def name(self) -> bytes:
        return self.args[0].upper() if self.args else b""


class RedisMonitor:
    """A background MONITOR connection recording the commands about one key prefix."""

    def __init__(self, host: str, port: int, prefix: str) -> None:
        self.lock_key = f"{prefix}lock".encode()
        self.prefix = prefix.encode()
        self.commands: list[Command] = []
        self._trigger: tuple[float, int, bool, Callable[[], None], threading.Event] | None = None
        self._checks: list[tuple[float, str]] = []  # aimable steps: (time, kind, see arm())
        self._heartbeats: set[str] = set()  # connections inside a status heartbeat
        self._cond = threading.Condition()
        self._sock = socket.create_connection((host, port), timeout=10)
        self._sock.sendall(b"MONITOR\r\n")
        self._buffer = b""
        first = self._read_line()
        if first != b"+OK":
            raise RuntimeError(f"MONITOR refused: {first!r}")
        self._sock.settimeout(None)
        self._thread = threading.Thread(target=self._run, name="redis-monitor", daemon=True)
        self._thread.start()

    def _read_line(self) -> bytes | None:
        while b"\r\n" not in self._buffer:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\r\n", 1)
        return line

    def _run(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                line = self._read_line()
                if line is None:
                    return
                self._take(line)

    def _take(self, line: bytes) -> None:
        match = _LINE.match(line)
        if match is None:
            return
        rest = match.group(3)
        client = match.group(2).decode()
        # Keep what concerns our prefix (and transaction framing), drop script internals
        # except the lease checks.
        if self.prefix not in rest and not rest.startswith((b'"MULTI"', b'"EXEC"')):
            return
        args = tuple(itertools.islice((m.group(1) for m in _ARG.finditer(rest)), MAX_ARGS))
        command = Command(float(match.group(1)), client, args)
        check = command.name == b"GET" and self.lock_key in args
        chunk = client != LUA and self._is_chunk(command)
        watch = client != LUA and command.name == b"WATCH" and self.lock_key in args
        if client == LUA and not check:
            return
        if watch:
            # The status heartbeat is fenced too (WATCH P status P lock); it is not
            # a step worth aiming at, so its WATCH and lease check are set apart.
            if self._is_heartbeat_watch(command):
                self._heartbeats.add(client)
            else:
                self._heartbeats.discard(client)
        with self._cond:
            self.commands.append(command)
            if client in self._heartbeats and (check or watch):
                self._checks.append((command.at, "heartbeat"))
            elif check:
                self._checks.append((command.at, "script" if client == LUA else "transaction"))
            elif chunk:
                self._checks.append((command.at, "chunk"))
            elif watch:
                self._checks.append((command.at, "watch"))
            self._cond.notify_all()
        if (check or chunk or watch) and self._trigger is not None:
            since, count, target, action, fired = self._trigger
            if sum(1 for at, kind in self._checks if at >= since and kind == target) >= count:
                # Act from this thread: a hand-over to the test's thread could cost a
                # GIL switch interval, longer than a whole transaction takes.
                self._trigger = None
                action()
                fired.set()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)

    # -- aiming --------------------------------------------------------------------
    def arm(self, since: float, count: int, action: Callable[[], None], *,
            target: str) -> threading.Event:
        """Run ``action`` (on the monitor thread) at the ``count``-th step of kind
        ``target`` seen after ``since``: "transaction" (a lease check made by the client
        before a MULTI: graph transactions, lease takeover and renewal), "watch" (the
        WATCH of the lease key that starts such a transaction: freezing Redis there
        leaves the client waiting for its lease check, so the kill lands before its
        EXEC), "script" (a lease check inside a script: the publication's swap) or
        "chunk" (a write into a publication's private back buffer, which a pipeline
        of them follows). The returned event is set once ``action`` ran."""
        fired = threading.Event()
        self._trigger = (since, count, target, action, fired)
        return fired

    def disarm(self) -> None:
        self._trigger = None

    def settle(self, quiet: float = 0.3, timeout: float = 10.0) -> None:
        """Wait until no write or transaction command arrived for ``quiet`` seconds
        (after a thaw); reads, such as the tests' own probes, do not count."""
        deadline = time.monotonic() + timeout

        def writes() -> int:
            with self._cond:
                return sum(1 for c in self.commands if c.name in _FRAMING)

        while time.monotonic() < deadline:
            count = writes()
            time.sleep(quiet)
            if writes() == count:
                return

    def _is_chunk(self, command: Command) -> bool:
        """A write into a back buffer ``P scores:{alg}:next:{owner}`` (no lease check:
        the buffer is private to the writing process, see consumer.score_publisher)."""
        return (command.name in (b"ZADD", b"ZREM", b"DEL", b"UNLINK") and len(command.args) > 1
                and command.args[1].startswith(self.prefix + b"scores:")
                and b":next" in command.args[1])

    def _is_heartbeat_watch(self, command: Command) -> bool:
        return command.name == b"WATCH" and self.prefix + b"status" in command.args

    # -- classification -------------------------------------------------------------
    def _kind(self, unit: list[Command]) -> str:
        words = b" ".join(a for c in unit for a in c.args[1:])
        if self.prefix + b"offsets" in words:
            return "graph transaction"
        if self.prefix + b"meta:" in words or self.prefix + b"scores:" in words:
            return "publication"
        if any(c.name == b"PEXPIRE" for c in unit):
            return "lease renewal"
        if any(c.name == b"SET" and self.lock_key in c.args for c in unit):
            return "lease acquisition"
        if self.prefix + b"status" in words:
            return "status heartbeat"
        return "other write"

    def _units(self, commands: list[Command]) -> list[list[Command]]:
        """Group a connection-ordered list into units: MULTI..EXEC blocks, single writes."""
        units: list[list[Command]] = []
        open_: dict[str, list[Command]] = {}
        for c in commands:
            if c.name == b"MULTI":
                open_[c.client] = []
            elif c.name == b"EXEC":
                units.append([*open_.pop(c.client, []), c])
            elif c.client in open_:
                open_[c.client].append(c)
            elif c.name in _WRITES:
                units.append([c])
        return units

    def _open_transaction(self, ours: list[Command]) -> bool:
        """A connection WATCHed (before or after the kill moment: its WATCH may have
        run only after the thaw) and never reached its EXEC: the client died inside.
        A status heartbeat left open does not count."""
        last_watch: dict[str, int] = {}
        for i, c in enumerate(ours):
            if c.name == b"WATCH":
                if self._is_heartbeat_watch(c):
                    last_watch.pop(c.client, None)
                else:
                    last_watch[c.client] = i
        return any(not any(c.client == client and c.name == b"EXEC" for c in ours[i + 1:])
                   for client, i in last_watch.items())

    def classify(self, moment: float, started: float) -> str:
        """What a consumer process started at ``started`` was doing at ``moment`` (both
        wall-clock seconds, like Redis's): see the module docstring."""
        with self._cond:
            mine = [c for c in self.commands if c.at >= started]
        clients = {c.client for c in mine if c.at <= moment and c.client != LUA}
        ours = [c for c in mine if c.client in clients]
        units = [u for u in self._units(ours) if self._kind(u) != "status heartbeat"]
        executed_after = [self._kind(u) for u in units if u[-1].at > moment
                          and (u[-1].name in (b"EXEC", b"EVAL", b"EVALSHA")
                               or self._is_chunk(u[-1]))]
        for kind in ("graph transaction", "publication"):
            if kind in executed_after:
                return f"{kind} in flight (executed after the kill)"
        if self._open_transaction(ours):
            return "fenced transaction in flight, EXEC never sent (aborted)"
        if executed_after:
            return f"{executed_after[0]} in flight (executed after the kill)"
        before = [u for u in units if u[-1].at <= moment]
        if not before:
            return "start-up (before its first write)"
        return f"between writes (after a {self._kind(before[-1])})"
