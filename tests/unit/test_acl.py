"""The authorizer's decisions (kafscale/security/acl.py), case by case as Kafka's AclAuthorizer makes them."""

from __future__ import annotations

import pytest

from kafscale.security import acl as acl_module
from kafscale.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclError,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(rtype: ResourceType, name: str, op: Operation, perm: Permission = ALLOW, principal: str = "User:alice",
        host: str = "*", pattern: PatternType = LIT) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm).check()


def test_allowed_denied_and_deny_wins() -> None:
    auth = Authorizer([acl(T, "orders", Operation.WRITE), acl(T, "orders", Operation.READ),
                       acl(T, "orders", Operation.WRITE, DENY, host="10.0.0.9")])
    assert auth.allows("User:alice", "10.0.0.1", Operation.WRITE, T, "orders")
    assert not auth.allows("User:alice", "10.0.0.9", Operation.WRITE, T, "orders")  # deny overrides allow
    assert auth.allows("User:alice", "10.0.0.9", Operation.READ, T, "orders")
    assert not auth.allows("User:bob", "10.0.0.1", Operation.WRITE, T, "orders")
    assert not auth.allows("User:alice", "10.0.0.1", Operation.DELETE, T, "orders")


def test_prefixed_and_wildcard_patterns_and_wildcard_principals() -> None:
    auth = Authorizer([acl(T, "logs-", Operation.READ, pattern=PRE), acl(G, "*", Operation.READ, principal="User:*")])
    assert auth.allows("User:alice", "h", Operation.READ, T, "logs-app")
    assert not auth.allows("User:alice", "h", Operation.READ, T, "log")
    assert auth.allows("User:anyone", "h", Operation.READ, G, "whatever")


def test_describe_is_implied_by_read_write_delete_and_alter_and_describe_configs_by_alter_configs() -> None:
    for op in (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER):
        assert Authorizer([acl(T, "t", op)]).allows("User:alice", "h", Operation.DESCRIBE, T, "t")
    assert Authorizer([acl(T, "t", Operation.ALTER_CONFIGS)]).allows("User:alice", "h", Operation.DESCRIBE_CONFIGS,
                                                                      T, "t")
    assert not Authorizer([acl(T, "t", Operation.DESCRIBE)]).allows("User:alice", "h", Operation.READ, T, "t")


def test_all_allows_and_denies_everything() -> None:
    assert Authorizer([acl(T, "t", Operation.ALL)]).allows("User:alice", "h", Operation.DELETE, T, "t")
    assert not Authorizer([acl(T, "t", Operation.ALL), acl(T, "t", Operation.ALL, DENY)]).allows(
        "User:alice", "h", Operation.READ, T, "t")


def test_remembered_decisions_stay_right_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acl_module, "DECISIONS_KEPT", 3)
    auth = Authorizer([acl(T, "logs-", Operation.WRITE, pattern=PRE), acl(T, "logs-secret", Operation.WRITE, DENY)])
    for _ in range(2):  # the second round answers from what the first remembered, or made afresh past the bound
        for name, want in [("logs-a", True), ("logs-secret", False), ("other", False), ("logs-b", True),
                           ("logs-secret", False)]:
            assert auth.allows("User:alice", "h", Operation.WRITE, T, name) is want, name
            assert len(auth._decisions) <= 3
    assert not auth.allows("User:bob", "h", Operation.WRITE, T, "logs-a")  # remembered per principal


def test_super_users_and_resources_without_acls() -> None:
    auth = Authorizer([acl(T, "guarded", Operation.READ)], super_users=["User:admin"])
    assert auth.allows("User:admin", "h", Operation.DELETE, T, "guarded")
    assert not auth.allows("User:alice", "h", Operation.READ, T, "open")  # no ACL: denied by default
    assert Authorizer([acl(T, "guarded", Operation.READ)], allow_if_no_acl=True).allows(
        "User:bob", "h", Operation.WRITE, T, "open")
    assert not Authorizer([acl(T, "guarded", Operation.READ)], allow_if_no_acl=True).allows(
        "User:bob", "h", Operation.WRITE, T, "guarded")  # it has ACLs: they decide


def test_writing_some_topic_is_what_an_idempotent_producer_needs() -> None:
    auth = Authorizer([acl(T, "app-", Operation.WRITE, pattern=PRE)])
    assert auth.allows_any("User:alice", "h", Operation.WRITE, T)
    assert not auth.allows_any("User:bob", "h", Operation.WRITE, T)
    assert not Authorizer([acl(T, "app-", Operation.WRITE, pattern=PRE),
                           acl(T, "*", Operation.WRITE, DENY)]).allows_any("User:alice", "h", Operation.WRITE, T)


@pytest.mark.parametrize(("binding", "message"), [
    (AclBinding(ResourceType.ANY, "t", LIT, "User:a", "*", Operation.READ, ALLOW), "resource type"),
    (AclBinding(T, "t", PatternType.MATCH, "User:a", "*", Operation.READ, ALLOW), "pattern type"),
    (AclBinding(T, "t", LIT, "User:a", "*", Operation.ANY, ALLOW), "operation"),
    (AclBinding(T, "t", LIT, "alice", "*", Operation.READ, ALLOW), "principal"),
    (AclBinding(C, "other", LIT, "User:a", "*", Operation.ALTER, ALLOW), CLUSTER_NAME),
    (AclBinding(T, "*", PRE, "User:a", "*", Operation.READ, ALLOW), "PREFIXED"),
])
def test_bindings_that_cannot_be_stored_say_why(binding: AclBinding, message: str) -> None:
    with pytest.raises(AclError, match=message):
        binding.check()


def test_filters_match_as_describe_and_delete_acls_do() -> None:
    literal, prefixed, star = acl(T, "logs-app", Operation.READ), acl(T, "logs-", Operation.READ, pattern=PRE), \
        acl(T, "*", Operation.READ)
    every = [literal, prefixed, star, acl(G, "g", Operation.READ)]
    assert [b for b in every if AclFilter(T).matches(b)] == [literal, prefixed, star]
    assert [b for b in every if AclFilter(T, "logs-app", PatternType.MATCH).matches(b)] == [literal, prefixed, star]
    assert [b for b in every if AclFilter(T, "logs-", PRE).matches(b)] == [prefixed]
    assert [b for b in every if AclFilter(principal="User:bob").matches(b)] == []
