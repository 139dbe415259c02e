"""`kafscale serve`: start (or join) Ray, bring up the controller and its shards, run until signalled.

The controller is a detached actor pinned to this node: it owns the shards (also detached, one set per
node), so the cluster does not depend on this process. Without --detach, this process stops the cluster
when signalled; with it, the command returns once the cluster serves and `kafscale cluster stop` ends it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from kafscale.actors.local_head import LocalRayHead, ray_environment
from kafscale.config import BrokerConfig
from kafscale.console.credentials import console_login_env
from kafscale.net import address_towards

log = logging.getLogger("kafscale.serve")
RAY_NAMESPACE = "kafscale"
HEAD_FILE = "ray-head.json"  # in --data-dir: how `kafscale cluster` commands find a detached local head
TRAVELLING_ENV = ("AWS_",)  # read by the stores in every shard, wherever it runs


class ServeError(Exception):
    """The cluster cannot be served as configured; the message says why and what to change."""


def _start_ray(config: BrokerConfig) -> LocalRayHead | None:
    """Join the configured cluster, or start a local head bound to 127.0.0.1."""
    import ray

    head = None
    address = config.ray_address
    if not address:
        head = LocalRayHead(dashboard_port=config.dashboard_port if config.dashboard else 0, detached=config.detach)
        address = head.start()
        log.info("started a local Ray head at %s", address)
        if config.dashboard:
            log.info("Ray dashboard: http://127.0.0.1:%d", config.dashboard_port)
        if config.detach:
            Path(config.data_dir, HEAD_FILE).write_text(json.dumps({"address": address, "pgid": head.pgid}))
    node_ip = "127.0.0.1" if head is not None else address_towards(address)
    extra = {"_node_ip_address": node_ip} if node_ip else {}
    ray.init(address=address, namespace=RAY_NAMESPACE, log_to_driver=not config.detach, configure_logging=False,
             **extra)
    return head


def check_cluster(config: BrokerConfig, nodes: list[dict[str, Any]]) -> None:
    alive = [n for n in nodes if n.get("Alive")]
    if len(alive) > 1 and not config.s3_bucket and not config.shared_data_dir:
        raise ServeError(
            f"this Ray cluster has {len(alive)} nodes, but the object store is the local directory"
            f" {config.data_dir}, which the other nodes cannot read: give --s3-bucket (and --etcd-endpoints),"
            " or --shared-data-dir if that directory is shared by every node")


def serve(config: BrokerConfig) -> int:
    if not config.ray_address:
        # Read by Ray when it is imported: set before the first `import ray`.
        os.environ.update(ray_environment())
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from kafscale.actors.controller import CONTROLLER_NAME, METADATA_ACTOR_NAME, Controller
    from kafscale.actors.shard_actor import shard_actor_name

    # Ray workers do not share our working directory: hand them absolute paths.
    config = dataclasses.replace(config, data_dir=str(Path(config.data_dir).resolve()))
    if not config.s3_bucket or not config.etcd_endpoints:
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
    head = _start_ray(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    controller = None
    detached = False
    try:
        try:
            check_cluster(config, ray.nodes())
        except ServeError as e:
            log.error("%s", e)
            return 2
        env = {k: v for k, v in os.environ.items() if k.startswith(TRAVELLING_ENV)}
        here = ray.get_runtime_context().get_node_id()
        if head is not None and not config.etcd_endpoint_list():
            # Only on a head of our own: in a running cluster, the controller there may use another store, and
            # an actor started here for it would be nobody's to stop.
            from kafscale.actors.metadata_actor import start_metadata_actor

            start_metadata_actor(METADATA_ACTOR_NAME, config, RAY_NAMESPACE, env, here)
        with contextlib.suppress(ValueError):  # ValueError: no controller runs yet
            ray.get_actor(CONTROLLER_NAME, namespace=RAY_NAMESPACE)
            if console_login_env(os.environ):
                log.warning("a controller already runs in this cluster: its console keeps the login it started "
                            "with (KAFSCALE_UI_USERNAME/PASSWORD here are not applied; restart the cluster to change "
                            "them)")
        controller = Controller.options(  # type: ignore[attr-defined]
            name=CONTROLLER_NAME, namespace=RAY_NAMESPACE, get_if_exists=True, lifetime="detached",
            runtime_env={"env_vars": env}, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        ).remote(dataclasses.asdict(config), RAY_NAMESPACE, env, console_login_env(os.environ))
        addresses = ray.get(controller.wait_ready.remote(120))
        status = {s["shard"]: s for s in ray.get(controller.status.remote())}
        for shard_id, host, port in addresses:
            info = status.get(shard_id)
            if info is None:
                log.info("shard %d listening on %s:%d", shard_id, host, port)
                continue
            log.info("shard %d listening on %s:%d (Ray actor %s, pid %d, %s event loop, GC skips %d startup "
                     "objects, thresholds %s)", shard_id, host, port, shard_actor_name(shard_id), info["pid"],
                     info["event_loop"], info["frozen_objects"], info["gc_thresholds"])
        stores = ("etcd " + config.etcd_endpoints) if config.etcd_endpoints else f"embedded in {config.data_dir}"
        objects = f"s3://{config.s3_bucket}/{config.s3_namespace}" if config.s3_bucket else f"{config.data_dir}/objects"
        nodes = len([n for n in ray.nodes() if n.get("Alive")])
        console = ray.get(controller.console_url.remote())
        if console:
            log.info("console: %s (log in with KAFSCALE_UI_USERNAME and KAFSCALE_UI_PASSWORD)", console)
        log.info("ready: %d shards on %d node(s), metadata %s, objects %s", len(addresses), nodes, stores, objects)
        if config.detach:
            detached = True
            log.info("detached: `kafscale cluster stop%s` stops it",
                     f" --ray-address {config.ray_address}" if config.ray_address else f" --data-dir {config.data_dir}")
            return 0
        while not stop.wait(0.5):
            pass
        return 0
    finally:
        if controller is not None and not detached:
            # Also after a failed start: the shards are detached and would otherwise outlive us.
            log.info("stopping: flushing partitions")
            try:
                ray.get(controller.stop.remote(), timeout=90)
                log.info("stopped")
            except Exception as e:
                log.error("the controller did not stop the shards cleanly: %s", e)
            with contextlib.suppress(Exception):
                ray.kill(controller, no_restart=True)
        ray.shutdown()
        if head is not None and not detached:
            head.stop()
