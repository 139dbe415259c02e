"""`kafscale acl add|list|remove`: ACLs through the Kafka API (CreateAcls, DescribeAcls, DeleteAcls), as Kafka's
kafka-acls tool manages them; the broker needs `--authorizer acl`. Connect as a principal allowed to (a super
user at first): `-b HOST:PORT -X security.protocol=... -X sasl.username=...`."""

from __future__ import annotations

import argparse
from typing import Any

from kafscale.commands.client import CommandError, add_common, admin, emit, run_command, table, wait

OPERATIONS = ("ALL", "READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS",
              "ALTER_CONFIGS", "IDEMPOTENT_WRITE")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("acl", help="add, list and remove ACLs (brokers run with --authorizer acl)")
    sub = parser.add_subparsers(dest="acl_command", required=True)
    p = sub.add_parser("add", help="allow (or --deny) principals operations on a resource")
    _resource(p, required=True)
    p.add_argument("--principal", action="append", required=True, help="User:NAME (repeatable; User:* for all)")
    p.add_argument("--operation", action="append", required=True, choices=OPERATIONS, type=str.upper,
                   help="repeatable")
    p.add_argument("--host", default="*", help="client address the ACL applies to (default any)")
    p.add_argument("--deny", action="store_true", help="a DENY ACL (it wins over any ALLOW)")
    p.set_defaults(run=run_command(add))
    p = sub.add_parser("list", help="ACLs, all or those matching a resource and principal")
    _resource(p, required=False)
    p.add_argument("--principal")
    p.set_defaults(run=run_command(list_acls))
    p = sub.add_parser("remove", help="remove the ACLs matching a resource (and principal, operation, host)")
    _resource(p, required=True)
    p.add_argument("--principal")
    p.add_argument("--operation", choices=OPERATIONS, type=str.upper)
    p.add_argument("--host")
    p.add_argument("--deny", action="store_true", help="only DENY ACLs")
    p.set_defaults(run=run_command(remove))
    for p in sub.choices.values():
        add_common(p)


def _resource(p: argparse.ArgumentParser, required: bool) -> None:
    which = p.add_mutually_exclusive_group(required=required)
    which.add_argument("--topic", help="a topic name (or prefix with --prefixed; * for every topic)")
    which.add_argument("--group", help="a consumer group id (or prefix with --prefixed; * for every group)")
    which.add_argument("--cluster", action="store_true", help="the cluster (admin operations)")
    p.add_argument("--prefixed", action="store_true", help="the name is a prefix (Kafka's PREFIXED pattern)")


def _target(args: argparse.Namespace) -> tuple[Any, str | None]:
    from confluent_kafka.admin import ResourceType

    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.cluster:
        return ResourceType.BROKER, "kafka-cluster"  # confluent-kafka calls Kafka's CLUSTER resource BROKER
    return ResourceType.ANY, None


def add(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType

    restype, name = _target(args)
    pattern = ResourcePatternType.PREFIXED if args.prefixed else ResourcePatternType.LITERAL
    permission = AclPermissionType.DENY if args.deny else AclPermissionType.ALLOW
    bindings = [AclBinding(restype, name, pattern, principal, args.host, AclOperation[op], permission)
                for principal in args.principal for op in args.operation]
    client = admin(args)
    for future in client.create_acls(bindings, request_timeout=args.timeout).values():
        wait(future, args, "add ACL", {"SECURITY_DISABLED": "Start the brokers with --authorizer acl."})
    for b in bindings:
        print(f"added: {_describe(b)}")
    return 0


def _filter(args: argparse.Namespace) -> Any:
    from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType

    restype, name = _target(args)
    if name is None:
        pattern = ResourcePatternType.ANY
    else:
        pattern = ResourcePatternType.PREFIXED if args.prefixed else ResourcePatternType.LITERAL
    operation = AclOperation[args.operation] if getattr(args, "operation", None) else AclOperation.ANY
    permission = AclPermissionType.DENY if getattr(args, "deny", False) else AclPermissionType.ANY
    return AclBindingFilter(restype, name, pattern, args.principal, getattr(args, "host", None), operation,
                            permission)


def list_acls(args: argparse.Namespace) -> int:
    client = admin(args)
    found = wait(client.describe_acls(_filter(args), request_timeout=args.timeout), args, "list ACLs",
                 {"SECURITY_DISABLED": "Start the brokers with --authorizer acl."})
    rows = sorted(_row(b) for b in found)
    data = [dict(zip(("resource", "pattern", "principal", "host", "operation", "permission"), r, strict=True))
            for r in rows]
    emit(args, data, lambda d: table([list(r.values()) for r in d],
                                     ["RESOURCE", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"])
         if d else "no ACLs")
    return 0


def remove(args: argparse.Namespace) -> int:
    client = admin(args)
    futures = client.delete_acls([_filter(args)], request_timeout=args.timeout)
    gone = [b for f in futures.values() for b in wait(f, args, "remove ACLs")]
    if not gone:
        raise CommandError("no ACL matches; see `kafscale acl list`")
    for b in gone:
        print(f"removed: {_describe(b)}")
    return 0


def _row(b: Any) -> tuple[str, ...]:
    kind = "cluster" if b.restype.name == "BROKER" else b.restype.name.lower()
    return (f"{kind}:{b.name}", b.resource_pattern_type.name, b.principal, b.host, b.operation.name,
            b.permission_type.name)


def _describe(b: Any) -> str:
    resource, pattern, principal, host, operation, permission = _row(b)
    return f"{permission} {principal} from {host} {operation} on {resource} ({pattern})"
