"""Single-consumer guard: one lease key per key prefix, with fencing.

Two consumers writing the same prefix would interleave their graph transactions
and double-apply events, so exactly one may run. The guard is a Redis lease:

* ``SET P lock VALUE NX PX ttl`` acquires it; VALUE is a JSON object with the
  holder's host, pid, start time and a random token.
* A daemon thread renews it every ``ttl/3`` with a compare-and-PEXPIRE done as
  WATCH/GET/MULTI/PEXPIRE/EXEC (no Lua, so an ACL user limited to the key prefix
  and the plain data commands is enough).
* Every graph transaction and every score publication is *fenced*: it WATCHes the
  lock key and checks the token before MULTI, so if the lease expired (the
  process was frozen) and someone else took it, EXEC aborts and nothing is
  written. :meth:`ConsumerLock.fenced` serialises renewal with those
  transactions, because our own PEXPIRE would otherwise abort our own EXEC.
* A holder that died by SIGKILL leaves its lease until the TTL expires; a new
  consumer on the same host, boot and pid namespace (both recorded with the pid:
  a container on the host network shares the host's name, not its pids) whose
  recorded pid no longer exists takes the lease over at once instead of waiting.
* A clean exit deletes the lease (compare-and-delete).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from consumer.resp import reply_code
from rankstream.errors import ServiceError, ServiceUnavailable

log = logging.getLogger("rankstream.consumer.lock")

DEFAULT_TTL_MS = 30_000


class LockHeld(ServiceError):
    """Another live consumer holds the lease on this key prefix."""


class LockLost(ServiceError):
    """Our lease expired or was taken over; writing now would not be safe."""


class LockNotString(ServiceError):
    """The lease key holds another type: someone else's data, not a lease to wait for."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as recorded in the lock value."""

    host: str
    pid: int
    since: str
    token: str
    # Where the pid means something: this boot of the machine, and this pid namespace
    # (a container on the host network has the host's name but its own pids).
    boot: str = ""
    pidns: str = ""

    def encode(self) -> bytes:
        return json.dumps(
            {"host": self.host, "pid": self.pid, "since": self.since, "token": self.token,
             "boot": self.boot, "pidns": self.pidns},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Holder | None:
        """Parse a lock value; an unreadable value is reported as an unknown holder."""
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            # since/token only describe the holder; a lease without them still names
            # its host and pid (and a dead holder's can be taken over).
            return cls(str(data["host"]), int(data["pid"]), str(data.get("since", "?")),
                       str(data.get("token", "")), str(data.get("boot", "")),
                       str(data.get("pidns", "")))
        except (ValueError, KeyError, TypeError, RecursionError, OverflowError):
            # OverflowError: a hand-edited "pid": 1e999
            return cls("?", -1, "?", raw.decode("utf-8", "replace"))

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host} since {self.since}"

    def same_pid_space(self, other: Holder) -> bool:
        """Whether ``other``'s pid can be looked up here: same host, boot, namespace."""
        return (self.host == other.host and bool(self.boot) and self.boot == other.boot
                and bool(self.pidns) and self.pidns == other.pidns)


def _pid_space() -> tuple[str, str]:
    """This machine's boot id and this process's pid namespace ("" where unknown)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return "", ""
    return boot, pidns


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        # OverflowError: no pid this large exists here, but the lease was edited by
        # hand; cannot tell, so it is refused rather than taken.
        return True
    return True


class ConsumerLock:
    """The lease on ``{prefix}lock``; see the module docstring for the design."""

    def __init__(self, client: redis.Redis, key: str, *, ttl_ms: int = DEFAULT_TTL_MS,
                 host: str | None = None, pid: int | None = None) -> None:
        if ttl_ms < 1000:
            raise ValueError("lock ttl must be at least 1000 ms")
        self.client = client
        self.key = key
        self.ttl_ms = ttl_ms
        boot, pidns = _pid_space()
        self.holder = Holder(
            host=host or socket.gethostname(),
            pid=os.getpid() if pid is None else pid,
            since=datetime.now(UTC).isoformat(timespec="seconds"),
            token=uuid.uuid4().hex,
            boot=boot,
            pidns=pidns,
        )
        self.value = self.holder.encode()
        self._mutex = threading.Lock()
        # When the lease was last set or extended (monotonic): fenced() extends it
        # first when the renewal thread is due, which it cannot do meanwhile.
        self._renewed_at = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = threading.Event()
        # Set while a lost lease is being re-taken, and after that until the mirror is
        # rebuilt if another consumer wrote meanwhile (consumer.recovery): every fence
        # check fails meanwhile. Without it, a second writer thread found the lease
        # "ours" again (the first had just re-taken it) and committed a batch planned
        # on the stale mirror over the other consumer's writes.
        self.suspended = threading.Event()

    # -- acquisition --------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lease or raise :class:`LockHeld` naming the current holder."""
        with self._lease_type_checked():
            self._acquire()

    def _acquire(self) -> None:
        try:
            if self.client.set(self.key, self.value, nx=True, px=self.ttl_ms):
                self._taken()
                return
            current: Any = self.client.get(self.key)
            if current == self.value:
                # Ours already: after a stall both writer threads find the lease gone
                # and re-take it; the slower one must not mistake us for a stranger
                # (found by tests/faults: the consumer stopped itself).
                self.lost.clear()
                return
            holder = Holder.decode(current)
            if (current is not None and holder is not None
                    and self.holder.same_pid_space(holder)
                    # Dead, or this very process under an older token: a Redis restored
                    # from a copy taken before a regain holds that one (it stopped the
                    # consumer as if another had taken over, a review found).
                    and (not _pid_alive(holder.pid) or holder.pid == self.holder.pid)):
                if self._compare_and_set(current):
                    log.warning("took over the lease of a dead consumer"
                                if holder.pid != self.holder.pid
                                else "took back our own lease under an older token",
                                extra={"fields": {"dead_pid": holder.pid, "key": self.key}})
                    self._taken()
                    return
                # Another consumer took it over first: name that one, not the dead one
                # (or, if it is gone already, try once more below).
                current = self.client.get(self.key)
                holder = Holder.decode(current)
            if current is None:  # expired between SET and GET: try once more
                if self.client.set(self.key, self.value, nx=True, px=self.ttl_ms):
                    self._taken()
                    return
                latest: Any = self.client.get(self.key)
                holder = Holder.decode(latest)
        except redis.RedisError as exc:
            if reply_code(exc) == "WRONGTYPE":
                raise  # see acquire
            raise ServiceUnavailable(f"redis: cannot take the consumer lock: {exc}") from exc
        who = holder.describe() if holder else "another consumer"
        raise LockHeld(f"another consumer holds {self.key} ({who}); refusing to start")

    def _taken(self) -> None:
        self._renewed_at = time.monotonic()
        self.lost.clear()

    def _compare_and_set(self, expected: bytes) -> bool:
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.key)
                if pipe.get(self.key) != expected:
                    return False
                pipe.multi()
                pipe.set(self.key, self.value, px=self.ttl_ms)
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    def still_ours(self) -> bool:
        """Read the lease (no renewal): True while our token is recorded."""
        try:
            with self._lease_type_checked():
                return bool(self.client.get(self.key) == self.value)
        except redis.RedisError as exc:
            raise ServiceUnavailable(f"redis: cannot read the consumer lock: {exc}") from exc

    # -- renewal ------------------------------------------------------------------
    def renew(self) -> bool:
        """Extend the lease if it is still ours; False (and ``lost`` set) if not."""
        with self._mutex:
            return self._renew_locked()

    def _renew_locked(self) -> bool:
        started = time.monotonic()
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.key)
                with self._lease_type_checked():
                    current = pipe.get(self.key)
                if current != self.value:
                    self.lost.set()
                    return False
                pipe.multi()
                pipe.pexpire(self.key, self.ttl_ms)
                pipe.execute()
                self._renewed_at = started
                return True
            except redis.WatchError:
                # The key changed between WATCH and EXEC: only expiry or a foreign SET
                # can do that while we hold the mutex.
                ours = self.client.get(self.key) == self.value
                if not ours:
                    self.lost.set()
                return ours

    def start_renewal(self) -> None:
        """Renew every ttl/3 from a daemon thread until :meth:`release`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="lock-renewal",
                                        daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        interval = self.ttl_ms / 3000.0
        while not self._stop.wait(interval):
            try:
                if not self.renew():
                    log.error("consumer lease lost", extra={"fields": {"key": self.key}})
            except LockNotString as exc:  # lost is set: the consumer stops on it
                log.error("consumer lease lost", extra={"fields": {"key": self.key,
                                                                   "error": str(exc)}})
            except redis.RedisError as exc:
                # Redis down: the transactions will wait for it too; keep trying.
                log.warning("lease renewal failed",
                            extra={"fields": {"key": self.key, "error": str(exc)}})

    # -- fencing ------------------------------------------------------------------
    @contextlib.contextmanager
    def fenced(self) -> Iterator[None]:
        """Hold off renewal while the caller runs one WATCH-fenced transaction.

        The lease is extended first if the renewal thread is due: since Redis 6.0.9 a
        watched key that expires aborts EXEC, so a long transaction started on the
        last third of the lease could abort with no rival, again on every retry.
        """
        with self._mutex:
            if time.monotonic() - self._renewed_at >= self.ttl_ms / 3000.0:
                # Best effort: not ours any more, or Redis refusing writes for now (out
                # of memory, a read-only replica: a raw error here crashed the consumer
                # past ttl/3 of OOM), the fenced write's own check says what follows.
                with contextlib.suppress(redis.RedisError):
                    self._renew_locked()
            yield

    def check_in(self, pipe: Any, *also_watch: str) -> None:
        """WATCH the lease (and ``also_watch``) on ``pipe``; raise :class:`LockLost`
        unless the lease is ours."""
        pipe.watch(*also_watch, self.key)
        with self._lease_type_checked():
            current = pipe.get(self.key)
        self._expect_ours(current)

    def check_on(self, conn: Any) -> None:
        """:meth:`check_in` on a raw redis-py ``Connection`` (see :mod:`consumer.resp`)."""
        conn.send_command("WATCH", self.key)
        conn.read_response()
        conn.send_command("GET", self.key)
        with self._lease_type_checked():
            current = conn.read_response()
        self._expect_ours(current)

    @contextlib.contextmanager
    def _lease_type_checked(self) -> Iterator[None]:
        """A lease key that is not a string (overwritten by hand) answers GET with
        WRONGTYPE: the lease is not ours, and no retry will make it so (before, a
        write crashed with a traceback and an idle consumer renewed in vain forever)."""
        try:
            yield
        except redis.ResponseError as exc:
            if reply_code(exc) != "WRONGTYPE":
                raise
            self.lost.set()
            raise LockNotString(f"{self.key} holds a value that is not a consumer lease "
                                f"({exc}); refusing to write") from exc

    def _expect_ours(self, current: Any) -> None:
        if current != self.value:
            self.lost.set()
            raise LockLost(f"lost the consumer lock {self.key}")
        self.check_not_suspended()

    def reacquire(self) -> bool:
        """After a loss: take the lease again if it is free. False if another holds it.

        Under a new token (unless our value is still recorded): a check that read the
        old one before the lease lapsed, such as a scripted score swap about to run,
        then fails instead of passing as ours again.
        """
        try:
            with self._lease_type_checked():
                current = self.client.get(self.key)
            if current != self.value:
                self.holder = replace(self.holder, token=uuid.uuid4().hex)
                self.value = self.holder.encode()
            self.acquire()
        except LockHeld:
            return False
        except redis.RedisError as exc:
            raise ServiceUnavailable(f"redis: cannot take the consumer lock: {exc}") from exc
        return True

    def check_not_suspended(self) -> None:
        """Raise :class:`LockLost` while fenced writes are suspended (:attr:`suspended`),
        for a write whose fence is a script comparing the token (read the token first)."""
        if self.suspended.is_set():
            self.lost.set()
            raise LockLost(f"fenced writes are suspended while {self.key} is re-checked")

    # -- release ------------------------------------------------------------------
    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                with self._mutex, self.client.pipeline(transaction=True) as pipe:
                    pipe.watch(self.key)
                    if pipe.get(self.key) != self.value:
                        return
                    pipe.multi()
                    pipe.delete(self.key)
                    pipe.execute()
                    return
            except redis.WatchError:
                continue
            except redis.RedisError as exc:
                log.warning("could not release the consumer lock",
                            extra={"fields": {"key": self.key, "error": str(exc)}})
                return
