"""Virtual partitions (seed 002): clients see V partitions of a topic, the store keeps P.

Virtual partition v lives in physical partition `v % P`, as its group `v // P`; so the physical partition p
carries the virtual partitions p, p + P, p + 2P, ... The seed also gives each group its own range of R
offsets inside the physical partition's offset space (`group * R + offset`): `encode_offset` and
`decode_offset` are that encoding, for a proxy in front of a broker that knows nothing of the mapping.

Which topics are virtual, and how, comes from a mapping file in the seed's YAML:

    mapping:
      virtual_partitions: 100       # the default, for every topic no entry names (optional)
      physical_partitions: 10
      offset_range: 1099511627776   # R, optional: 2^40 unless given
      topics:
        orders:                     # an exact name first,
          virtual_partitions: 1000
          physical_partitions: 100
        "metrics.*":                # then each entry as a regular expression, in file order
          virtual_partitions: 50
          physical_partitions: 5

A pattern must match the whole name (`metrics.*` takes `metrics-eu`, not `app-metrics`): the seed's Rust
`is_match` would take any name containing a match, which makes an entry apply to topics nobody meant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_OFFSET_RANGE = 1 << 40
MIN_OFFSET_RANGE = 1 << 20
MAX_PARTITIONS = 100_000  # partitions a topic may have (CreateTopics refuses more), virtual ones included


class MappingError(ValueError):
    """A mapping (file, entry or topic config) that breaks the seed's constraints; the message names it."""


class OutOfRangeError(ValueError):
    """A partition or offset outside the mapping: UNKNOWN_TOPIC_OR_PARTITION or OFFSET_OUT_OF_RANGE to a client."""


@dataclass(frozen=True, slots=True)
class VirtualLayout:
    physical: int  # P
    virtual: int  # V
    offset_range: int = DEFAULT_OFFSET_RANGE  # R

    def __post_init__(self) -> None:
        problem = layout_problem(self.physical, self.virtual, self.offset_range)
        if problem:
            raise MappingError(problem)

    @property
    def ratio(self) -> int:
        """C: how many virtual partitions share one physical partition."""
        return self.virtual // self.physical

    def to_physical(self, virtual: int) -> tuple[int, int]:
        """(physical partition, group) of a virtual partition."""
        self._check_virtual(virtual)
        return virtual % self.physical, virtual // self.physical

    def to_virtual(self, physical: int, group: int) -> int:
        self._check_physical(physical)
        if not 0 <= group < self.ratio:
            raise OutOfRangeError(f"group {group} outside 0..{self.ratio - 1}")
        return physical + group * self.physical

    def lanes(self, physical: int) -> list[int]:
        """The virtual partitions that physical partition `physical` carries, by group."""
        self._check_physical(physical)
        return [physical + g * self.physical for g in range(self.ratio)]

    def encode_offset(self, virtual: int, offset: int) -> tuple[int, int]:
        """(physical partition, physical offset) of a virtual partition's offset, in the seed's encoding."""
        physical, group = self.to_physical(virtual)
        if not 0 <= offset < self.offset_range:
            raise OutOfRangeError(f"offset {offset} of virtual partition {virtual} outside 0..{self.offset_range - 1}")
        return physical, group * self.offset_range + offset

    def decode_offset(self, physical: int, offset: int) -> tuple[int, int]:
        """(virtual partition, virtual offset) of a physical partition's offset, in the seed's encoding."""
        self._check_physical(physical)
        if not 0 <= offset < self.ratio * self.offset_range:
            raise OutOfRangeError(f"offset {offset} of physical partition {physical} outside the mapping's "
                                  f"{self.ratio} ranges of {self.offset_range}")
        group, within = divmod(offset, self.offset_range)
        return physical + group * self.physical, within

    def offset_span(self, virtual: int) -> tuple[int, int]:
        """The first and last physical offset of a virtual partition's range."""
        _, group = self.to_physical(virtual)
        return group * self.offset_range, (group + 1) * self.offset_range - 1

    def _check_virtual(self, virtual: int) -> None:
        if not 0 <= virtual < self.virtual:
            raise OutOfRangeError(f"virtual partition {virtual} outside 0..{self.virtual - 1}")

    def _check_physical(self, physical: int) -> None:
        if not 0 <= physical < self.physical:
            raise OutOfRangeError(f"physical partition {physical} outside 0..{self.physical - 1}")


def layout_problem(physical: int, virtual: int, offset_range: int = DEFAULT_OFFSET_RANGE) -> str | None:
    """What breaks the seed's constraints (P >= 1, V >= P, V % P == 0, R >= 2^20), or None."""
    if not 1 <= physical <= MAX_PARTITIONS:
        return f"physical partitions must be 1..{MAX_PARTITIONS}, got {physical}"
    if not physical <= virtual <= MAX_PARTITIONS:
        return (f"virtual partitions must be {physical}..{MAX_PARTITIONS} (at least the physical {physical}), "
                f"got {virtual}")
    if virtual % physical:
        return f"virtual partitions ({virtual}) must be a multiple of physical partitions ({physical})"
    if offset_range < MIN_OFFSET_RANGE:
        return f"offset range must be at least 2^20 ({MIN_OFFSET_RANGE}), got {offset_range}"
    if virtual // physical * offset_range > 2**63:
        return f"{virtual // physical} offset ranges of {offset_range} do not fit a 64-bit offset"
    return None


@dataclass(frozen=True, slots=True)
class VirtualMapping:
    """Which layout each topic gets: an exact entry, else the first pattern matching the whole name, else the
    default (None: topics no entry names stay plain)."""

    default: VirtualLayout | None = None
    exact: tuple[tuple[str, VirtualLayout], ...] = ()
    patterns: tuple[tuple[re.Pattern[str], VirtualLayout], ...] = ()

    def layout_for(self, topic: str) -> VirtualLayout | None:
        return self.named(topic) or self.default

    def named(self, topic: str) -> VirtualLayout | None:
        """The layout of the entry naming the topic, exactly or by pattern (the default names none)."""
        for name, layout in self.exact:
            if name == topic:
                return layout
        for pattern, layout in self.patterns:
            if pattern.fullmatch(topic):
                return layout
        return None

    @classmethod
    def load(cls, path: str | Path) -> VirtualMapping:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise MappingError(f"cannot read virtual partition mapping {path}: {e}") from e
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise MappingError(f"virtual partition mapping {path} is not YAML: {e}") from e
        try:
            return cls.parse(doc)
        except MappingError as e:
            raise MappingError(f"virtual partition mapping {path}: {e}") from e

    @classmethod
    def parse(cls, doc: Any) -> VirtualMapping:
        if not isinstance(doc, dict) or not isinstance(doc.get("mapping"), dict) or set(doc) != {"mapping"}:
            raise MappingError("expected one top-level key, 'mapping'")
        section = doc["mapping"]
        _only(section, {"virtual_partitions", "physical_partitions", "offset_range", "topics"}, "mapping")
        offset_range = _int(section.get("offset_range", DEFAULT_OFFSET_RANGE), "mapping.offset_range")
        if offset_range < MIN_OFFSET_RANGE:
            raise MappingError(f"mapping.offset_range must be at least 2^20 ({MIN_OFFSET_RANGE}), got {offset_range}")
        default = None
        if "virtual_partitions" in section or "physical_partitions" in section:
            default = _layout(section, offset_range, "the default")
        topics = section.get("topics") or {}
        if not isinstance(topics, dict):
            raise MappingError("mapping.topics must map topic names or patterns to entries")
        exact: list[tuple[str, VirtualLayout]] = []
        patterns: list[tuple[re.Pattern[str], VirtualLayout]] = []
        for name, entry in topics.items():
            if not isinstance(entry, dict):
                raise MappingError(f"topic {name!r}: expected virtual_partitions and physical_partitions")
            _only(entry, {"virtual_partitions", "physical_partitions", "offset_range"}, f"topic {name!r}")
            layout = _layout(entry, _int(entry.get("offset_range", offset_range), f"topic {name!r} offset_range"),
                             f"topic {name!r}")
            try:
                patterns.append((re.compile(str(name)), layout))
            except re.error as e:
                raise MappingError(f"topic {name!r} is neither a name nor a valid pattern: {e}") from e
            exact.append((str(name), layout))
        return cls(default, tuple(exact), tuple(patterns))


def _layout(entry: dict[str, Any], offset_range: int, what: str) -> VirtualLayout:
    missing = {"virtual_partitions", "physical_partitions"} - set(entry)
    if missing:
        raise MappingError(f"{what}: {' and '.join(sorted(missing))} missing")
    physical = _int(entry["physical_partitions"], f"{what} physical_partitions")
    virtual = _int(entry["virtual_partitions"], f"{what} virtual_partitions")
    problem = layout_problem(physical, virtual, offset_range)
    if problem:
        raise MappingError(f"{what}: {problem}")
    return VirtualLayout(physical, virtual, offset_range)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MappingError(f"{what} must be an integer, got {value!r}")
    return value


def _only(entry: dict[str, Any], allowed: set[str], what: str) -> None:
    unknown = set(entry) - allowed
    if unknown:
        raise MappingError(f"{what}: unknown field(s) {', '.join(sorted(map(str, unknown)))} "
                           f"(allowed: {', '.join(sorted(allowed))})")


TOPIC_CONFIG = "kafscale.virtual.partitions"  # the topic config that makes a topic's partitions virtual


@dataclass(frozen=True, slots=True)
class NewTopicLayout:
    partitions: int  # what clients see
    physical: int  # what is stored; 0 for a plain topic
    configs: dict[str, str]  # the topic's configs, with TOPIC_CONFIG recorded when a mapping made it virtual


def new_topic_layout(name: str, requested: int | None, default: int, configs: dict[str, str],
                     mapping: VirtualMapping | None) -> NewTopicLayout:
    """How a new topic is laid out. requested: the partition count asked for (None: not given).

    An explicit TOPIC_CONFIG makes the requested count physical. Else an entry naming the topic applies, and a
    count asked for must be its physical or its virtual count. Else the mapping's default applies to a topic
    asked for with no count or with one of its counts (a request naming another count gets a plain topic: the
    default is a default, as num.partitions is). Raises MappingError (the config's problem) or OutOfRangeError
    (a count an entry naming the topic contradicts)."""
    if TOPIC_CONFIG in configs:
        physical = requested or default
        try:
            virtual = int(configs[TOPIC_CONFIG])
        except ValueError as e:
            raise MappingError(f"{TOPIC_CONFIG}={configs[TOPIC_CONFIG]!r}: expected an integer") from e
        problem = layout_problem(physical, virtual)
        if problem:
            raise MappingError(f"{TOPIC_CONFIG}={virtual} over {physical} partitions: {problem}")
        return NewTopicLayout(virtual, physical, {**configs, TOPIC_CONFIG: str(virtual)})
    named = mapping.named(name) if mapping is not None else None
    layout = named or (mapping.default if mapping is not None else None)
    if layout is None or (named is None and requested not in (None, layout.physical, layout.virtual)):
        return NewTopicLayout(requested or default, 0, configs)
    if requested not in (None, layout.physical, layout.virtual):
        raise OutOfRangeError(f"the virtual partition mapping gives topic {name!r} {layout.virtual} partitions over "
                              f"{layout.physical} physical ones: ask for either count, or none, not {requested}")
    return NewTopicLayout(layout.virtual, layout.physical, {**configs, TOPIC_CONFIG: str(layout.virtual)})
