"""The seed's partition mapping (kafscale.cluster.virtual): its properties, its constraints, the mapping file."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kafscale.cluster.virtual import (
    DEFAULT_OFFSET_RANGE,
    MIN_OFFSET_RANGE,
    TOPIC_CONFIG,
    MappingError,
    NewTopicLayout,
    OutOfRangeError,
    VirtualLayout,
    VirtualMapping,
    new_topic_layout,
)


@st.composite
def layouts(draw: st.DrawFn) -> VirtualLayout:
    physical = draw(st.integers(1, 64))
    ratio = draw(st.integers(1, 32))
    offset_range = draw(st.sampled_from([MIN_OFFSET_RANGE, 1 << 32, DEFAULT_OFFSET_RANGE]))
    return VirtualLayout(physical, physical * ratio, offset_range)


@st.composite
def layout_and_virtual(draw: st.DrawFn) -> tuple[VirtualLayout, int]:
    layout = draw(layouts())
    return layout, draw(st.integers(0, layout.virtual - 1))


def test_the_seeds_table_for_100_over_10() -> None:
    layout = VirtualLayout(10, 100)
    assert [layout.to_physical(v) for v in (0, 1, 5, 9, 10, 11, 50, 99)] == [
        (0, 0), (1, 0), (5, 0), (9, 0), (0, 1), (1, 1), (0, 5), (9, 9)]
    assert layout.lanes(0) == [0, 10, 20, 30, 40, 50, 60, 70, 80, 90]


def test_the_seeds_offset_example() -> None:
    layout = VirtualLayout(10, 100, 10**12)
    assert layout.encode_offset(0, 100) == (0, 100)
    assert layout.encode_offset(10, 0) == (0, 1_000_000_000_000)
    assert layout.encode_offset(50, 500) == (0, 5_000_000_000_500)
    assert layout.encode_offset(99, 0) == (9, 9_000_000_000_000)
    assert layout.decode_offset(0, 5_000_000_000_500) == (50, 500)


@settings(max_examples=300, deadline=None)
@given(layout_and_virtual())
def test_partition_round_trip(case: tuple[VirtualLayout, int]) -> None:
    layout, virtual = case
    physical, group = layout.to_physical(virtual)
    assert 0 <= physical < layout.physical and 0 <= group < layout.ratio
    assert layout.to_virtual(physical, group) == virtual
    assert virtual in layout.lanes(physical)


@settings(max_examples=300, deadline=None)
@given(layout_and_virtual(), st.data())
def test_offset_round_trip(case: tuple[VirtualLayout, int], data: st.DataObject) -> None:
    layout, virtual = case
    offset = data.draw(st.integers(0, layout.offset_range - 1))
    physical, physical_offset = layout.encode_offset(virtual, offset)
    assert physical == layout.to_physical(virtual)[0]
    assert layout.decode_offset(physical, physical_offset) == (virtual, offset)
    start, end = layout.offset_span(virtual)
    assert start <= physical_offset <= end


@settings(max_examples=200, deadline=None)
@given(layouts(), st.data())
def test_offset_ranges_of_one_physical_partition_are_disjoint(layout: VirtualLayout, data: st.DataObject) -> None:
    physical = data.draw(st.integers(0, layout.physical - 1))
    spans = sorted(layout.offset_span(v) for v in layout.lanes(physical))
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end < start
    assert spans[0][0] == 0 and spans[-1][1] == layout.ratio * layout.offset_range - 1  # and they tile the space


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_every_physical_partitions_lanes_cover_the_virtual_partitions_once(layout: VirtualLayout) -> None:
    seen = [v for p in range(layout.physical) for v in layout.lanes(p)]
    assert sorted(seen) == list(range(layout.virtual))


@settings(max_examples=200, deadline=None)
@given(layouts(), st.integers(-5, 5))
def test_out_of_range_partitions_and_offsets_are_refused(layout: VirtualLayout, beyond: int) -> None:
    assume(beyond != 0)
    virtual = layout.virtual - 1 + beyond if beyond > 0 else beyond
    with pytest.raises(OutOfRangeError, match="virtual partition"):
        layout.to_physical(virtual)
    with pytest.raises(OutOfRangeError, match="offset"):
        layout.encode_offset(0, layout.offset_range - 1 + abs(beyond))
    with pytest.raises(OutOfRangeError, match="offset"):
        layout.encode_offset(0, -abs(beyond))
    with pytest.raises(OutOfRangeError, match="physical partition"):
        layout.lanes(layout.physical - 1 + abs(beyond))


@pytest.mark.parametrize(("physical", "virtual", "offset_range", "message"), [
    (0, 10, DEFAULT_OFFSET_RANGE, "physical partitions must be"),
    (10, 5, DEFAULT_OFFSET_RANGE, "at least the physical 10"),
    (10, 25, DEFAULT_OFFSET_RANGE, r"virtual partitions \(25\) must be a multiple of physical partitions \(10\)"),
    (10, 100, MIN_OFFSET_RANGE - 1, "offset range must be at least 2\\^20"),
])
def test_the_seeds_constraints(physical: int, virtual: int, offset_range: int, message: str) -> None:
    with pytest.raises(MappingError, match=message):
        VirtualLayout(physical, virtual, offset_range)


MAPPING = """
mapping:
  virtual_partitions: 100
  physical_partitions: 10
  topics:
    high-volume-events:
      virtual_partitions: 1000
      physical_partitions: 100
    "metrics.*":
      virtual_partitions: 50
      physical_partitions: 5
      offset_range: 1048576
"""


def test_a_mapping_file_picks_exact_then_pattern_then_default(tmp_path: Path) -> None:
    path = tmp_path / "mapping.yaml"
    path.write_text(MAPPING)
    mapping = VirtualMapping.load(path)
    assert mapping.layout_for("high-volume-events") == VirtualLayout(100, 1000)
    assert mapping.layout_for("metrics-eu") == VirtualLayout(5, 50, MIN_OFFSET_RANGE)
    assert mapping.layout_for("app-metrics") == VirtualLayout(10, 100)  # a pattern matches whole names only
    assert mapping.layout_for("orders") == VirtualLayout(10, 100)


def test_without_a_default_unnamed_topics_stay_plain() -> None:
    mapping = VirtualMapping.parse({"mapping": {"topics": {"orders": {"virtual_partitions": 8,
                                                                      "physical_partitions": 2}}}})
    assert mapping.layout_for("orders") == VirtualLayout(2, 8)
    assert mapping.layout_for("other") is None


@pytest.mark.parametrize(("text", "message"), [
    ("mapping:\n  topics:\n    orders: {virtual_partitions: 25, physical_partitions: 10}\n",
     r"topic 'orders': virtual partitions \(25\) must be a multiple"),
    ("mapping:\n  topics:\n    orders: {virtual_partitions: 20}\n", "topic 'orders': physical_partitions missing"),
    ("mapping:\n  virtual_partitions: 10\n  physical_partitions: 20\n", "the default: virtual partitions must be"),
    ("mapping:\n  topics:\n    'bad[': {virtual_partitions: 2, physical_partitions: 1}\n",
     "topic 'bad\\[' is neither a name nor a valid pattern"),
    ("mapping:\n  topics:\n    orders: {virtual_partitions: '20', physical_partitions: 10}\n",
     "must be an integer"),
    ("mapping:\n  topics:\n    orders: {virtual_partitions: 20, physical_partitions: 10, ratio: 2}\n",
     "unknown field"),
    ("topics: {}\n", "one top-level key, 'mapping'"),
    ("mapping: [\n", "is not YAML"),
])
def test_a_bad_mapping_file_is_refused_naming_the_entry(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "mapping.yaml"
    path.write_text(text)
    with pytest.raises(MappingError, match=message) as e:
        VirtualMapping.load(path)
    assert str(path) in str(e.value)


def test_a_missing_mapping_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MappingError, match="cannot read virtual partition mapping"):
        VirtualMapping.load(tmp_path / "absent.yaml")


NAMED_AND_DEFAULT = VirtualMapping.parse({"mapping": {
    "virtual_partitions": 20, "physical_partitions": 4,
    "topics": {"orders": {"virtual_partitions": 12, "physical_partitions": 3}}}})


@pytest.mark.parametrize(("name", "requested", "configs", "expected"), [
    # an explicit config: the count asked for (or the broker's default) is physical; the value is normalised
    ("any", 2, {TOPIC_CONFIG: "08"}, NewTopicLayout(8, 2, {TOPIC_CONFIG: "8"})),
    ("any", None, {TOPIC_CONFIG: "5"}, NewTopicLayout(5, 5, {TOPIC_CONFIG: "5"})),  # V == P: still fixed
    ("orders", 2, {TOPIC_CONFIG: "6"}, NewTopicLayout(6, 2, {TOPIC_CONFIG: "6"})),  # it wins over the file
    # an entry naming the topic: no count, or either of its counts
    ("orders", None, {}, NewTopicLayout(12, 3, {TOPIC_CONFIG: "12"})),
    ("orders", 3, {"retention.ms": "1"}, NewTopicLayout(12, 3, {"retention.ms": "1", TOPIC_CONFIG: "12"})),
    ("orders", 12, {}, NewTopicLayout(12, 3, {TOPIC_CONFIG: "12"})),
    # the default: no count or one of its counts; any other count asked for is a plain topic
    ("other", None, {}, NewTopicLayout(20, 4, {TOPIC_CONFIG: "20"})),
    ("other", 4, {}, NewTopicLayout(20, 4, {TOPIC_CONFIG: "20"})),
    ("other", 7, {}, NewTopicLayout(7, 0, {})),
])
def test_a_new_topics_layout(name: str, requested: int | None, configs: dict[str, str],
                             expected: NewTopicLayout) -> None:
    assert new_topic_layout(name, requested, 5, configs, NAMED_AND_DEFAULT) == expected


def test_a_new_topics_layout_without_a_mapping_is_plain() -> None:
    assert new_topic_layout("t", None, 3, {}, None) == NewTopicLayout(3, 0, {})
    assert new_topic_layout("t", 6, 3, {}, None) == NewTopicLayout(6, 0, {})


def test_a_count_an_entry_contradicts_is_refused_naming_it() -> None:
    with pytest.raises(OutOfRangeError, match="gives topic 'orders' 12 partitions over 3 physical"):
        new_topic_layout("orders", 5, 1, {}, NAMED_AND_DEFAULT)
    with pytest.raises(MappingError, match="expected an integer"):
        new_topic_layout("t", 2, 1, {TOPIC_CONFIG: "many"}, None)
    with pytest.raises(MappingError, match="must be a multiple"):
        new_topic_layout("t", 4, 1, {TOPIC_CONFIG: "10"}, None)
    with pytest.raises(MappingError, match="virtual partitions must be"):
        new_topic_layout("t", 10, 1, {TOPIC_CONFIG: str(10 * 20_000)}, None)  # beyond a topic's partition limit


def test_a_mapping_whose_offset_ranges_overflow_64_bits_is_refused() -> None:
    with pytest.raises(MappingError, match="do not fit a 64-bit offset"):
        VirtualLayout(1, 100_000, 1 << 50)
    with pytest.raises(MappingError, match=r"mapping\.offset_range must be at least"):
        VirtualMapping.parse({"mapping": {"offset_range": 5}})
