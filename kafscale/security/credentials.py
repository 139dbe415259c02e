"""Users' SCRAM credentials in the metadata store (`security/scram/{user}/{mechanism}`), and every shard's
mirror of them: an AlterUserScramCredentials on one shard, or `kafscale user create` against the store, reaches
every shard as fast as the store's watch delivers it."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote

from kafscale.cluster import keys
from kafscale.security.scram import Mechanism, ScramCredential
from kafscale.storage.metadata_store import MetadataStore
from kafscale.storage.mirror import Mirror


class Credentials:
    def __init__(self, meta: MetadataStore) -> None:
        self.meta = meta
        self._mirror = Mirror(meta, keys.SCRAM_CREDENTIALS, self._changed)
        self._by_user: dict[str, dict[Mechanism, ScramCredential]] = {}

    async def start(self) -> None:
        await self._mirror.start()

    async def stop(self) -> None:
        await self._mirror.stop()

    def _changed(self) -> None:
        self._by_user = parse(self._mirror.values)

    def lookup(self, user: str, mechanism: Mechanism) -> ScramCredential | None:
        return self._by_user.get(user, {}).get(mechanism)

    def any_of(self, user: str) -> ScramCredential | None:
        """A credential of the user's, any mechanism (SASL/PLAIN checks a password against it)."""
        found = self._by_user.get(user, {})
        return found.get(Mechanism.SCRAM_SHA_512) or found.get(Mechanism.SCRAM_SHA_256)

    def lookup_for(self, mechanism: Mechanism) -> Callable[[str], ScramCredential | None]:
        return lambda user: self.lookup(user, mechanism)

    async def stored(self) -> dict[str, dict[Mechanism, ScramCredential]]:
        """As the store holds them now (the admin APIs' view: the mirror runs only under SASL listeners)."""
        return await read_all(self.meta)

    async def upsert(self, user: str, credential: ScramCredential) -> None:
        await upsert(self.meta, user, credential)

    async def delete(self, user: str, mechanism: Mechanism) -> bool:
        return await delete(self.meta, user, mechanism)


def parse(values: dict[str, object]) -> dict[str, dict[Mechanism, ScramCredential]]:
    """Stored values by key ("{user}/{mechanism}") -> credentials by user; a value that does not read is skipped
    (it can only come from outside the broker, and must not lock every user out)."""
    out: dict[str, dict[Mechanism, ScramCredential]] = {}
    for key, value in values.items():
        user, _, _ = key.rpartition("/")
        try:
            credential = ScramCredential.from_value(value)  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError):
            continue
        out.setdefault(unquote(user), {})[credential.mechanism] = credential
    return out


async def read_all(meta: MetadataStore) -> dict[str, dict[Mechanism, ScramCredential]]:
    return parse({kv.key[len(keys.SCRAM_CREDENTIALS):]: kv.value for kv in await meta.range(keys.SCRAM_CREDENTIALS)})


async def upsert(meta: MetadataStore, user: str, credential: ScramCredential) -> None:
    await meta.put(keys.scram_credential(user, credential.mechanism.sasl_name), credential.to_value())


async def delete(meta: MetadataStore, user: str, mechanism: Mechanism) -> bool:
    return await meta.delete(keys.scram_credential(user, mechanism.sasl_name)) > 0
