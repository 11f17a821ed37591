"""Process plumbing shared by the Kafka and Redis launchers.

Linux only (it reads ``/proc``), like the machines it is meant for. Nothing here
knows about Kafka or Redis; it starts detached processes, finds them again by pid
file, and stops them politely first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from rankstream.errors import ServiceError

POLL_SECONDS = 0.2


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_free(host: str, port: int) -> bool:
    return not port_open(host, port)


def is_loopback(host: str) -> bool:
    """We only ever start services on loopback; anything else must be the user's."""
    return host in {"localhost", "::1"} or host.startswith("127.")


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _reap(pid: int) -> None:
    # A service started by *this* Python process (a test fixture restarting the
    # broker) becomes a zombie when it exits until we wait for it; a zombie still
    # answers kill(pid, 0), so reap it first. Not our child: nothing to do.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (stopped by SIGSTOP counts as alive, zombies do not)."""
    _reap(pid)
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    state = fields.get("State", "").split()[:1]
    threads = int(fields.get("Threads", "0").strip() or 0)
    # A zombie whose other threads still run (a JVM's main thread exits first) has
    # not released its sockets yet: still alive for our purposes.
    return state not in (["Z"], ["X"]) or threads > 1


def command_args(pid: int) -> list[str]:
    """The arguments ``pid`` was started with (none if it is gone or not readable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.rstrip(b"\0").decode(errors="replace").split("\0") if raw else []


def command_line(pid: int) -> str:
    return " ".join(command_args(pid))


def live_pid(pid_file: Path, marker: str, *, cwd: Path | None = None,
             whole_argument: bool = False) -> int | None:
    """The pid in ``pid_file`` if that process is alive and is what we started.

    ``marker`` must occur in its command line (be one of its arguments, with
    ``whole_argument``: a path is not matched by a longer one ending with it), and
    where given the process must run in ``cwd``: after a reboot the kernel may have
    given a stale pid file's number to an unrelated process, which ``down`` would
    otherwise stop.
    """
    pid = read_pid(pid_file)
    if pid is None or not process_alive(pid):
        return None
    args = command_args(pid)
    if marker not in (args if whole_argument else " ".join(args)):
        return None
    if cwd is not None:
        try:
            if Path(f"/proc/{pid}/cwd").resolve(strict=True) != cwd.resolve():
                return None
        except OSError:  # another user's process: not ours
            return None
    return pid


def spawn_detached(argv: Sequence[str], *, log_file: Path, pid_file: Path, cwd: Path) -> int:
    """Start ``argv`` in its own session, output appended to ``log_file``.

    Its own session means a Ctrl-C in the shell that ran ``up`` (or the end of the
    pytest run that started it) does not reach the service.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise ServiceError(f"cannot start {argv[0]}: {exc}") from exc
    try:
        pid_file.write_text(f"{proc.pid}\n")
    except OSError as exc:
        # Without its pid file nothing could ever find (or stop) it again.
        proc.kill()
        proc.wait()
        raise ServiceError(f"cannot write {pid_file}: {exc.strerror or exc}") from exc
    return proc.pid


def stop_process(pid: int, *, timeout: float, name: str) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. Thaws a frozen one first."""
    if not process_alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        # A SIGSTOPped process cannot act on SIGTERM until it is continued.
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
    if wait_until(lambda: not process_alive(pid), timeout):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not wait_until(lambda: not process_alive(pid), 10.0):
        raise ServiceError(f"{name} (pid {pid}) survived SIGKILL")


def send_signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError as exc:
        raise ServiceError(f"process {pid} is gone") from exc


def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    """Poll ``check`` until it is true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or a note that there is none."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialise ``up``/``down`` across processes (two shells, or pytest and ./run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_checked(argv: Sequence[str], *, what: str, timeout: float, cwd: Path | None = None) -> str:
    """Run a helper command to completion; a failure is a ServiceError with its output."""
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ServiceError(f"{what}: {argv[0]} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"{what}: timed out after {timeout:.0f}s") from exc
    output = (done.stdout or "") + (done.stderr or "")
    if done.returncode != 0:
        last = "\n".join(output.splitlines()[-30:])
        raise ServiceError(f"{what} failed (exit {done.returncode}):\n{last}")
    return output


def apt_install(package: str, *, timeout: float = 600.0) -> None:
    """Install a Debian package (we run as root on our machines and in CI).

    ``env`` sets DEBIAN_FRONTEND for apt alone, so no prompt can hang CI.
    """
    if shutil.which("apt-get") is None:
        raise ServiceError(f"{package} is missing and apt-get is not available: install it")
    if os.geteuid() != 0:
        raise ServiceError(f"{package} is missing: run `sudo apt-get install -y {package}`")
    # On a fresh VM unattended-upgrades often holds the dpkg lock for a few minutes:
    # wait for it instead of failing at once.
    lock_wait = ["-o", f"DPkg::Lock::Timeout={int(timeout / 2)}"]
    run_checked(["apt-get", *lock_wait, "update", "-q"], what="apt-get update",
                timeout=timeout)
    run_checked(
        ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", *lock_wait, "install", "-y", "-q",
         "--no-install-recommends", package],
        what=f"apt-get install {package}",
        timeout=timeout,
    )


def require_binary(name: str, *, debian_package: str, install: bool) -> str:
    """Path of ``name``; installs its Debian package first when allowed."""
    found = shutil.which(name)
    if found is None and install:
        apt_install(debian_package)
        found = shutil.which(name)
    if found is None:
        raise ServiceError(f"{name} not found: install the Debian package {debian_package}")
    return found
