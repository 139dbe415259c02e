"""Kafka's ssl.principal.mapping.rules (kafscale/security/tls.py PrincipalRules)."""

from __future__ import annotations

import pytest

from kafscale.security.tls import PrincipalRules, TlsConfigError

DN = "CN=Alice,OU=ServiceUsers,O=Acme,C=US"


def test_default_is_the_distinguished_name_itself() -> None:
    assert PrincipalRules.parse("DEFAULT").apply(DN) == DN
    assert PrincipalRules.parse("").apply(DN) == DN


def test_the_first_rule_that_matches_the_whole_name_wins_with_case_folding() -> None:
    rules = PrincipalRules.parse(r"RULE:^CN=(.*?),OU=Admins.*$/$1-admin/U, RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,"
                                 "DEFAULT")
    assert rules.apply(DN) == "alice"
    assert rules.apply("CN=Bob,OU=Admins,O=Acme") == "BOB-ADMIN"
    assert rules.apply("CN=carol,O=Other") == "CN=carol,O=Other"


def test_a_rule_may_contain_escaped_slashes() -> None:
    assert PrincipalRules.parse(r"RULE:^CN=([^,]*),.*$/users\/$1/").apply(DN) == "users/Alice"


@pytest.mark.parametrize("text", ["RULE:^CN=(.*$/$1/", "RULE:abc", "DEFAULT DEFAULT", "SOMETHING"])
def test_unreadable_rules_name_the_setting(text: str) -> None:
    with pytest.raises(TlsConfigError, match="ssl_principal_mapping_rules"):
        PrincipalRules.parse(text)
