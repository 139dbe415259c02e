"""The principal a request runs as (Kafka's KafkaPrincipal: a type and a name, written `User:alice`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    type: str = "User"

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Principal:
        """`User:alice` (the type is required, as in Kafka's ACL tools)."""
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"a principal is TYPE:NAME, like User:alice; got {text!r}")
        return cls(name, kind)


ANONYMOUS = Principal("ANONYMOUS")  # PLAINTEXT, and SSL without a client certificate
