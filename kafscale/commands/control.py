"""Reaching a running cluster's controller (a Ray actor) from the command line.

The cluster is found by --ray-address (a Ray cluster, or `auto`), or by the head file a detached
`kafscale serve` left in --data-dir when it started its own local Ray head.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kafscale.commands.client import CommandError
from kafscale.net import address_towards

ENV_RAY_ADDRESS = "KAFSCALE_RAY_ADDRESS"


def add_cluster_address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray-address", default=os.environ.get(ENV_RAY_ADDRESS, ""),
                        help=f"the Ray cluster the broker runs on, or 'auto' [env {ENV_RAY_ADDRESS}]")
    parser.add_argument("--data-dir", default="./data",
                        help="where a detached `kafscale serve` with its own Ray head keeps ray-head.json")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the controller")


def head_file(args: argparse.Namespace) -> dict[str, Any] | None:
    from kafscale.actors.serve import HEAD_FILE

    path = Path(args.data_dir, HEAD_FILE)
    if not path.exists():
        return None
    return dict(json.loads(path.read_text()))


def ray_address(args: argparse.Namespace) -> str:
    if args.ray_address:
        return str(args.ray_address)
    head = head_file(args)
    if head is None:
        raise CommandError(f"no cluster to talk to: give --ray-address (or set {ENV_RAY_ADDRESS}), or --data-dir of"
                           " a detached `kafscale serve`")
    return str(head["address"])


@contextlib.contextmanager
def controller(args: argparse.Namespace) -> Iterator[Any]:
    """The controller's actor handle, with this process attached to the cluster as a Ray driver."""
    address = ray_address(args)
    local = address.split(":")[0] in ("127.0.0.1", "localhost")
    if local:  # read when Ray is imported: a driver on loopback stays there, as `kafscale serve` set it up
        from kafscale.actors.local_head import ray_environment

        os.environ.update({k: v for k, v in ray_environment().items() if k.startswith("RAY_")})
    import ray

    from kafscale.actors.controller import CONTROLLER_NAME
    from kafscale.actors.serve import RAY_NAMESPACE

    node_ip = address_towards(address)  # the node this driver runs on, as the cluster knows it
    extra = {"_node_ip_address": node_ip} if node_ip else {}
    host, _, port = address.rpartition(":")
    if port.isdigit():  # Ray would retry an unreachable GCS for minutes before saying so
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as e:
            raise CommandError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None
    # Ray prints the cluster's error events (a node marked dead, ...) to stdout whatever log_to_driver says. They go
    # to stderr while this process is a driver, so stdout carries the command's answer alone (`-o json` is JSON).
    with contextlib.redirect_stdout(sys.stderr):
        try:
            ray.init(address=address, namespace=RAY_NAMESPACE, log_to_driver=False, configure_logging=False, **extra)
        except Exception as e:
            raise CommandError(f"cannot reach the Ray cluster at {address}: {e}") from None
        try:
            try:
                handle = ray.get_actor(CONTROLLER_NAME, namespace=RAY_NAMESPACE)
            except ValueError:
                raise CommandError(f"no kafscale broker runs on the Ray cluster at {address}") from None
            yield handle
        finally:
            ray.shutdown()  # joins the thread that prints those events


def call(args: argparse.Namespace, method: str, *params: Any) -> Any:
    """One controller call; its ValueError (a refused request) becomes the command's error."""
    with controller(args) as handle:
        import ray  # only now: controller() sets what Ray reads at import

        try:
            return ray.get(getattr(handle, method).remote(*params), timeout=args.timeout)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, ValueError | TimeoutError) else None
            if cause is not None:
                raise CommandError(str(cause)) from None
            raise
