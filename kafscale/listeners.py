"""Listeners as in Kafka: `listeners`, `advertised.listeners` and `listener.security.protocol.map`, parsed.

`--listeners "PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9094"`: every shard serves every listener, shard k on
an address at the listener's PORT+k (port 0: any free port). A listener's name is its security protocol unless
`--listener-security-protocol-map "INTERNAL:SASL_PLAINTEXT,..."` says otherwise. `--advertised-listeners` gives
per name the host clients are told (it may hold {node_ip}) and, optionally, a port (then shard k advertises
PORT+k). Without `--listeners`, `--listen HOST:PORT` is one PLAINTEXT listener.
"""

from __future__ import annotations

from dataclasses import dataclass

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class ListenerError(ValueError):
    """A listener setting that cannot be used; the message names the setting."""


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    name: str
    protocol: str  # one of SECURITY_PROTOCOLS
    host: str  # bind host; may hold {node_ip}
    port: int  # shard 0's port on an address (0: any)
    advertised_host: str = ""  # empty: the shard's advertised host (--advertised-host, a node label, ...)
    advertised_port: int = 0  # 0: the port bound

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")


def _endpoints(setting: str, text: str) -> list[tuple[str, str, int | None]]:
    out: list[tuple[str, str, int | None]] = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, address = item.partition("://")
        host, colon, port = address.rpartition(":")
        if not sep or not name:
            raise ListenerError(f"{setting}: expected NAME://HOST:PORT, got {item!r}")
        if not colon:
            host, port = address, ""
        if port and not port.isdigit():
            raise ListenerError(f"{setting}: the port of {item!r} is not a number")
        out.append((name.upper(), host.strip("[]"), int(port) if port else None))
    return out


def parse(listeners: str, advertised: str = "", protocol_map: str = "", listen: str = "") -> list[ListenerSpec]:
    """The listeners in the order given (the first is the one ports and health checks go by)."""
    protocols = {p: p for p in SECURITY_PROTOCOLS}
    for item in (i.strip() for i in protocol_map.split(",") if i.strip()):
        name, sep, protocol = item.partition(":")
        if not sep or protocol.upper() not in SECURITY_PROTOCOLS:
            raise ListenerError(f"listener_security_protocol_map: expected NAME:PROTOCOL with PROTOCOL one of "
                                f"{', '.join(SECURITY_PROTOCOLS)}, got {item!r}")
        protocols[name.strip().upper()] = protocol.upper()
    if not listeners.strip():
        if not listen:
            raise ListenerError("listeners: none given")
        listeners = f"PLAINTEXT://{listen}"
    specs: list[ListenerSpec] = []
    for name, host, port in _endpoints("listeners", listeners):
        if name not in protocols:
            raise ListenerError(f"listeners: {name} is no security protocol; map it with "
                                f"listener_security_protocol_map ({name}:SASL_SSL, ...)")
        if port is None:
            raise ListenerError(f"listeners: {name} needs a port (0: any)")
        if any(s.name == name for s in specs):
            raise ListenerError(f"listeners: {name} is given twice")
        specs.append(ListenerSpec(name, protocols[name], host, port))
    for name, host, port in _endpoints("advertised_listeners", advertised):
        index = next((i for i, s in enumerate(specs) if s.name == name), None)
        if index is None:
            raise ListenerError(f"advertised_listeners: {name} is not one of the listeners "
                                f"({', '.join(s.name for s in specs)})")
        spec = specs[index]
        specs[index] = ListenerSpec(spec.name, spec.protocol, spec.host, spec.port, host, port or 0)
    return specs
