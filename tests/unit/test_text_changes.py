"""AnchorChanges: which stored anchors a batch replaces or drops (rankstream/text_changes.py).

The end-to-end check, through the script in a real Redis, is
tests/integration/test_text_postings.py; these pin each rule on its own.
"""

from __future__ import annotations

from rankstream.text_changes import AnchorChanges, TextChanges

STORED_IN_LINKS = {7: [1, 2], 8: []}


def changes() -> AnchorChanges:
    return AnchorChanges(lambda page: STORED_IN_LINKS.get(page, []))


def test_a_page_event_replaces_the_sources_anchors() -> None:
    tracker = changes()
    tracker.page(1, {7: "seven", 8: "eight"})
    tracker.page(1, {8: "later"})
    assert tracker.result() == TextChanges(replaced={1: {8: "later"}})


def test_link_removed_drops_a_stored_anchor_or_one_set_in_the_batch() -> None:
    tracker = changes()
    tracker.unlink(1, 7)
    tracker.page(2, {7: "x", 8: "y"})
    tracker.unlink(2, 7)
    assert tracker.result() == TextChanges(replaced={2: {8: "y"}}, dropped={1: {7}})


def test_a_page_event_after_a_drop_supersedes_it() -> None:
    tracker = changes()
    tracker.unlink(1, 7)
    tracker.page(1, {7: "back"})
    assert tracker.result() == TextChanges(replaced={1: {7: "back"}})


def test_a_removal_drops_the_pages_own_anchors_and_those_into_it() -> None:
    tracker = changes()
    tracker.page(3, {7: "from a page of this batch", 8: "kept"})
    tracker.remove_page(7)
    assert tracker.result() == TextChanges(
        replaced={3: {8: "kept"}, 7: {}}, dropped={1: {7}, 2: {7}})


def test_anchors_set_after_a_removal_stay() -> None:
    tracker = changes()
    tracker.remove_page(8)
    tracker.page(3, {8: "revives it"})
    assert tracker.result() == TextChanges(replaced={8: {}, 3: {8: "revives it"}})


def test_nothing_changed_is_falsy() -> None:
    assert not changes().result()
    tracker = changes()
    tracker.page(1, {})
    assert tracker.result()
