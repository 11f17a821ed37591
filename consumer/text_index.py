"""The small inverted index behind text HITS queries: title and anchor terms -> pages.

Kleinberg's root set is "the pages relevant to the query". rankstream finds them
in an inverted index of each page's *title* and of the *anchor text of the links
pointing to it* (anchor text describes the target, often better than the target
describes itself). Both arrive in ``page`` events; the consumer updates the postings in
the same MULTI/EXEC transaction as the graph change, exactly (:mod:`consumer.text_postings`:
a page is filed under a term while its current title or an anchor of a live link into
it holds the term). :func:`postings_commands` and :func:`index_text` only add postings:
hand-built test graphs and the grow-only baseline of ``./run bench text`` use them.

Indexing steps (the seeds' classic ones): Unicode NFKC, case folding, split into
runs of letters and digits (underscores and punctuation separate words), drop
words in :data:`STOP_WORDS`, drop words longer than :data:`MAX_TERM_CHARS`. At
most :data:`MAX_TERMS_PER_TEXT` distinct terms are kept per text, so a hostile
anchor cannot blow up Redis.

Redis keys (prefix ``P``):

``P term:{term}``  SET of page ids (decimal strings) whose title or incoming anchor
text contains ``term`` (what else the consumer keeps to maintain it:
:mod:`consumer.text_postings`).

Matching (:func:`match`): ``ZUNION`` of the query terms' sets gives every matching
page with its number of matching terms (a SET member counts 1 per key); pages are
ranked by that count, then by PageRank (``ZMSCORE P scores:pagerank``), then by
URL, and the first ``limit`` are returned; removed pages (``P page:removed``) are
skipped. A few round trips, none per page. Terms too common to unite
(:data:`MAX_UNION`) are counted over a bounded candidate set instead
(:func:`_bounded_counts`).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rankstream.errors import InputError

__all__ = [
    "MAX_MATCH_CANDIDATES",
    "MAX_QUERY_TERMS",
    "MAX_TERMS_PER_TEXT",
    "MAX_TERM_CHARS",
    "STOP_WORDS",
    "TextMatch",
    "index_page_text",
    "index_text",
    "match",
    "postings_commands",
    "query_terms",
    "term_key",
    "term_line",
    "tokenize",
]

# A short English stop-word list in the spirit of the classic SMART / van Rijsbergen
# lists: articles, pronouns, auxiliaries, prepositions and conjunctions, plus the
# boiler-plate words of anchor text ("click here", "more", "link"). Kept short on
# purpose: words like "python", "set" or "list" must stay searchable.
_STOP_WORDS_TEXT = """
    a about above after again against all am an and any are as at be because been
    before being below between both but by can could did do does doing down during
    each few for from further had has have having he her here hers herself him himself
    his how i if in into is it its itself just me more most my myself no nor not of off
    on once only or other our ours ourselves out over own same she should so some such
    than that the their theirs them themselves then there these they this those through
    to too under until up very was we were what when where which while who whom why
    will with would you your yours yourself yourselves s t
    click link links home next previous prev
"""
STOP_WORDS: frozenset[str] = frozenset(_STOP_WORDS_TEXT.split())

MAX_TERM_CHARS = 64
MAX_TERMS_PER_TEXT = 32
MAX_QUERY_TERMS = 16
# When more pages tie on the lowest matching-term count that still reaches the
# limit, at most this many live ones are ranked by PageRank (the lowest ids, i.e. the
# pages seen first, are kept): it bounds one query's work on a huge graph where a
# common word matches a large share of all pages.
MAX_MATCH_CANDIDATES = 20_000
# Query terms whose sets hold more pages than this together are not united in Redis:
# ZUNION of two terms of 500k pages each blocked Redis for 1.5 s (2.7 s with the
# reply), and any reader may send such a query. See _bounded_counts.
MAX_UNION = 100_000



def _mark_class() -> str:
    """A regex character class of every combining mark (Unicode categories M*).

    Why: ``[^\\W_]`` (letters and digits) splits words at their marks, and many
    scripts write vowels and diacritics as marks: "हिन्दी" became "ह", "न", "द".
    """
    ranges: list[list[int]] = []
    # Marks live in planes 0-1 and among the variation selectors at U+E0100: scanning
    # only those takes 9 ms at import instead of 100 (tests check nothing is missed).
    for code in (*range(0x20000), *range(0xE0000, 0xE0200)):
        if unicodedata.category(chr(code)).startswith("M"):
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    return "[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges) + "]"


# Runs of letters, digits and combining marks; a mark does not start a word.
_WORD_RE = re.compile(rf"[^\W_](?:[^\W_]|{_mark_class()})*")
# The same on ASCII text, where NFKC changes nothing, case folding is lower(), there
# are no marks and [^\W_] is [A-Za-z0-9]: most titles and anchors, at a third of the
# cost (tests check the two agree on every ASCII text).
_ASCII_WORD_RE = re.compile(r"[a-z0-9]+")


def term_key(prefix: str, term: str) -> str:
    """The Redis key of ``term``'s posting set."""
    return f"{prefix}term:{term}"


def _normal_form(text: str) -> str:
    """NFKC, case-folded, until that changes nothing more.

    Case folding can undo NFKC ("İ" folds to "i" + a combining dot, which is dropped
    so that "İstanbul" is found by "istanbul"), and dropping the dot can leave marks
    NFKC composes ("i" + U+0307 + U+0301 -> "í"): a term must come back unchanged
    when a query repeats it.
    """
    normal = unicodedata.normalize("NFKC", text)
    for _ in range(8):  # two or three rounds in practice; bounded all the same
        again = unicodedata.normalize("NFKC", normal.casefold().replace("i\u0307", "i"))
        if again == normal:
            break
        normal = again
    return normal


def tokenize(text: str, *, max_terms: int = MAX_TERMS_PER_TEXT) -> list[str]:
    """Distinct index terms of ``text``, in order of first appearance.

    >>> tokenize("The Python Tutorial: the __init__ method, Über-Klasse")
    ['python', 'tutorial', 'init', 'method', 'über', 'klasse']
    """
    if len(text) <= CACHED_TEXT_CHARS:
        return list(_cached_terms(text, max_terms))
    return list(_terms(text, max_terms))


# Anchor texts repeat ("next", "tutorial", a site's menu on every page) and a
# consumer tokenizes every title and anchor of every crawl: cached, the normal form
# and the regex run once per distinct short text. Bounded in entries and in text
# length (texts have no length limit of their own), so at most about 20 MB for each
# of the two caches (tokenize's, and term_line's, which the consumer uses), and a
# stream of unique texts only costs the caches' churn.
CACHED_TEXT_CHARS = 256


def _words(text: str) -> list[str]:
    """Every word of ``text`` in its normal form, in order, repeats and all."""
    if text.isascii():
        return _ASCII_WORD_RE.findall(text.lower())
    return _WORD_RE.findall(_normal_form(text))


def _terms(text: str, max_terms: int) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for word in _words(text):
        if len(word) > MAX_TERM_CHARS or word in STOP_WORDS or word in seen:
            continue
        seen[word] = None
        if len(seen) >= max_terms:
            break
    return tuple(seen)


_cached_terms = functools.lru_cache(maxsize=1 << 16)(_terms)


def term_line(text: str) -> str:
    """:func:`tokenize`'s terms sorted and joined by spaces ('' if none): how the
    term index stores a text (:mod:`consumer.text_postings`). Cached as tokenize is."""
    if len(text) <= CACHED_TEXT_CHARS:
        return _cached_term_line(text)
    return _term_line(text)


def _term_line(text: str) -> str:
    return " ".join(sorted(_terms(text, MAX_TERMS_PER_TEXT)))


_cached_term_line = functools.lru_cache(maxsize=1 << 16)(_term_line)


def query_terms(query: str) -> list[str]:
    """The sorted distinct terms of a text query (the query's normal form).

    Raises:
        InputError: the query has no searchable term (empty, only stop words, or only
            words longer than :data:`MAX_TERM_CHARS`),
            or more than :data:`MAX_QUERY_TERMS` distinct terms.
    """
    terms = tokenize(query, max_terms=MAX_QUERY_TERMS + 1)
    if not terms:
        raise InputError(f"query has no searchable terms (empty, only stop words, or only "
                         f"words longer than {MAX_TERM_CHARS} characters, which are never "
                         "indexed)", where="q")
    if len(terms) > MAX_QUERY_TERMS:
        raise InputError(f"query has more than {MAX_QUERY_TERMS} distinct terms", where="q")
    return sorted(terms)


def postings_commands(
    prefix: str,
    titles: Mapping[int, str] | Iterable[tuple[int, str]],
    anchors: Iterable[tuple[int, int, str]],
) -> list[tuple[Any, ...]]:
    """The index additions of one consumer batch: one ``SADD`` per distinct term.

    Args:
        prefix: the key prefix.
        titles: page id -> title (or ``(page id, title)`` pairs, a page more than once
            when the batch's ``page`` events gave it several).
        anchors: ``(src id, dst id, anchor text)`` triples; the text indexes ``dst``.

    Postings are grouped per term, so a batch costs one ``SADD`` per distinct term,
    however many pages share it.
    """
    postings: defaultdict[str, set[int]] = defaultdict(set)
    pairs = titles.items() if isinstance(titles, Mapping) else titles
    for page_id, title in pairs:
        for term in tokenize(title):
            postings[term].add(page_id)
    for _src, dst, text in anchors:
        if text:
            for term in tokenize(text):
                postings[term].add(dst)
    return [("SADD", term_key(prefix, term), *page_ids) for term, page_ids in postings.items()]


def index_text(
    pipe: Any,
    prefix: str,
    titles: Mapping[int, str],
    anchors: Iterable[tuple[int, int, str]],
) -> int:
    """Queue :func:`postings_commands` on ``pipe`` (a redis-py pipeline); return the count."""
    commands = postings_commands(prefix, titles, anchors)
    for cmd in commands:
        pipe.sadd(cmd[1], *cmd[2:])
    return len(commands)


def index_page_text(
    pipe: Any,
    prefix: str,
    page_id: int,
    title: str | None = None,
    anchor_texts: Iterable[str] = (),
) -> int:
    """Queue one page's title and incoming anchor texts on ``pipe`` (see :func:`index_text`)."""
    titles = {page_id: title} if title else {}
    return index_text(pipe, prefix, titles, ((page_id, page_id, t) for t in anchor_texts))


@dataclass(frozen=True)
class TextMatch:
    """A page matching a text query."""

    page_id: int
    url: str
    matched_terms: int
    pagerank: float


def match(
    redis: Any,
    prefix: str,
    terms: Iterable[str],
    limit: int,
    *,
    algorithm: str = "pagerank",
) -> list[TextMatch]:
    """The best ``limit`` pages for ``terms``: most matching terms, then highest score.

    ``terms`` must already be normalised (:func:`query_terms`). Removed pages
    (``P page:removed``) and ids missing from ``P page:url`` are skipped; a page
    with no published score counts 0.
    Ties after the score are broken by URL, so the answer is deterministic.
    """
    keys = [term_key(prefix, t) for t in dict.fromkeys(terms)]
    if not keys or limit <= 0:
        return []
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        pipe.scard(key)
    pipe.zcard(f"{prefix}scores:{algorithm}")
    *sizes, scored = (int(size) for size in pipe.execute())
    counted: list[tuple[bytes | str, float]]
    # The bounded count needs a full list of the best pages by PageRank: before the
    # first publication (or on a graph scored only in part) it would miss the rest.
    if sum(sizes) <= MAX_UNION or scored < MAX_MATCH_CANDIDATES:
        counted = redis.zunion(keys, withscores=True)
    else:
        counted = _bounded_counts(redis, prefix, keys, sizes, algorithm)
    if not counted:
        return []
    # Whole count groups, best first, until enough LIVE pages are in: filtering only
    # after picking the groups returned fewer roots than asked (none at all when the
    # best group held only removed pages) though lower groups had live matches. A
    # huge group is read in id order, MAX_MATCH_CANDIDATES at a time, and removed
    # pages are dropped before its cap, not after: the oldest ids, the ones the cap
    # keeps, are the likeliest to have been removed.
    found: list[tuple[int, str, int]] = []
    for group in _count_groups(counted):
        taken = 0
        for start in range(0, len(group), MAX_MATCH_CANDIDATES):
            chunk = group[start:start + MAX_MATCH_CANDIDATES]
            ids = [int(member) for member, _ in chunk]
            pipe = redis.pipeline(transaction=False)
            pipe.hmget(f"{prefix}page:url", ids)
            pipe.smismember(f"{prefix}page:removed", ids)
            urls_raw, removed = pipe.execute()
            live = [
                (page_id, url if isinstance(url, str) else url.decode(), int(count))
                for page_id, url, gone, (_, count) in zip(ids, urls_raw, removed, chunk,
                                                           strict=True)
                if url is not None and not gone
            ][: MAX_MATCH_CANDIDATES - taken]
            found.extend(live)
            taken += len(live)
            # The whole group (up to the cap) is ranked by PageRank below: stopping at
            # the first chunk that filled ``limit`` ranked only its lowest ids.
            if taken >= MAX_MATCH_CANDIDATES:
                break
        if len(found) >= limit:
            break
    if not found:
        return []
    scores = redis.zmscore(f"{prefix}scores:{algorithm}", [url for _, url, _ in found])
    matches = [
        TextMatch(page_id, url, count, float(score) if score is not None else 0.0)
        for (page_id, url, count), score in zip(found, scores, strict=True)
    ]
    matches.sort(key=lambda m: (-m.matched_terms, -m.pagerank, m.url))
    return matches[:limit]


def _bounded_counts(redis: Any, prefix: str, keys: list[str], sizes: list[int],
                    algorithm: str) -> list[tuple[bytes | str, float]]:
    """``(page id, matching terms)`` as ZUNION gives them, for the candidates a query
    of common terms can afford: every page of its smaller sets (smallest first, up to
    ``MAX_UNION / len(keys)`` pages in all) and the :data:`MAX_MATCH_CANDIDATES` pages
    best by PageRank, each counted against every term (SMISMEMBER). So at most about
    ``MAX_UNION + len(keys) * MAX_MATCH_CANDIDATES`` memberships are checked. Exact for
    the pages of the smaller sets; a page only in the larger ones is seen only if it
    is among the best by PageRank, which is how the rest are ranked anyway (a page
    added since the last publication has no score yet, so it is not among them).
    """
    budget = MAX_UNION // len(keys)
    pipe = redis.pipeline(transaction=False)
    for key, size in sorted(zip(keys, sizes, strict=True), key=lambda pair: pair[1]):
        if size > budget:
            break
        pipe.smembers(key)
        budget -= size
    members: set[bytes | str] = set().union(*pipe.execute())
    best = redis.zrevrange(f"{prefix}scores:{algorithm}", 0, MAX_MATCH_CANDIDATES - 1)
    if best:
        members.update(page for page in redis.hmget(f"{prefix}page:id", best)
                       if page is not None)
    candidates = list(members)
    counts = [0] * len(candidates)
    for start in range(0, len(candidates), MAX_MATCH_CANDIDATES):
        chunk = candidates[start:start + MAX_MATCH_CANDIDATES]
        pipe = redis.pipeline(transaction=False)
        for key in keys:
            pipe.smismember(key, chunk)
        for flags in pipe.execute():
            for i, flag in enumerate(flags, start=start):
                counts[i] += int(flag)
    return [(page, float(count)) for page, count in zip(candidates, counts, strict=True)
            if count]


def _count_groups(
    counted: list[tuple[bytes | str, float]],
) -> list[list[tuple[bytes | str, float]]]:
    """The matches grouped by how many terms they match, best group first.

    Only the pages that can make the cut need their PageRank looked up: every page
    with more matching terms than the limit's boundary group is in regardless. A
    group larger than :data:`MAX_MATCH_CANDIDATES` comes in id order (the caller
    keeps the lowest live ids).
    """
    by_count: defaultdict[float, list[tuple[bytes | str, float]]] = defaultdict(list)
    for item in counted:
        by_count[item[1]].append(item)
    groups = []
    for count in sorted(by_count, reverse=True):
        group = by_count[count]
        if len(group) > MAX_MATCH_CANDIDATES:
            group = sorted(group, key=lambda item: int(item[0]))
        groups.append(group)
    return groups
