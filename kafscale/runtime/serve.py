"""`kafscale serve`: start (or join) Ray, bring up the controller and its shards, run until signalled."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
from pathlib import Path

from kafscale.config import BrokerConfig
from kafscale.runtime.local_head import LocalRayHead, ray_environment

log = logging.getLogger("kafscale.serve")
RAY_NAMESPACE = "kafscale"


def _start_ray(config: BrokerConfig) -> LocalRayHead | None:
    """Join the configured cluster, or start a private local head bound to 127.0.0.1."""
    import ray

    head = None
    address = config.ray_address
    if not address:
        head = LocalRayHead()
        address = head.start()
        log.info("started a local Ray head at %s", address)
    extra = {"_node_ip_address": "127.0.0.1"} if head is not None else {}
    ray.init(address=address, namespace=RAY_NAMESPACE, log_to_driver=True, configure_logging=False, **extra)
    return head


def serve(config: BrokerConfig) -> int:
    if not config.ray_address:
        # Read by Ray when it is imported: set before the first `import ray`.
        os.environ.update(ray_environment())
    import ray

    from kafscale.runtime.controller import CONTROLLER_NAME, Controller
    from kafscale.runtime.shard_actor import shard_actor_name

    # Ray workers do not share our working directory: hand them absolute paths.
    config = dataclasses.replace(config, data_dir=str(Path(config.data_dir).resolve()))
    if not config.s3_bucket or not config.etcd_endpoints:
        Path(config.data_dir).mkdir(parents=True, exist_ok=True)
    head = _start_ray(config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    controller = None
    try:
        controller = Controller.options(name=CONTROLLER_NAME, namespace=RAY_NAMESPACE).remote(
            dataclasses.asdict(config), RAY_NAMESPACE)
        addresses = ray.get(controller.start.remote())
        status = {s["shard"]: s for s in ray.get(controller.status.remote())}
        for shard_id, host, port in addresses:
            info = status[shard_id]
            log.info("shard %d listening on %s:%d (Ray actor %s, pid %d, %s event loop, GC skips %d startup "
                     "objects, thresholds %s)", shard_id, host, port, shard_actor_name(shard_id), info["pid"],
                     info["event_loop"], info["frozen_objects"], info["gc_thresholds"])
        stores = ("etcd " + config.etcd_endpoints) if config.etcd_endpoints else f"embedded in {config.data_dir}"
        objects = f"s3://{config.s3_bucket}/{config.s3_namespace}" if config.s3_bucket else f"{config.data_dir}/objects"
        log.info("ready: %d shards, metadata %s, objects %s", len(addresses), stores, objects)
        while not stop.wait(0.5):
            pass
        log.info("stopping: flushing partitions")
        ray.get(controller.stop.remote(), timeout=60)
        log.info("stopped")
        return 0
    finally:
        if controller is not None:
            with contextlib.suppress(Exception):
                ray.kill(controller)
        ray.shutdown()
        if head is not None:
            head.stop()
