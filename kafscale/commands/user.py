"""`kafscale user create|list|delete`: SASL/SCRAM users.

Two ways in. Through the Kafka API (`-b HOST:PORT`, plus `-X` for the connection's own security settings), as
Kafka's kafka-configs tool does: AlterUserScramCredentials and DescribeUserScramCredentials. Or straight against
the metadata store (`--data-dir`, or `--etcd-endpoints`), which is how the first user is made, before anyone can
log in. The embedded store is held by a running broker: make users there before `kafscale serve`, or through the
Kafka API while it runs. etcd can be written any time; every shard sees the change within a second.

The password comes from a prompt (twice), or from standard input with --password-stdin; it never appears in
the arguments, the environment or the store (which keeps SCRAM's salted keys only).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from typing import Any

from kafscale.commands.client import CommandError, add_common, admin, emit, run_command, table, wait
from kafscale.security import credentials
from kafscale.security.scram import MAX_ITERATIONS, MIN_ITERATIONS, Mechanism, ScramCredential
from kafscale.storage.metadata_store import MetadataStore, MetadataStoreError

MECHANISMS = [m.sasl_name for m in Mechanism]


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("user", help="create, list and delete SASL/SCRAM users")
    sub = parser.add_subparsers(dest="user_command", required=True)
    p = sub.add_parser("create", help="add a user, or set a new password (SCRAM credentials)")
    p.add_argument("name")
    p.add_argument("--mechanism", action="append", choices=MECHANISMS,
                   help="SCRAM mechanism (repeatable; default both)")
    p.add_argument("--iterations", type=int, default=8192,
                   help=f"PBKDF2 iterations ({MIN_ITERATIONS}..{MAX_ITERATIONS})")
    p.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    p.set_defaults(run=run_command(create))
    p = sub.add_parser("list", help="users and their SCRAM mechanisms")
    p.set_defaults(run=run_command(list_users))
    p = sub.add_parser("delete", help="remove a user's credentials")
    p.add_argument("name")
    p.add_argument("--mechanism", action="append", choices=MECHANISMS, help="only this mechanism (repeatable)")
    p.set_defaults(run=run_command(delete))
    for p in sub.choices.values():
        add_common(p)
        p.add_argument("--data-dir", help="write the embedded metadata store in this directory (broker stopped)")
        p.add_argument("--etcd-endpoints", help="write etcd directly (comma-separated endpoints)")
        p.add_argument("--etcd-prefix", default="/kafscale/", help="key prefix in etcd")


def _mechanisms(args: argparse.Namespace) -> list[Mechanism]:
    return [Mechanism.named(m) for m in (args.mechanism or MECHANISMS)]


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise CommandError("the passwords differ")
    if not password:
        raise CommandError("the password is empty")
    return password


def _direct(args: argparse.Namespace) -> bool:
    return bool(args.data_dir or args.etcd_endpoints)


def _in_store(args: argparse.Namespace, work: Any) -> Any:
    """Runs work(store) against the store the flags name."""
    from kafscale.storage.metadata_stores import metadata_store_from_settings

    async def run() -> Any:
        try:
            meta = metadata_store_from_settings(data_dir=args.data_dir, etcd_endpoints=args.etcd_endpoints,
                                                prefix=args.etcd_prefix)
        except MetadataStoreError as e:
            raise CommandError(f"{e}: a broker is running on it; create users through it with -b HOST:PORT "
                               f"(and -X for its security settings)") from None
        try:
            return await work(meta)
        finally:
            await meta.close()

    return asyncio.run(run())


def create(args: argparse.Namespace) -> int:
    if not MIN_ITERATIONS <= args.iterations <= MAX_ITERATIONS:
        raise CommandError(f"--iterations: must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}, got {args.iterations}")
    password = _password(args)
    made = {m: ScramCredential.from_password(m, password, args.iterations) for m in _mechanisms(args)}
    if _direct(args):
        async def work(meta: MetadataStore) -> None:
            for credential in made.values():
                await credentials.upsert(meta, args.name, credential)
        _in_store(args, work)
    else:
        from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

        client = admin(args)
        upserts = [UserScramCredentialUpsertion(args.name, ScramCredentialInfo(ScramMechanism[m.name], c.iterations),
                                                password.encode(), c.salt) for m, c in made.items()]
        for future in client.alter_user_scram_credentials(upserts).values():
            wait(future, args, f"create user {args.name!r}")
    print(f"user {args.name}: {', '.join(m.sasl_name for m in made)} set", file=sys.stderr)
    return 0


def list_users(args: argparse.Namespace) -> int:
    if _direct(args):
        stored = _in_store(args, credentials.read_all)
        users = {u: sorted((m.sasl_name, c.iterations) for m, c in by.items()) for u, by in stored.items()}
    else:
        client = admin(args)
        described = wait(client.describe_user_scram_credentials(), args, "list users")
        users = {u: sorted((i.mechanism.name.replace("_", "-"), i.iterations) for i in d.scram_credential_infos)
                 for u, d in described.items()}
    data = [{"user": u, "mechanisms": [{"mechanism": m, "iterations": i} for m, i in ms]}
            for u, ms in sorted(users.items())]
    emit(args, data, lambda d: table([[u["user"], ", ".join(f"{m['mechanism']} ({m['iterations']})"
                                                           for m in u["mechanisms"])] for u in d],
                                     ["USER", "MECHANISMS"]) if d else "no users")
    return 0


def delete(args: argparse.Namespace) -> int:
    mechanisms = _mechanisms(args)
    if _direct(args):
        async def work(meta: MetadataStore) -> list[Mechanism]:
            return [m for m in mechanisms if await credentials.delete(meta, args.name, m)]
        gone = _in_store(args, work)
        if not gone:
            raise CommandError(f"user {args.name!r} has no {' or '.join(m.sasl_name for m in mechanisms)} credential")
    else:
        from confluent_kafka.admin import ScramMechanism, UserScramCredentialDeletion

        client = admin(args)
        hint = {"RESOURCE_NOT_FOUND": "List users with `kafscale user list`."}
        described = wait(client.describe_user_scram_credentials([args.name])[args.name], args,
                         f"describe user {args.name!r}", hint)
        has = {i.mechanism.name for i in described.scram_credential_infos}
        gone = [m for m in mechanisms if m.name in has]
        if not gone:
            raise CommandError(f"user {args.name!r} has no {' or '.join(m.sasl_name for m in mechanisms)} credential")
        futures = client.alter_user_scram_credentials(
            [UserScramCredentialDeletion(args.name, ScramMechanism[m.name]) for m in gone])
        for future in futures.values():
            wait(future, args, f"delete user {args.name!r}")
    print(f"user {args.name}: {', '.join(m.sasl_name for m in gone)} removed", file=sys.stderr)
    return 0
