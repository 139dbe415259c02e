"""TLS for SSL and SASL_SSL listeners: the server context, its reload when the files change, and the principal
a client certificate maps to.

Reload: the context given to the listener never changes; its SNI callback, which OpenSSL runs on every
ClientHello, hands each new connection the context built from the files as they are now. Connections already
open keep the certificate they were made with, as in Kafka's dynamic keystore update.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
from dataclasses import dataclass

from cryptography import x509

from kafscale.security.principal import ANONYMOUS, Principal

log = logging.getLogger(__name__)

RELOAD_CHECK_S = 1.0  # how often certificate files are checked for changes
CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    """A TLS setting the broker cannot use; the message names the setting and the file."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    certfile: str
    keyfile: str = ""  # empty: the key is in the certfile
    cafile: str = ""  # CAs that sign client certificates (needed unless client_auth is none)
    client_auth: str = "none"  # none | requested | required
    principal_rules: str = "DEFAULT"  # Kafka's ssl.principal.mapping.rules

    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.certfile, self.keyfile, self.cafile) if f)


def build_context(settings: TlsSettings) -> ssl.SSLContext:
    if settings.client_auth not in CLIENT_AUTH:
        raise TlsConfigError(f"ssl_client_auth: expected none, requested or required, got {settings.client_auth!r}")
    if not settings.certfile:
        raise TlsConfigError("ssl_certfile: an SSL or SASL_SSL listener needs a certificate")
    if settings.client_auth != "none" and not settings.cafile:
        raise TlsConfigError(f"ssl_cafile: ssl_client_auth {settings.client_auth} needs the CAs of client certificates")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.certfile, settings.keyfile or None)
    except (OSError, ssl.SSLError) as e:
        raise TlsConfigError(f"ssl_certfile/ssl_keyfile: cannot load {settings.certfile}"
                             f"{' and ' + settings.keyfile if settings.keyfile else ''}: {e}") from None
    if settings.cafile:
        try:
            context.load_verify_locations(settings.cafile)
        except (OSError, ssl.SSLError) as e:
            raise TlsConfigError(f"ssl_cafile: cannot load {settings.cafile}: {e}") from None
    context.verify_mode = CLIENT_AUTH[settings.client_auth]
    return context


class ServerTls:
    """The context a listener serves with; `reload_if_changed()` (called every second or so) rebuilds it when a
    file changed. A rebuild that fails (a half-written file) keeps the previous context and says why."""

    def __init__(self, settings: TlsSettings) -> None:
        self.settings = settings
        self._current = build_context(settings)
        self._stamps = self._stat()
        self.rules = PrincipalRules.parse(settings.principal_rules)
        self.context = build_context(settings)  # the one the server holds: it only dispatches
        self.context.sni_callback = self._pick
        self.reloads = 0

    def _pick(self, sslobj: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext) -> None:
        sslobj.context = self._current
        return None

    def _stat(self) -> tuple[tuple[str, float, int], ...]:
        out = []
        for f in self.settings.files():
            try:
                st = os.stat(f)
                out.append((f, st.st_mtime, st.st_size))
            except OSError:
                out.append((f, 0.0, -1))
        return tuple(out)

    def reload_if_changed(self) -> bool:
        stamps = self._stat()
        if stamps == self._stamps:
            return False
        try:
            context = build_context(self.settings)
        except TlsConfigError as e:
            log.warning("TLS files changed but cannot be loaded (kept the previous ones): %s", e)
            return False
        self._current, self._stamps = context, stamps
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", ", ".join(self.settings.files()))
        return True

    async def keep_current(self) -> None:
        """Check the files every RELOAD_CHECK_S, for as long as the server runs (cancel to stop)."""
        while True:
            await asyncio.sleep(RELOAD_CHECK_S)
            self.reload_if_changed()

    def principal(self, ssl_object: ssl.SSLObject | None) -> Principal:
        """The client certificate's subject through the mapping rules; ANONYMOUS without a certificate."""
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return ANONYMOUS
        subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
        return Principal(self.rules.apply(subject))


_RULE = re.compile(r"RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?)")


@dataclass(frozen=True, slots=True)
class PrincipalRules:
    """Kafka's ssl.principal.mapping.rules: `RULE:pattern/replacement/[L|U]` rules tried in order, the first
    whose pattern matches the whole distinguished name wins; `DEFAULT` is the distinguished name itself (RFC
    4514, most specific attribute first: `CN=alice,OU=eng,O=acme`). With no rule matching, the name as it is."""

    rules: tuple[tuple[re.Pattern[str], str, str] | None, ...]  # None: DEFAULT

    @classmethod
    def parse(cls, text: str) -> PrincipalRules:
        rules: list[tuple[re.Pattern[str], str, str] | None] = []
        rest = text.strip()
        while rest:
            if rest.startswith("DEFAULT"):
                rules.append(None)
                rest = rest[len("DEFAULT"):]
            else:
                m = _RULE.match(rest)
                if m is None:
                    raise TlsConfigError(f"ssl_principal_mapping_rules: cannot read {rest!r} (expected "
                                         f"RULE:pattern/replacement/[LU] or DEFAULT, comma-separated)")
                try:
                    pattern = re.compile(m.group(1).replace("\\/", "/"))
                except re.error as e:
                    raise TlsConfigError(f"ssl_principal_mapping_rules: bad pattern {m.group(1)!r}: {e}") from None
                rules.append((pattern, m.group(2).replace("\\/", "/"), m.group(3)))
                rest = rest[m.end():]
            rest = rest.strip()
            if rest.startswith(","):
                rest = rest[1:].strip()
            elif rest:
                raise TlsConfigError(f"ssl_principal_mapping_rules: expected a comma before {rest!r}")
        return cls(tuple(rules) or (None,))

    def apply(self, dn: str) -> str:
        for rule in self.rules:
            if rule is None:
                return dn
            pattern, replacement, case = rule
            if pattern.fullmatch(dn):
                # Kafka writes groups as $1; Python's re as \1.
                name = pattern.sub(re.sub(r"\$(\d)", r"\\\1", replacement), dn, count=1)
                return name.lower() if case == "L" else name.upper() if case == "U" else name
        return dn
