"""The text index's pure parts: tokenising, query normal form, and the commands queued.

Matching against Redis is covered by tests/integration/test_hits_query.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.text_index import (
    MAX_QUERY_TERMS,
    MAX_TERM_CHARS,
    MAX_TERMS_PER_TEXT,
    STOP_WORDS,
    index_page_text,
    index_text,
    query_terms,
    term_key,
    term_line,
    tokenize,
)
from rankstream.errors import InputError


class QueuedCommands:
    """Stands in for a redis-py pipeline: records what would be queued, sends nothing."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def sadd(self, key: str, *members: int) -> None:
        self.commands.append(("SADD", key, *members))


def test_tokenize_lower_cases_splits_and_drops_stop_words() -> None:
    assert tokenize("The Python Tutorial: the __init__ method") == [
        "python", "tutorial", "init", "method"]
    assert tokenize("Click HERE for more") == []
    assert tokenize("os.path.join() — 3.11") == ["os", "path", "join", "3", "11"]


def test_tokenize_handles_unicode_case_and_compatibility_forms() -> None:
    assert tokenize("STRASSE Straße ﬁle Ｐｙｔｈｏｎ") == ["strasse", "file", "python"]
    assert tokenize("Bücher über ÜBER") == ["bücher", "über"]


def test_tokenize_keeps_combining_marks_inside_words() -> None:
    """Many scripts write vowels and diacritics as combining marks: splitting at them
    turned "हिन्दी" into its consonants, and "İSTANBUL" into "stanbul"."""
    assert tokenize("हिन्दी भाषा") == ["हिन्दी", "भाषा"]
    assert tokenize("İSTANBUL guide") == tokenize("istanbul guide") == ["istanbul", "guide"]
    assert tokenize("ǰava x\u0301y") == ["ǰava", "x\u0301y"]
    assert tokenize("\u0301abc") == ["abc"]  # a mark does not start a word


@given(st.text())
def test_a_term_tokenizes_to_itself(text: str) -> None:
    """A query that repeats a term must find it: 'İ' + a combining acute gave a term
    that normalised again into another."""
    for term in tokenize(text):
        assert tokenize(term) == [term]


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_ascii_text_takes_a_shortcut_to_the_same_words(text: str) -> None:
    """ASCII skips NFKC, case folding and the mark-aware regex; the words must match."""
    from consumer.text_index import _WORD_RE, _normal_form, _words

    assert _words(text) == _WORD_RE.findall(_normal_form(text))


@given(st.one_of(st.text(), st.text(min_size=250, max_size=400)))
def test_a_term_line_is_the_sorted_terms(text: str) -> None:
    """term_line (what the term index stores; its own cache) against tokenize."""
    assert term_line(text) == " ".join(sorted(tokenize(text)))
    assert term_line(text * 3) == " ".join(sorted(tokenize(text * 3)))  # past the cache


def test_the_mark_class_covers_every_combining_mark() -> None:
    import sys
    import unicodedata

    from consumer.text_index import _WORD_RE

    for code in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code)).startswith("M"):
            assert _WORD_RE.fullmatch("a" + chr(code)), hex(code)


def test_tokenize_bounds_terms() -> None:
    assert tokenize("x" * (MAX_TERM_CHARS + 1) + " ok") == ["ok"]
    many = " ".join(f"w{i}" for i in range(100))
    assert len(tokenize(many)) == MAX_TERMS_PER_TEXT


@given(st.text())
def test_tokens_are_lower_case_non_stop_words(text: str) -> None:
    terms = tokenize(text)
    assert len(terms) == len(set(terms)) <= MAX_TERMS_PER_TEXT
    for term in terms:
        assert term and term not in STOP_WORDS and term == term.casefold()
        assert ":" not in term and " " not in term and "_" not in term


def test_query_terms_are_sorted_and_distinct() -> None:
    assert query_terms("Tutorial the PYTHON tutorial") == ["python", "tutorial"]
    assert query_terms("tutorial python") == query_terms("Python, TUTORIAL!")


@pytest.mark.parametrize("query", ["", "   ", "the and of", "!!!"])
def test_query_without_terms_is_an_input_error(query: str) -> None:
    with pytest.raises(InputError, match="no searchable terms"):
        query_terms(query)


def test_query_with_too_many_terms_is_an_input_error() -> None:
    with pytest.raises(InputError, match="distinct terms"):
        query_terms(" ".join(f"t{i}" for i in range(MAX_QUERY_TERMS + 1)))


def test_index_text_groups_postings_by_term() -> None:
    pipe = QueuedCommands()
    count = index_text(
        pipe,
        "P:",
        {1: "Python tutorial", 2: "Python"},
        [(7, 3, "the Python docs"), (8, 3, "docs"), (9, 4, ""), (9, 5, "click here")],
    )
    queued = {cmd[1]: set(cmd[2:]) for cmd in pipe.commands}
    assert queued == {
        "P:term:python": {1, 2, 3},
        "P:term:tutorial": {1},
        "P:term:docs": {3},
    }
    assert count == len(pipe.commands) == 3


def test_index_page_text_indexes_title_and_anchors_for_one_page() -> None:
    pipe = QueuedCommands()
    index_page_text(pipe, "P:", 5, "Über uns", ["mehr über", "kontakt"])
    assert {cmd[1]: cmd[2:] for cmd in pipe.commands} == {
        term_key("P:", "über"): (5,), term_key("P:", "uns"): (5,),
        term_key("P:", "mehr"): (5,), term_key("P:", "kontakt"): (5,),
    }
    empty = QueuedCommands()
    assert index_page_text(empty, "P:", 5) == 0 and empty.commands == []
