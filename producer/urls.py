"""URL canonicalisation: the ONE place that decides when two URLs name the same page.

Rules, applied to absolute URLs only (a crawler resolves relative hrefs first):

1. the scheme is lower-cased (``HTTP:`` -> ``http:``);
2. the host is lower-cased (userinfo, path and query are not);
3. the fragment (``#...``) is dropped: it never names a different document;
4. the port is written as a number (``:0080`` -> ``:80``) and dropped when it is the
   scheme's default (80 for http, 443 for https), and so is an empty port
   (``http://h:/`` -> ``http://h/``);
5. an empty http(s) path becomes ``/`` (RFC 3986 section 6.2.3: ``https://a.org`` and
   ``https://a.org/`` are the same request target, so they must be the same page).

Everything else is kept byte for byte: path, query, percent-encoding (``%2f`` stays
``%2f``), the order of query parameters, dot segments, spaces, quotes and unicode. That
is deliberate: a URL with unusual but valid characters must round-trip unchanged
through Redis keys and the HTTP API, and readers must be able to look a page up by
the URL they saw, so we never re-encode.

Why not a library: we evaluated url-normalize 3.1, w3lib 2.5, yarl 1.25 and rfc3986
2.0 on these rules. All four do more than we want: they percent-encode spaces, quotes
and unicode in the path and query, upper-case percent escapes, remove dot segments
and IDNA-encode hosts; w3lib also sorts query parameters and keeps default ports, and
rfc3986 mangled a unicode host. ``urllib.parse.urlsplit`` itself silently deletes tabs
and newlines and strips leading control characters, and ``urlunsplit`` drops an empty
``?``. So we locate the authority with ``str.partition`` and rebuild only the pieces
we change, which keeps every other character exactly where it was.

IDNA: hosts are NOT converted to or from punycode. ``https://Bücher.de/`` becomes
``https://bücher.de/`` (lower-cased, still unicode) and stays distinct from
``https://xn--bcher-kva.de/``. Converting would break round-tripping of the URL a
crawler reported, and IDNA2003/2008/UTS46 disagree on edge cases; crawlers that want
one form should send it.

Rejected (:class:`UrlError`): non-strings, empty strings, control characters (C0 and
DEL, including tab and newline), leading or trailing spaces, lone surrogates, a
missing or malformed scheme, nothing after the scheme (``file:``, ``file://``), a
missing host for http(s), whitespace in the authority,
and a malformed or out-of-range port. Length and scheme allow-lists are limits, not
canonicalisation; :mod:`producer.schema` applies them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

__all__ = [
    "DEFAULT_PORTS",
    "UrlError",
    "already_canonical_lines_matcher",
    "canonicalize_url",
    "url_scheme",
]

DEFAULT_PORTS: dict[str, str] = {"http": "80", "https": "443"}
_SCHEMES_NEEDING_HOST = frozenset({"http", "https"})

# RFC 3986: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), followed by ":".
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_WHITESPACE_RE = re.compile(r"\s")
_CACHE_SIZE = 1 << 17
# The cache counts entries, not bytes: 131k URLs of 8k characters (each kept twice,
# up to 4 bytes a character) would pin gigabytes, and rejected events fill it too.
# Longer URLs are rare and canonicalised each time.
_CACHE_MAX_URL = 256


class UrlError(ValueError):
    """A string that is not an absolute URL we accept; the message is the reason."""


def canonicalize_url(url: str) -> str:
    """Return the canonical form of ``url`` (see the module docstring for the rules).

    Idempotent: ``canonicalize_url(canonicalize_url(u)) == canonicalize_url(u)``.
    Results are cached, so repeated URLs (link targets recur a lot) cost a dict lookup.

    >>> canonicalize_url("HTTPS://Docs.Python.org:443/3/a%2fb?q=x y#frag")
    'https://docs.python.org/3/a%2fb?q=x y'
    """
    if type(url) is not str:
        raise UrlError(f"expected a string, got {type(url).__name__}")
    return _canonicalize_cached(url)


def url_scheme(canonical_url: str) -> str:
    """The scheme of an already canonical URL (cheap: a partition, no parsing)."""
    return canonical_url.partition(":")[0]


# Most URLs crawlers send are already canonical: printable ASCII without '#' or
# spaces, a lower-case host without port or userinfo, and a path. One regex match
# proves that and lets them skip the parser (and the cache) entirely.
_ALREADY_CANONICAL = re.compile(
    r"(?:https?://[a-z0-9.\-]+|file://[a-z0-9.\-]*)/[\x21\x22\x24-\x7e]*"
).fullmatch


def already_canonical_lines_matcher(schemes: frozenset[str]) -> Callable[[str], object]:
    """A matcher for newline-joined URLs that are all already canonical.

    ``matcher("\\n".join(urls))`` is not None only if every URL would come out of
    :func:`canonicalize_url` unchanged and has one of ``schemes``. Used by the decoder
    to vet a page's whole link list with one regex; a None result means "look at each
    URL", not "invalid".
    """
    alternatives = []
    if "http" in schemes:
        alternatives.append(r"http://[a-z0-9.\-]+")
    if "https" in schemes:
        alternatives.append(r"https://[a-z0-9.\-]+")
    if "file" in schemes:
        alternatives.append(r"file://[a-z0-9.\-]*")
    if not alternatives:
        return lambda _joined: None
    one = rf"(?:{'|'.join(alternatives)})/[\x21\x22\x24-\x7e]*"
    return re.compile(rf"{one}(?:\n{one})*").fullmatch


def _canonicalize_cached(url: str) -> str:
    if _ALREADY_CANONICAL(url) is not None:
        return url
    if len(url) > _CACHE_MAX_URL:
        return _canonicalize(url)
    return _canonicalize_slow(url)


@lru_cache(maxsize=_CACHE_SIZE)
def _canonicalize_slow(url: str) -> str:
    return _canonicalize(url)


def _canonicalize(url: str) -> str:
    if not url:
        raise UrlError("empty")
    if _CONTROL_RE.search(url):
        raise UrlError("control character")
    if url[0].isspace() or url[-1].isspace():
        raise UrlError("leading or trailing whitespace")
    if not url.isascii():
        _reject_surrogates(url)

    match = _SCHEME_RE.match(url)
    if match is None:
        raise UrlError("no scheme (absolute URL required)")
    scheme = url[: match.end() - 1].lower()
    rest = url[match.end() :]
    rest = rest.partition("#")[0]
    if rest[-1:].isspace():  # "http://h/ #top": what is left must not end in a space either
        raise UrlError("leading or trailing whitespace")

    if not rest or rest == "//":
        # "file:", "file://" or "mailto:#x" would each be a page that names nothing.
        raise UrlError("nothing after the scheme")
    if not rest.startswith("//"):
        # No authority (mailto:, urn:, file:/x). http(s) always has one.
        if scheme in _SCHEMES_NEEDING_HOST:
            raise UrlError("missing host")
        return f"{scheme}:{rest}"

    after_slashes = rest[2:]
    authority_end = _authority_end(after_slashes)
    authority = after_slashes[:authority_end]
    path_and_query = after_slashes[authority_end:]
    authority = _canonical_authority(scheme, authority)
    if not authority and not path_and_query:
        # "file://:" (an empty port dropped): "file://" again, which names nothing.
        raise UrlError("nothing after the scheme")
    if not path_and_query and scheme in _SCHEMES_NEEDING_HOST:
        path_and_query = "/"
    elif path_and_query.startswith("?") and scheme in _SCHEMES_NEEDING_HOST:
        path_and_query = "/" + path_and_query
    return f"{scheme}://{authority}{path_and_query}"


def _authority_end(after_slashes: str) -> int:
    """Index where the authority ends: the first '/' or '?' (the fragment is gone)."""
    end = len(after_slashes)
    for delimiter in "/?":
        index = after_slashes.find(delimiter)
        if 0 <= index < end:
            end = index
    return end


def _canonical_authority(scheme: str, authority: str) -> str:
    if _WHITESPACE_RE.search(authority):
        raise UrlError("whitespace in host")
    userinfo, at, hostport = authority.rpartition("@")
    host, port = _split_host_port(hostport)
    if not host and scheme in _SCHEMES_NEEDING_HOST:
        raise UrlError("missing host")
    if port:
        if not port.isdigit() or not port.isascii():
            raise UrlError(f"invalid port: {port[:20]!r}")
        # Leading zeros off and length first: int() refuses more than 4300 digits with a
        # ValueError.
        digits = port.lstrip("0") or "0"
        if len(digits) > 5 or int(digits) > 65535:
            raise UrlError(f"port out of range: {port[:20]}")
        number = int(digits)
        # As a number: "0080" is port 80, and must not make a second page of it.
        port = "" if str(number) == DEFAULT_PORTS.get(scheme) else str(number)
    host = host.lower()
    return f"{userinfo}{at}{host}:{port}" if port else f"{userinfo}{at}{host}"


def _split_host_port(hostport: str) -> tuple[str, str]:
    """Split ``host[:port]``; an IPv6 literal keeps its brackets and inner colons."""
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            raise UrlError("unterminated IPv6 host")
        host, tail = hostport[: close + 1], hostport[close + 1 :]
        if tail and not tail.startswith(":"):
            raise UrlError("junk after IPv6 host")
        return host, tail[1:]
    host, _, port = hostport.partition(":")
    if ":" in port:
        raise UrlError("invalid port: too many colons")
    return host, port


def _reject_surrogates(url: str) -> None:
    # json.loads turns a "\ud800" escape into a lone surrogate, which no UTF-8 sink
    # (Redis, Kafka, HTTP) can store: reject it here rather than crash downstream.
    try:
        url.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UrlError("invalid unicode (lone surrogate)") from exc
