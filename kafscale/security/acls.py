"""ACL bindings in the metadata store (`security/acls/...`, one key per binding) and every shard's mirror of them:
a CreateAcls or DeleteAcls on one shard reaches every other as fast as the store's watch delivers it."""

from __future__ import annotations

from urllib.parse import quote

from kafscale.security.acl import AclBinding, AclFilter, Authorizer
from kafscale.storage.metadata_store import MetadataStore
from kafscale.storage.mirror import Mirror

PREFIX = "security/acls/"


def key(b: AclBinding) -> str:
    """One key per binding: creating the same binding twice stores it once, as in Kafka."""
    parts = (int(b.resource_type), int(b.pattern_type), b.name, b.principal, b.host, int(b.operation),
             int(b.permission))
    return PREFIX + "/".join(quote(str(p), safe="") for p in parts)


class Acls:
    """The bindings, and the authorizer over them (None while `--authorizer` is off: everything is allowed)."""

    def __init__(self, meta: MetadataStore, *, enabled: bool, super_users: tuple[str, ...] = (),
                 allow_if_no_acl: bool = False) -> None:
        self.meta = meta
        self.enabled = enabled
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        self._mirror = Mirror(meta, PREFIX, self._changed)
        self.bindings: list[AclBinding] = []
        self.authorizer: Authorizer | None = None

    async def start(self) -> None:
        if self.enabled:
            await self._mirror.start()

    async def stop(self) -> None:
        await self._mirror.stop()

    def _changed(self) -> None:
        found = []
        for value in self._mirror.values.values():
            try:
                found.append(AclBinding.from_value(value))
            except (KeyError, TypeError, ValueError):
                continue  # written by something else: it must not stop every other binding from applying
        self.bindings = found
        self.authorizer = Authorizer(found, self.super_users, self.allow_if_no_acl)

    async def stored(self) -> list[AclBinding]:
        """As the store holds them now (DescribeAcls answers from here, whatever the mirror has seen)."""
        out = []
        for kv in await self.meta.range(PREFIX):
            try:
                out.append(AclBinding.from_value(kv.value))
            except (KeyError, TypeError, ValueError):
                continue
        return out

    async def create(self, binding: AclBinding) -> None:
        await self.meta.put(key(binding.check()), binding.to_value())

    async def delete(self, matching: AclFilter) -> list[AclBinding]:
        """Deletes every stored binding the filter matches; returns them."""
        gone = [b for b in await self.stored() if matching.matches(b)]
        for b in gone:
            await self.meta.delete(key(b))
        return gone
