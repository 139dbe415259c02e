"""`kafscale serve --detach` on its own local Ray head, with the Ray dashboard; `kafscale cluster stop` ends it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from kafscale.testing.ports import free_port
from kafscale.testing.ray_cluster import wait_until
from kafscale.testing.serve_process import ServeProcess


def kafscale(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kafscale.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def actors(dashboard: int) -> list[dict[str, Any]]:
    """Ray's state API, as the dashboard serves it."""
    url = f"http://127.0.0.1:{dashboard}/api/v0/actors?limit=100&detail=1"
    with urllib.request.urlopen(url, timeout=10) as response:
        return list(json.load(response)["data"]["result"]["result"])


@contextlib.contextmanager
def ray_errors_published(address: str, message: str) -> Iterator[None]:
    """The cluster's GCS publishes an error event to every driver, again and again, while the block runs."""
    from ray._private.utils import publish_error_to_driver
    from ray._raylet import GcsClient

    gcs, stop = GcsClient(address=address), threading.Event()

    def publish() -> None:
        while not stop.wait(0.05):
            publish_error_to_driver("test_error", message, gcs)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_a_detached_broker_outlives_its_command_shows_in_the_dashboard_and_stops_on_request(tmp_path: Path) -> None:
    data, port, dashboard = tmp_path / "data", free_port(), free_port()
    proc = kafscale("serve", "--detach", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}",
                    "--shards-per-node", "2", "--shard-ports", f"{port},{free_port()}", "--metrics-listen", "",
                    "--dashboard-port", str(dashboard))
    head = json.loads((data / "ray-head.json").read_text()) if (data / "ray-head.json").exists() else None
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        log = proc.stdout + proc.stderr
        assert f"Ray dashboard: http://127.0.0.1:{dashboard}" in log
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all"})
        producer.produce("detached", b"still here")
        assert producer.flush(30) == 0, "the detached broker does not serve"

        named = {a["name"]: a for a in actors(dashboard) if a["state"] == "ALIVE" and a.get("name")}
        assert {"kafscale-controller", "kafscale-metadata", "kafscale-shard-0", "kafscale-shard-1"} <= set(named)
        assert named["kafscale-shard-0"]["repr_name"] == f"Shard(id=0, node=127.0.0.1, listener=127.0.0.1:{port})"

        # Ray prints the cluster's error events (a node marked dead, ...) on a driver's stdout: JSON must stay alone.
        with ray_errors_published(head["address"], "a node was marked dead (published by the test)"):
            info = kafscale("cluster", "info", "--data-dir", str(data), "-o", "json")
        assert info.returncode == 0, info.stderr
        assert "published by the test" in info.stderr, "no Ray error event reached the command's stderr"
        shards = [s for n in json.loads(info.stdout)["nodes"] for s in n["shards"]]
        assert sorted(s["id"] for s in shards) == [0, 1] and all(s["live"] for s in shards)
        assert sum(len(s["partitions"]) for s in shards) == 1

        stopped = kafscale("cluster", "stop", "--data-dir", str(data))
        assert stopped.returncode == 0, stopped.stderr
        assert wait_until(lambda: not listening(port), 30), "the broker still listens after cluster stop"
        assert not (data / "ray-head.json").exists()
        assert wait_until(lambda: not _group_alive(head["pgid"]), 30), "the local Ray head outlived cluster stop"
    finally:
        if head is not None and _group_alive(head["pgid"]):  # the test failed half way: end what it started
            from kafscale.actors.local_head import end_session

            end_session(head["pgid"])


def test_cluster_commands_say_what_is_missing(tmp_path: Path) -> None:
    proc = kafscale("cluster", "stop", "--data-dir", str(tmp_path), timeout=60)
    assert proc.returncode == 1
    assert "no cluster to talk to" in proc.stderr
    started = time.monotonic()
    proc = kafscale("partition", "move", "t", "0", "--to", "1", "--ray-address", f"127.0.0.1:{free_port()}",
                    "--timeout", "5", timeout=120)
    assert proc.returncode == 1 and "cannot reach the Ray cluster" in proc.stderr, proc.stderr
    assert time.monotonic() - started < 90


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def test_the_embedded_metadata_actor_killed_is_restarted_and_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    from tests.cluster.clients import HEAL_BOUND_S, Traffic, assert_exactly_once, create_topic, read_all

    with ServeProcess(tmp_path / "data", shards=2, extra_args=["--flush-interval-ms", "20"]) as serve:
        create_topic(serve.bootstrap, "meta-kill", 2)
        traffic = Traffic(serve.bootstrap, "meta-kill", 2).start()  # librdkafka's default: 5 requests in flight
        time.sleep(2)
        killed_log = len(serve.log_text())
        actors = serve.actor_pids("MetadataStoreActor")
        assert len(actors) == 1, f"expected this broker's one metadata actor, found {actors}"
        killed_at = time.monotonic()
        os.kill(actors[0], signal.SIGKILL)
        healing = traffic.healed(killed_at, settle=12)
        traffic.stop()
        print(f"served again after the metadata actor's kill: { {p: round(t, 2) for p, t in healing.items()} } s")
        assert max(healing.values()) <= HEAL_BOUND_S, healing
        # The restarted store renews every lease (as etcd does): its outage is no shard's death, so nothing moves.
        # Once every lease lapsed instead, and the shards' re-registering in turn bounced partitions between them.
        assert "healed" not in serve.log_text()[killed_log:], "the store's restart moved partitions"
        assert_exactly_once(traffic, read_all(serve.bootstrap, "meta-kill", 2, traffic.ends()))
