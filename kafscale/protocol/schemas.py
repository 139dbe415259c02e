"""kio's schema classes by (api_key, version), and make(): one handler builds every version's objects.

Lookups are cached and bounded: the set of known versions is built once from kio's index, so
values from the wire never grow a cache.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import sys
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map

from kafscale.protocol import newer
from kafscale.protocol.errors import ErrorCode, UnknownApiKey, UnsupportedApiVersion

T = TypeVar("T")



# --------------------------------------------------------------------------------------------
# Schema classes
# --------------------------------------------------------------------------------------------


# Built once: caches keyed by values from the wire must not grow with garbage input. kio's versions, and the newer
# ones kafscale.protocol.newer adds (each the next version of an API kio has).
_KNOWN_VERSIONS: dict[int, tuple[int, int]] = {
    int(key): (min(schema_name_map[name]), max([*schema_name_map[name], *(v for k, v in newer.MODULES if k == key)]))
    for key, name in api_key_map.items()
    if name in schema_name_map
}


def api_name(api_key: int) -> str:
    """The API's name as Kafka's schemas spell it ("Fetch", "OffsetCommit"), from kio's index alone: naming an API
    (a metric label) must not import a schema module the broker never decodes, which costs tens of milliseconds
    on the first request of each API."""
    name = api_key_map.get(api_key)  # type: ignore[call-overload]
    if name is None or name not in schema_name_map:
        return f"api{api_key}"
    versions = schema_name_map[name]
    path = next(iter(versions[min(versions)].values()))  # "kio.schema.fetch.v0.request:FetchRequest"
    return path.rsplit(":", 1)[1].removesuffix("Request").removesuffix("Response")


def known_versions(api_key: int) -> tuple[int, int] | None:
    """The (min, max) request versions there are schemas for (kio 0.6.2's and kafscale.protocol.newer's), or None
    for an unknown key."""
    return _KNOWN_VERSIONS.get(api_key)


def has_schemas(api_key: int, version: int) -> bool:
    """Whether kio has both schemas of (api_key, version), from its index alone: importing a version's modules
    costs a few milliseconds each, about 2 s for all that a broker serves, which a shard start must not pay."""
    if (api_key, version) in newer.MODULES:
        return True
    name = api_key_map.get(api_key)  # type: ignore[call-overload]
    entities = schema_name_map.get(name, {}).get(version, {}) if name is not None else {}
    return len(entities) == 2


def _load(loader: Callable[[int, int], type[Any]], api_key: int, version: int) -> type[Any]:
    if known_versions(api_key) is None:
        raise UnknownApiKey(api_key)
    try:
        return loader(api_key, version)
    except KioIndexError:
        raise UnsupportedApiVersion(api_key, version) from None


@functools.cache
def request_class(api_key: int, version: int) -> type[Any]:
    """The request class (kio's, or kafscale.protocol.newer's); raises UnknownApiKey / UnsupportedApiVersion."""
    return newer.request_class(api_key, version) or _load(load_request_schema, api_key, version)


@functools.cache
def response_class(api_key: int, version: int) -> type[Any]:
    """The response class (kio's, or kafscale.protocol.newer's); raises UnknownApiKey / UnsupportedApiVersion."""
    return newer.response_class(api_key, version) or _load(load_response_schema, api_key, version)


@functools.cache
def nested(cls: type[Any], name: str) -> type[Any]:
    """A class defined next to `cls` in the same kio version module, e.g.
    `nested(response_class(3, 12), "MetadataResponseBroker")`. Nested classes differ per version,
    so version-generic handlers look them up from the top-level class they already have."""
    found = getattr(sys.modules[cls.__module__], name, None)
    if not isinstance(found, type):
        raise AttributeError(f"{cls.__module__} has no class {name!r}")
    return found


# --------------------------------------------------------------------------------------------
# make(): version-generic construction
# --------------------------------------------------------------------------------------------


class _Shape(NamedTuple):
    names: frozenset[str]
    timedeltas: frozenset[str]  # fields kio wants as datetime.timedelta (throttle_time, timeouts)
    error_codes: frozenset[str]


@functools.cache
def _shape(cls: type[Any]) -> _Shape:
    fields = dataclasses.fields(cls)
    kinds = {f.name: f.metadata.get("kafka_type") for f in fields}
    return _Shape(
        names=frozenset(kinds),
        timedeltas=frozenset(n for n, k in kinds.items() if k in ("timedelta_i32", "timedelta_i64")),
        error_codes=frozenset(n for n, k in kinds.items() if k == "error_code"),
    )


def make(cls: type[T], /, **kwargs: Any) -> T:
    """Build `cls(**kwargs)`, dropping kwargs this version's class does not have.

    One handler can then serve every version: pass the union of the fields of all versions and
    each class keeps what it knows. Plain ints are accepted for millisecond durations and for
    error codes (converted to the timedelta / ErrorCode kio's writer needs). Fields a version
    requires but that were not passed still raise TypeError, as they should.
    """
    shape = _shape(cls)
    if not kwargs.keys() <= shape.names:
        kwargs = {k: v for k, v in kwargs.items() if k in shape.names}
    for name in shape.timedeltas:
        value = kwargs.get(name)
        if isinstance(value, int):
            kwargs[name] = datetime.timedelta(milliseconds=value)
    for name in shape.error_codes:
        value = kwargs.get(name)
        if type(value) is int:
            kwargs[name] = ErrorCode(value)
    return cls(**kwargs)




def replace(value: T, /, **changes: Any) -> T:
    """dataclasses.replace, dropping changes to fields this version's class does not have (as make() does)."""
    shape = _shape(type(value))
    if not changes.keys() <= shape.names:
        changes = {k: v for k, v in changes.items() if k in shape.names}
    return dataclasses.replace(value, **changes)  # type: ignore[type-var]


def convert(value: Any, cls: type[T], /, **changes: Any) -> T:
    """`value`, an entity of another version of the same API, as `cls` (fields `cls` lacks dropped, as make()
    does)."""
    return make(cls, **{**{f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, **changes})
