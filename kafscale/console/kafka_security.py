"""The Security page's half of the console's Kafka view: SCRAM users and ACLs, through Kafka's admin APIs."""

from __future__ import annotations

from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from kafscale.console.answers import answer_of
from kafscale.console.view import AclEntry, ConsoleError, ScramCredential, ScramUser

MECHANISMS = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256, "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}
# Kafka calls the cluster resource CLUSTER; librdkafka's enum says BROKER.
RESOURCE_TYPES = {"TOPIC": ResourceType.TOPIC, "GROUP": ResourceType.GROUP, "CLUSTER": ResourceType.BROKER,
                  "TRANSACTIONAL_ID": ResourceType.TRANSACTIONAL_ID}
RESOURCE_NAMES = {v: k for k, v in RESOURCE_TYPES.items()}
PATTERNS = {"LITERAL": ResourcePatternType.LITERAL, "PREFIXED": ResourcePatternType.PREFIXED}
OPERATIONS = {op.name: op for op in AclOperation if op not in (AclOperation.UNKNOWN, AclOperation.ANY)}
PERMISSIONS = {"ALLOW": AclPermissionType.ALLOW, "DENY": AclPermissionType.DENY}


def _mechanism(name: str) -> ScramMechanism:
    if name not in MECHANISMS:
        raise ConsoleError(400, f"mechanism: expected {' or '.join(MECHANISMS)}, got {name!r}")
    return MECHANISMS[name]


def _pick(table: dict[str, object], value: str, what: str) -> object:
    if value not in table:
        raise ConsoleError(400, f"{what}: expected one of {', '.join(table)}, got {value!r}")
    return table[value]


def binding(entry: AclEntry) -> AclBinding:
    if not entry.principal or ":" not in entry.principal:
        raise ConsoleError(400, f"principal: expected TYPE:NAME (User:alice), got {entry.principal!r}")
    if not entry.resource_name:
        raise ConsoleError(400, "resource_name: expected a name (or * for all)")
    return AclBinding(_pick(RESOURCE_TYPES, entry.resource_type, "resource_type"), entry.resource_name,
                      _pick(PATTERNS, entry.pattern_type, "pattern_type"), entry.principal, entry.host or "*",
                      _pick(OPERATIONS, entry.operation, "operation"),
                      _pick(PERMISSIONS, entry.permission, "permission"))


def _filter(entry: AclEntry) -> AclBindingFilter:
    b = binding(entry)
    return AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                            b.permission_type)


async def users(admin: AdminClient) -> list[ScramUser]:
    described = await answer_of("list SCRAM users", admin.describe_user_scram_credentials())
    return [ScramUser(name, sorted((ScramCredential(i.mechanism.name.replace("_", "-"), i.iterations)
                                    for i in d.scram_credential_infos), key=lambda c: c.mechanism))
            for name, d in sorted(described.items())]


async def upsert_user(admin: AdminClient, name: str, mechanism: str, password: str, iterations: int) -> None:
    change = UserScramCredentialUpsertion(name, ScramCredentialInfo(_mechanism(mechanism), iterations),
                                          password.encode())
    await answer_of(f"set the password of {name!r}", admin.alter_user_scram_credentials([change])[name])


async def delete_user(admin: AdminClient, name: str, mechanism: str) -> None:
    change = UserScramCredentialDeletion(name, _mechanism(mechanism))
    await answer_of(f"delete {mechanism} of {name!r}", admin.alter_user_scram_credentials([change])[name])


async def acls(admin: AdminClient) -> list[AclEntry]:
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    found = await answer_of("list ACLs", admin.describe_acls(everything))
    return sorted(AclEntry(RESOURCE_NAMES.get(b.restype, b.restype.name), b.name, b.resource_pattern_type.name,
                           b.principal, b.host, b.operation.name, b.permission_type.name) for b in found)


async def create_acl(admin: AdminClient, entry: AclEntry) -> None:
    b = binding(entry)
    await answer_of("create the ACL", admin.create_acls([b])[b])


async def delete_acl(admin: AdminClient, entry: AclEntry) -> int:
    f = _filter(entry)
    return len(await answer_of("delete the ACL", admin.delete_acls([f])[f]))
