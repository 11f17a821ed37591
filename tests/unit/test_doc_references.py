"""The public references in docs/ held to the code, both ways, so a renamed or new key,
field or event field cannot land without the doc saying so.

* docs/redis-keys.md: its table names exactly the keys the code builds, and its lists
  of ``P meta:{alg}`` and ``P status`` fields exactly the fields the consumer writes;
* the README's key reference, a summary: every key it names is one the code builds;
* docs/events.md: its table of event types names exactly each model's input fields,
  the optional ones (marked ``?``) exactly those with a default.
"""

from __future__ import annotations

import re
from pathlib import Path

from consumer.hits_query import _cache_key
from consumer.keys import Keys
from consumer.publication import meta_fields
from consumer.score_publisher import ScorePublisher, filled_marker
from consumer.stats import ConsumerStats
from consumer.text_index import term_key
from consumer.text_postings import termcount_key
from producer.schema import LinkAddedEvent, LinkRemovedEvent, PageEvent, PageRemovedEvent

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = DOCS / "redis-keys.md"
P = "P "  # the doc writes the prefix as "P "


def documented_keys() -> set[str]:
    """The first column of the key table: `P page:id`, `P out:{id}`..."""
    rows = re.findall(r"^\| `(P [^`]+)` \|", DOC.read_text(), flags=re.MULTILINE)
    assert rows, f"no key table found in {DOC}"
    return set(rows)


def built_keys() -> set[str]:
    """Every key the code builds, with the doc's placeholders for the variable parts."""
    keys = Keys(P)
    properties = {getattr(keys, name) for name, value in vars(Keys).items()
                  if isinstance(value, property) and not name.endswith("_head")}
    publisher = ScorePublisher(None, keys, damping=0.85, tolerance=1e-6,  # type: ignore[arg-type]
                               publish_threshold=0.0, owner="{owner}")
    back = publisher.back_key("{alg}")
    digest = re.sub(r"[0-9a-f]{32}$", "{digest}", _cache_key(P, {}, (0, "")))
    return properties | {
        keys.out_links("{id}"), keys.in_links("{id}"),  # type: ignore[arg-type]
        keys.scores("{alg}"), keys.meta("{alg}"), back, filled_marker(back),
        term_key(P, "{term}"), termcount_key(P, "{term}"), digest,
    }


def test_the_key_reference_names_exactly_the_keys_the_code_builds() -> None:
    documented, built = documented_keys(), built_keys()
    assert built - documented == set(), "keys the code builds that the doc leaves out"
    assert documented - built == set(), "keys the doc names that the code never builds"


def test_the_readme_names_only_keys_the_code_builds() -> None:
    readme = (DOCS.parent / "README.md").read_text()
    rows = re.findall(r"^\| (`rs:.+?) \| [A-Z]", readme, flags=re.MULTILINE)
    named = {re.sub(r"^rs:", P, key).replace("{pagerank,wpr}", "{alg}")
             for row in rows for key in re.findall(r"`(rs:[^`]+)`", row)}
    assert len(named) >= 15, "the README's key table was not found whole"
    assert named - built_keys() == set()


def listed_fields(heading: str) -> set[str]:
    """The backquoted names of the doc's paragraph starting ``heading``: the field
    names, each followed by what it holds in parentheses (values quoted there are
    left out). The paragraph ends at its first blank line or at its first sentence
    after the list."""
    text = DOC.read_text()
    start = text.index(heading) + len(heading)
    paragraph = text[start:text.index("\n\n", start)].split(".\n", 1)[0]
    while (bare := re.sub(r"\([^()]*\)", "", paragraph)) != paragraph:
        paragraph = bare  # innermost parentheses first: they nest
    return set(re.findall(r"`([a-z_]+)`", paragraph))


def test_the_meta_fields_listed_are_exactly_those_a_publication_writes() -> None:
    listed = listed_fields("`P meta:{alg}` fields:")
    written = set(meta_fields(total=1.0, bound=0.0, tolerance=1e-6, fresh=True, version=1,
                              refreshed_at="", offsets={}, damping=0.85, pages=1,
                              mode="cold"))
    assert listed == written


def test_the_status_fields_listed_are_exactly_those_the_consumer_writes() -> None:
    listed = listed_fields("`P status` fields:")
    assert listed == set(ConsumerStats().status_fields(topic="t", counters=None))


MODELS = {"page": PageEvent, "link_added": LinkAddedEvent, "link_removed": LinkRemovedEvent,
          "page_removed": PageRemovedEvent}
INTERNAL = {"type", "anchors"}  # the discriminator; anchors are derived from ``links``


def test_the_event_table_lists_each_types_fields_and_which_are_optional() -> None:
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (`[^|]+) \|", (DOCS / "events.md").read_text(),
                           flags=re.MULTILINE))
    assert set(MODELS) <= set(rows), "an event type missing from docs/events.md"
    for kind, model in MODELS.items():
        listed = dict(re.findall(r"`([a-z_]+)`(\??)", rows[kind]))
        fields = {name: info for name, info in model.model_fields.items()
                  if name not in INTERNAL}
        assert set(listed) == set(fields), kind
        optional = {name for name, mark in listed.items() if mark}
        assert optional == {name for name, info in fields.items()
                            if not info.is_required()}, kind
