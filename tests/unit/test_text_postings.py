"""The term index script's input (consumer/text_postings.py); the script itself runs
against a real Redis in tests/integration/test_text_postings.py."""

from __future__ import annotations

from consumer.keys import Keys
from consumer.text_postings import POSTINGS_SCRIPT, index_commands, postings_command
from rankstream.text_changes import TextChanges

KEYS = Keys("P:")


def test_a_sources_lines_are_canonical_so_an_unchanged_recrawl_matches_what_is_stored() -> None:
    changes = TextChanges(replaced={4: {12: "Zeta alpha", 3: "the Beta", 9: "the"}})
    command = postings_command(KEYS, {4: "Über Title"}, changes)
    assert command == ("EVAL", POSTINGS_SCRIPT, 0, "P:", "P:page:terms",
                       "R 4 0\nt title über\n3 beta\n12 alpha zeta")  # one argument a source
    reordered = TextChanges(replaced={4: {9: "the", 12: "alpha Zeta", 3: "Beta"}})
    assert postings_command(KEYS, {4: "Über Title"}, reordered) == command


def test_a_page_event_without_title_keeps_the_stored_one_and_drops_are_listed() -> None:
    changes = TextChanges(replaced={4: {}, 7: {2: "x"}}, dropped={5: {8, 6, 5}})
    command = postings_command(KEYS, {}, changes)
    assert command is not None and command[5:] == ("R 4 1", "R 7 1\n2 x", "D 5 6 8")


def test_no_change_no_command() -> None:
    assert index_commands(None, KEYS, {}, TextChanges()) == []
    assert index_commands(None, KEYS, {}, TextChanges(), scripted=False) == []
