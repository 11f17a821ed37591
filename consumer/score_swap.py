"""The swap that makes a score publication visible: renames and meta, one atomic step.

:class:`consumer.score_publisher.ScorePublisher` fills its private back buffer in
chunks, then calls :func:`send_swap`. The swap is fenced (the lease is checked
inside the same atomic step) and guarded: it writes nothing unless every score key
holds the number of members the publisher recorded and every meta hash still names
the publication that record comes from. Two ways to run it, same semantics:

* a Lua script (:data:`SWAP_SCRIPT`), one round trip, the default;
* WATCH, then the checks, then MULTI/EXEC (``--plain-writes``: a Redis user that may
  not run EVAL).
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis

from consumer.lock import LockLost
from consumer.publication import Command, Publication, names_publication
from consumer.resp import reply_code, transient_refusal
from rankstream.errors import ServiceError, ServiceUnavailable

BACK_TTL_MS = 15 * 60 * 1000  # a back buffer outlives its consumer by at most this

# The swap, atomically: lease check; "done" if meta already names this publication
# (an earlier attempt committed); "mismatch" without writing anything if a score key
# does not hold the number of members recorded, or a meta hash does not name the
# publication our record of its live ZSET comes from (another consumer published
# while this one was stalled past its lease: same member count, other values);
# else run the commands (renames, TTLs, then the meta hashes). ARGV: lease key,
# lease value, meta key, publication id, number of checks, then (key, expected
# ZCARD) per check, number of meta checks, then (meta key, expected publication)
# per meta check, then each command as (argc, args...). An empty lease key means
# unfenced (tests, tools).
SWAP_SCRIPT = r"""
if ARGV[1] ~= '' and redis.call('GET', ARGV[1]) ~= ARGV[2] then
  return redis.error_reply('LEASELOST the consumer lease changed')
end
if redis.call('HGET', ARGV[3], 'publication') == ARGV[4] then
  return 'done'
end
local pos = 6
for i = 1, tonumber(ARGV[5]) do
  if redis.call('ZCARD', ARGV[pos]) ~= tonumber(ARGV[pos + 1]) then
    return 'mismatch'
  end
  pos = pos + 2
end
local metas = tonumber(ARGV[pos])
pos = pos + 1
for i = 1, metas do
  if redis.call('HGET', ARGV[pos], 'publication') ~= ARGV[pos + 1] then
    return 'mismatch'
  end
  pos = pos + 2
end
while pos <= #ARGV do
  local argc = tonumber(ARGV[pos])
  redis.call(unpack(ARGV, pos + 1, pos + argc))
  pos = pos + argc + 1
end
return 'ok'
"""


def swap_commands(key: str, back_key: str, *, live_known: bool, live_exists: bool,
                  back_exists: bool) -> list[Command]:
    """Make the back buffer ``back_key`` the live ZSET ``key`` (O(1) renames; no
    member is copied). ``live_known``: the publisher knows what the live ZSET holds;
    ``live_exists`` / ``back_exists``: the live ZSET / back buffer has members.

    If we know what the live ZSET holds it becomes the next back buffer (with the
    back buffer's TTL); otherwise it is dropped (UNLINK frees it off the main
    thread) and the new live ZSET is copied into the back buffer inside Redis
    (COPY), so the next publication writes only what moved instead of every member
    again (on a 1.4M-page graph that second full write was 2.8M members and 50 s of
    a loaded Redis).
    """
    if not live_known:
        cmds: list[Command] = [("UNLINK", key)]
        if back_exists:
            cmds += [("RENAME", back_key, key), ("PERSIST", key), ("COPY", key, back_key),
                     ("PEXPIRE", back_key, BACK_TTL_MS)]
        return cmds
    spare = f"{back_key}:swap"
    if live_exists and back_exists:
        return [("RENAME", key, spare), ("RENAME", back_key, key), ("PERSIST", key),
                ("RENAME", spare, back_key), ("PEXPIRE", back_key, BACK_TTL_MS)]
    if live_exists:
        return [("RENAME", key, back_key), ("PEXPIRE", back_key, BACK_TTL_MS)]
    if back_exists:
        return [("RENAME", back_key, key), ("PERSIST", key)]
    return []


def send_swap(client: redis.Redis, publication: Publication, *, scripts: bool,
              fence: Any | None = None) -> bool:
    """Run the publication's swap. True if it committed now or had before (meta
    names it already); False if it was refused, with nothing written, because a
    score key does not hold the members recorded (a key deleted behind our back, an
    expired back buffer) or a meta hash names another publication than the record
    comes from (another consumer published while we were stalled). Raises
    :class:`~consumer.lock.LockLost` if the lease changed, and ServiceError for any
    other refusal by Redis.
    """
    if not scripts:
        return _send_swap_watched(client, publication, fence)
    lease = (fence.key, fence.value) if fence is not None else ("", b"")
    if fence is not None:
        # After the token is read: a regain suspends writes before it re-takes the
        # lease under a new token, so either this sees the suspension or the script
        # sees a token that is not ours any more.
        fence.check_not_suspended()
    body: list[Any] = []
    for cmd in publication.swap:
        body += [len(cmd), *cmd]
    flat = [x for check in publication.checks for x in check]
    metas = [x for check in publication.meta_checks for x in check]
    try:
        reply = client.execute_command(
            "EVAL", SWAP_SCRIPT, 0, *lease, publication.meta_key,
            publication.publication_id, len(publication.checks), *flat,
            len(publication.meta_checks), *metas, *body)
    except redis.ResponseError as exc:
        if "LEASELOST" in str(exc):
            if fence is not None:
                fence.lost.set()
            raise LockLost(f"lost the consumer lock {lease[0]}") from exc
        if transient_refusal(exc):  # out of memory, a read-only replica...: retried
            raise ServiceUnavailable(f"score publication refused by Redis for now: {exc}"
                                     ) from exc
        if reply_code(exc) == "WRONGTYPE" and fence is not None:
            fence.still_ours()  # LockNotString (lost set) if the lease key is the one
        hint = (" (a Redis user without EVAL: run the consumer with --plain-writes)"
                if isinstance(exc, redis.exceptions.NoPermissionError) else "")
        raise ServiceError(f"score publication failed in Redis: {exc}{hint}") from exc
    return bool(reply != b"mismatch")


def _send_swap_watched(client: redis.Redis, publication: Publication, fence: Any | None
                       ) -> bool:
    """:func:`send_swap` without scripting: WATCH, check, MULTI/EXEC."""
    with contextlib.ExitStack() as stack:
        if fence is not None:
            stack.enter_context(fence.fenced())
        pipe = stack.enter_context(client.pipeline(transaction=True))
        if fence is not None:
            fence.check_in(pipe)
        pipe.watch(publication.meta_key, *[key for key, _ in publication.checks],
                   *[key for key, _ in publication.meta_checks])
        if names_publication(pipe.hget(publication.meta_key, "publication"),
                             publication.publication_id):
            return True
        for key, members in publication.checks:
            if int(pipe.zcard(key)) != members:
                return False
        for key, expected in publication.meta_checks:
            if not names_publication(pipe.hget(key, "publication"), expected):
                return False
        pipe.multi()
        for cmd in publication.swap:
            pipe.execute_command(*cmd)
        replies: list[Any] = pipe.execute(raise_on_error=False)
    failures = [r for r in replies if isinstance(r, Exception)]
    if failures:
        raise ServiceError(f"score publication failed in Redis: {failures[0]}")
    return True
