"""Keeping the term index exact: each page's text contributions and their counts.

A page is filed under a term while at least one *source* still gives it that term:
its own title, or the anchor text of a live link pointing to it. Several sources
often agree (fifty pages link to the tutorial as "tutorial"), so removing one must
not unfile the page. Redis therefore keeps, besides the posting SETs readers query:

``P page:terms``      HASH source id -> what the source contributes: its title's
                      terms (``"t {term} {term}..."``, first) and one line per target
                      of its anchors (``"{target id} {term} {term}..."``).
``P termcount:{term}`` HASH page id -> how many sources beyond the first give the page
                      ``term`` (absent: one, or none if the page is not in
                      ``P term:{term}``). Most postings have one source, so they cost
                      nothing here.

A MULTI/EXEC cannot read, so the diff runs in Redis: one ``EVAL`` of
:data:`POSTINGS_SCRIPT` per batch, inside the graph transaction, compares each
changed source's new contributions with the stored ones and adds or removes exactly
the difference, with no round trip of its own. Its input is
:func:`postings_command`'s text, built from the batch's
:class:`rankstream.text_changes.TextChanges` and titles. Where scripts are not
allowed (``--plain-writes``), :func:`plain_commands` reads what it needs first and
computes the same diff in Python: 2-3 extra round trips per batch. Both are
idempotent, so a transaction re-sent after a lost reply stays exactly-once.

A prefix written by a release before this one has postings without counts or
contributions: each such posting behaves as one source that never goes away (the
index of those releases only grew), while everything indexed since is exact.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from consumer.keys import Keys
from consumer.text_index import term_key, term_line
from rankstream.text_changes import TextChanges

__all__ = ["POSTINGS_SCRIPT", "index_commands", "plain_commands", "postings_command",
           "termcount_key"]

# ARGV: the key prefix, the P page:terms key, then one argument per changed source:
#   "R {source} {keep}\n{lines}"  the source's contributions are replaced by these
#                                 lines (keep=1: its stored title line stays), of
#       "t {term} {term}..."           its title's terms (first, if any)
#       "{target} {term} {term}..."    the anchor terms it gives one target
#   "D {source} {target}..."      the source no longer gives these targets anything.
# A source's lines come canonical (targets ascending, terms sorted; postings_command),
# and are stored as they come, so an unchanged re-crawl is one string comparison (an
# argument per source spares splitting the batch into lines and joining them again).
# The changes of every (term, page) are summed over the batch first, then applied per
# term: two reads and at most four writes a term, however many pages it concerns (one
# call per posting made a first crawl's script 3x slower).
# Returns {pages filed, pages unfiled} (per term).
POSTINGS_SCRIPT = r"""
local prefix, map_key = ARGV[1], ARGV[2]
local delta = {}  -- term -> page -> change in its number of sources

local function parse(source, text)
  local map = {}
  if text then
    for line in string.gmatch(text, '[^\n]+') do
      local target, rest = string.match(line, '^(%w+)(.*)$')
      if target == 't' then target = source end
      local terms = {}
      for term in string.gmatch(rest, '%S+') do terms[term] = true end
      map[target] = terms
    end
  end
  return map
end

local function change(term, target, by)
  local row = delta[term]
  if not row then
    row = {}
    delta[term] = row
  end
  row[target] = (row[target] or 0) + by
end
local function add(term, target) change(term, target, 1) end
local function remove(term, target) change(term, target, -1) end

-- redis.call(verb, key, items...) in chunks (Lua's unpack has a stack limit).
local function write(verb, key, items)
  for i = 1, #items, 1000 do
    redis.call(verb, key, unpack(items, i, math.min(i + 999, #items)))
  end
end

local filed_count, unfiled_count = 0, 0

-- One page's change under a term: most terms of a batch concern one page, and this
-- takes one or two calls where the general case takes three or more.
local function apply_one(posting, count_key, target, by)
  if by > 0 then
    if redis.call('SADD', posting, target) == 1 then
      if by > 1 then redis.call('HSET', count_key, target, by - 1) end
      filed_count = filed_count + 1
    else
      redis.call('HINCRBY', count_key, target, by)
    end
    return
  end
  local extra = tonumber(redis.call('HGET', count_key, target)) or 0
  if extra + by >= 1 then
    redis.call('HSET', count_key, target, extra + by)
    return
  end
  if extra > 0 then redis.call('HDEL', count_key, target) end
  if extra + by < 0 and redis.call('SREM', posting, target) == 1 then
    unfiled_count = unfiled_count + 1
  end
end

local function apply(term, row)
  local targets = {}
  for target, by in pairs(row) do
    if by ~= 0 then targets[#targets + 1] = target end
  end
  local posting, count_key = prefix .. 'term:' .. term, prefix .. 'termcount:' .. term
  if #targets <= 1 then
    if #targets == 1 then apply_one(posting, count_key, targets[1], row[targets[1]]) end
    return
  end
  local filed, unfiled, counts, uncounted = {}, {}, {}, {}
  for i = 1, #targets, 1000 do
    local chunk = targets
    if #targets > 1000 then chunk = {unpack(targets, i, math.min(i + 999, #targets))} end
    local members = redis.call('SMISMEMBER', posting, unpack(chunk))
    -- Only members have counts (unfiling a page deletes its count; apply_one relies
    -- on that too), so only theirs are read: a first crawl's pages are mostly new
    -- to its terms, and each of them cost an HMGET field and reply entry for nothing.
    local held = {}
    for j, target in ipairs(chunk) do
      if members[j] == 1 then
        held[#held + 1] = target
      elseif row[target] > 0 then
        filed[#filed + 1] = target
        if row[target] > 1 then
          counts[#counts + 1] = target
          counts[#counts + 1] = row[target] - 1
        end
      end
    end
    local extras = {}
    if #held > 0 then extras = redis.call('HMGET', count_key, unpack(held)) end
    for j, target in ipairs(held) do
      -- A posting without a count is one source (also one an older release wrote).
      local extra = tonumber(extras[j]) or 0
      local after = 1 + extra + row[target]
      if after <= 0 then unfiled[#unfiled + 1] = target end
      if after > 1 then
        if after - 1 ~= extra then
          counts[#counts + 1] = target
          counts[#counts + 1] = after - 1
        end
      elseif extras[j] then
        uncounted[#uncounted + 1] = target
      end
    end
  end
  write('SADD', posting, filed)
  write('SREM', posting, unfiled)
  write('HSET', count_key, counts)
  write('HDEL', count_key, uncounted)
  filed_count, unfiled_count = filed_count + #filed, unfiled_count + #unfiled
end

-- fn(term, target) for every (term, target) of ``have`` that ``other`` lacks.
local function each_missing(have, other, fn)
  for target, terms in pairs(have) do
    local there = other[target] or {}
    for term in pairs(terms) do
      if not there[term] then fn(term, target) end
    end
  end
end

-- Store a page's contributions ('' : none).
local function put(page, text)
  if text == '' then
    redis.call('HDEL', map_key, page)
  else
    redis.call('HSET', map_key, page, text)
  end
end

-- Replace what ``source`` stored (``raw``, false if nothing) with ``text``.
local function store(source, raw, text)
  if text == (raw or '') then return end
  if not raw then  -- a first crawl: every term is new
    for line in string.gmatch(text, '[^\n]+') do
      local target, rest = string.match(line, '^(%w+)(.*)$')
      if target == 't' then target = source end
      -- add(term, target), inlined: the call cost 1-3 us of ~32 an event (first crawls)
      for term in string.gmatch(rest, '%S+') do
        local row = delta[term]
        if not row then
          row = {}
          delta[term] = row
        end
        row[target] = (row[target] or 0) + 1
      end
    end
    redis.call('HSET', map_key, source, text)
    return
  end
  local old, new = parse(source, raw), parse(source, text)
  each_missing(old, new, remove)
  each_missing(new, old, add)
  put(source, text)
end

-- Only the dropped lines are read: a page removed with 2,000 in-links, each source
-- with 400 anchored links, took 2.5 s parsing every source whole.
local function drop(block)
  local numbers = string.gmatch(block, '%d+')
  local page = numbers()
  local raw = redis.call('HGET', map_key, page)
  if not raw then return end
  local text, changed = '\n' .. raw .. '\n', false
  for target in numbers do
    local head = '\n' .. target .. ' '
    local start = string.find(text, head, 1, true)
    if start then
      local stop = string.find(text, '\n', start + 1, true)
      for term in string.gmatch(string.sub(text, start + #head, stop - 1), '%S+') do
        remove(term, target)
      end
      text = string.sub(text, 1, start) .. string.sub(text, stop + 1)
      changed = true
    end
  end
  if changed then put(page, string.sub(text, 2, -2)) end
end

for i = 3, #ARGV do
  local block = ARGV[i]
  if string.byte(block, 1) == 82 then  -- 'R'
    local source, keep, text = string.match(block, '^R (%d+) ([01])\n?(.*)$')
    local raw = redis.call('HGET', map_key, source)
    if keep == '1' and raw and string.sub(raw, 1, 2) == 't ' then
      local title = string.match(raw, '^[^\n]*')
      if text == '' then text = title else text = title .. '\n' .. text end
    end
    store(source, raw, text)
  else
    drop(block)
  end
end
for term, row in pairs(delta) do apply(term, row) end
return {filed_count, unfiled_count}
"""


def termcount_key(prefix: str, term: str) -> str:
    """The Redis key of ``term``'s extra-source counts."""
    return f"{prefix}termcount:{term}"


def index_commands(client: Any, keys: Keys, titles: Mapping[int, str],
                   changes: TextChanges, *, scripted: bool = True) -> list[tuple[Any, ...]]:
    """The batch's term-index commands, for its graph transaction.

    ``titles``: page id -> the title of its last ``page`` event in the batch (a page
    event without one keeps the stored title, and its terms).

    Scripted: one ``EVAL`` of :data:`POSTINGS_SCRIPT` (``client`` is not used). With
    ``scripted=False`` (``rankstream consume --plain-writes``, for a Redis user that
    may not run scripts) the same diff runs here instead, on what ``client`` reads
    before the transaction (:func:`plain_commands`).
    """
    if not scripted:
        return plain_commands(client, keys, titles, changes)
    command = postings_command(keys, titles, changes)
    return [] if command is None else [command]


def _lines(source: int, title: str | None, anchors: Mapping[int, str]) -> list[str]:
    """A source's contributions in their canonical (stored) form, title line first."""
    lines = []
    if title is not None and (terms := term_line(title)):
        lines.append(f"t {terms}")
    for target in sorted(anchors):
        if target != source and (terms := term_line(anchors[target])):
            lines.append(f"{target} {terms}")
    return lines


def postings_command(keys: Keys, titles: Mapping[int, str],
                     changes: TextChanges) -> tuple[Any, ...] | None:
    """The ``EVAL`` of :data:`POSTINGS_SCRIPT` for these changes, or None if none."""
    blocks: list[str] = []
    for source, anchors in changes.replaced.items():
        title = titles.get(source)
        blocks.append("\n".join([f"R {source} {0 if title is not None else 1}",
                                 *_lines(source, title, anchors)]))
    for source, targets in changes.dropped.items():
        drop = sorted(target for target in targets if target != source)
        if drop:
            blocks.append(f"D {source} {' '.join(map(str, drop))}")
    if not blocks:
        return None
    return ("EVAL", POSTINGS_SCRIPT, 0, keys.prefix, keys.page_terms, *blocks)


def _parsed(source: int, text: str) -> set[tuple[str, int]]:
    """``(term, target)`` pairs of a source's stored contributions."""
    pairs: set[tuple[str, int]] = set()
    for line in text.split("\n") if text else ():
        head, *terms = line.split(" ")
        target = source if head == "t" else int(head)
        pairs.update((term, target) for term in terms)
    return pairs


def plain_commands(client: Any, keys: Keys, titles: Mapping[int, str],
                   changes: TextChanges) -> list[tuple[Any, ...]]:
    """:data:`POSTINGS_SCRIPT`'s diff without a script: read, then absolute writes.

    Reads the changed sources' stored contributions, then the membership and count
    of every (term, page) whose number of sources changes, and returns plain
    commands that write the results as values (``SADD``/``SREM``, ``HSET``/``HDEL``).
    Run before the transaction, on the consumer's own keys (no one else writes them
    while it holds the lease; its transaction WATCHes ``P graph``), and again from
    scratch on a retry: a re-sent transaction whose first attempt committed finds
    nothing left to change.
    """
    sources = [*changes.replaced, *changes.dropped]
    if not sources:
        return []
    raw = client.hmget(keys.page_terms, sources)
    stored = {source: value.decode() if value else "" for source, value
              in zip(sources, raw, strict=True)}
    texts: dict[int, str] = {}
    delta: Counter[tuple[str, int]] = Counter()
    for source, anchors in changes.replaced.items():
        title = titles.get(source)
        lines = _lines(source, title, anchors)
        if title is None and stored[source].startswith("t "):
            lines.insert(0, stored[source].split("\n", 1)[0])
        texts[source] = "\n".join(lines)
        if texts[source] != stored[source]:
            old, new = _parsed(source, stored[source]), _parsed(source, texts[source])
            delta.update(new - old)
            delta.subtract(old - new)
    for source, targets in changes.dropped.items():
        drop = {str(target) for target in targets if target != source}
        kept = []
        for line in stored[source].split("\n") if stored[source] else ():
            head, *terms = line.split(" ")
            if head in drop:  # only the dropped lines are parsed (see the script)
                delta.subtract((term, int(head)) for term in terms)
            else:
                kept.append(line)
        texts[source] = "\n".join(kept)
    by_term: defaultdict[str, list[int]] = defaultdict(list)
    for (term, target), change in delta.items():
        if change:
            by_term[term].append(target)
    pipe = client.pipeline(transaction=False)
    for term, pages in by_term.items():  # two reads per term, not per posting
        pipe.smismember(term_key(keys.prefix, term), pages)
        pipe.hmget(termcount_key(keys.prefix, term), pages)
    replies = pipe.execute() if by_term else []
    commands: list[tuple[Any, ...]] = []
    for (term, pages), members, extras in zip(by_term.items(), replies[::2], replies[1::2],
                                              strict=True):
        filed: list[int] = []
        unfiled: list[int] = []
        counts: list[int] = []  # target, count, target, count...
        uncounted: list[int] = []
        for target, member, extra in zip(pages, members, extras, strict=True):
            # A posting without a count is one source (also one an older release wrote).
            before_extra = int(extra or 0)
            after = (1 + before_extra if member else 0) + delta[(term, target)]
            # Only what changes is written, as the script does.
            if after > 0 and not member:
                filed.append(target)
            elif after <= 0 and member:
                unfiled.append(target)
            if after > 1:
                if after - 1 != before_extra:
                    counts += [target, after - 1]
            elif extra is not None:
                uncounted.append(target)
        posting, count_key = term_key(keys.prefix, term), termcount_key(keys.prefix, term)
        for verb, key, args in (("SADD", posting, filed), ("SREM", posting, unfiled),
                                ("HSET", count_key, counts), ("HDEL", count_key, uncounted)):
            if args:
                commands.append((verb, key, *args))
    for source, text in texts.items():
        if text != stored[source]:
            commands.append(("HSET", keys.page_terms, source, text) if text
                            else ("HDEL", keys.page_terms, source))
    return commands
