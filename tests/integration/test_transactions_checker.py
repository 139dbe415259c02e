"""A Jepsen-style checker for transactions (issue 33, section 5): many transactional writers and read_committed
readers on a real 2-shard `kafscale serve` (embedded metadata, objects on S3 through a fault-injecting proxy),
while faults are injected: kill -9 of one shard's process, a stalled S3 (every request answered late), kill -9
of the other shard's process.

Writers (tests/integration/txn_workload.py): K transactional ids, each running transactions of two records in
each of two random partitions, committed or aborted at random (seeded); a transaction counts as committed only
when commit_transaction returned. Readers: R read_committed consumers of every partition from the beginning,
running through the faults, and one more started after them. At the end every writer's id is settled (a new
producer's InitProducerId ends whatever it left open) and a committed sentinel transaction goes to every
partition; each reader reads until it has the sentinels.

Checked for every reader: no record of an aborted or never-committed transaction; every committed transaction
complete, in every partition; a transaction whose commit failed (outcome unknown) complete or absent; no record
twice; each writer's records in writing order per partition. The faults must have happened (the shards' processes
were started again, the stall made requests late) and the writers must have made progress through them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kafscale.testing.faulty_s3 import FaultyS3Proxy
from kafscale.testing.s3_servers import MotoS3Server, unique_bucket_name
from kafscale.testing.serve_process import ServeProcess
from tests.integration.test_transactions_crashes import settle_and_check, shard_pids, start, summary, wait_until
from tests.integration.txn_workload import COMMITTED, Reader, TxnWriter, create_topic

TOPIC = "jepsen"
PARTITIONS = 6
WRITERS = 4
READERS = 2
PROGRESS = 4  # commits (over all writers) wanted between two faults
DEADLINE_S = 120.0


@pytest.fixture
def s3(moto_server: MotoS3Server) -> Iterator[tuple[FaultyS3Proxy, list[str]]]:
    bucket = unique_bucket_name("jepsen")
    proxy = FaultyS3Proxy(moto_server.endpoint_url, stall_s=1.5, seed=5)
    try:
        yield proxy, ["--s3-endpoint", proxy.endpoint_url, "--s3-bucket", bucket, "--s3-region", moto_server.region,
                      "--s3-access-key", moto_server.access_key, "--s3-secret-key", moto_server.secret_key]
    finally:
        proxy.close()


def test_transactions_under_shard_kills_and_a_stalled_s3(tmp_path: Path,
                                                          s3: tuple[FaultyS3Proxy, list[str]]) -> None:
    proxy, s3_args = s3
    serve = ServeProcess(tmp_path / "data", shards=2, extra_args=[*s3_args, "--flush-interval-ms", "20"])
    writers: list[TxnWriter] = []
    readers: list[Reader] = []
    try:
        start(serve)
        bootstrap = serve.bootstrap_all
        create_topic(bootstrap, TOPIC, PARTITIONS)
        pids = shard_pids(serve)
        assert set(pids) == {0, 1}, serve.log_text()[-2000:]
        writers = [TxnWriter(bootstrap, TOPIC, PARTITIONS, w, seed=33_000 + w, op_timeout_s=30)
                   for w in range(WRITERS)]
        readers = [Reader(bootstrap, TOPIC, PARTITIONS, f"live-{r}").start() for r in range(READERS)]
        for w in writers:
            w.start()

        def commits() -> int:
            return sum(w.count(COMMITTED) for w in writers)

        wait_until("commits before the first fault", lambda: commits() >= PROGRESS, DEADLINE_S)
        os.kill(pids[1], signal.SIGKILL)  # fault 1: shard 1's process
        mark = commits()
        wait_until("commits after shard 1's kill", lambda: commits() >= mark + PROGRESS, 2 * DEADLINE_S)
        stalled = proxy.faults["stall"]
        proxy.set_rates(stall=1.0)  # fault 2: every S3 request answered 1.5 s late, for 5 s
        time.sleep(5)
        proxy.set_rates()
        assert proxy.faults["stall"] > stalled, "no S3 request met the stall"
        mark = commits()
        wait_until("commits after the stall", lambda: commits() >= mark + PROGRESS, DEADLINE_S)
        os.kill(pids[0], signal.SIGKILL)  # fault 3: shard 0's process (the bootstrap address's)
        mark = commits()
        wait_until("commits after shard 0's kill", lambda: commits() >= mark + PROGRESS, 2 * DEADLINE_S)
        late = Reader(bootstrap, TOPIC, PARTITIONS, "late").start()
        readers.append(late)
        results = settle_and_check(bootstrap, TOPIC, PARTITIONS, "jepsen", writers, readers, DEADLINE_S)
        print(f"\njepsen: {summary(writers)}\n  readers: {results}\n  S3 faults: {dict(proxy.faults)}")
        assert commits() >= 4 * PROGRESS
        assert sum(w.count("aborted") for w in writers) >= 2, "the run aborted too little to check anything"
        # Each kill was a real failure, and Ray started both shards' processes again. Whether the controller
        # also healed a killed shard's work onto the other one is a race: the restarted shard may take its lease
        # back before the controller's next round finds it missing.
        killed = set(pids.values())
        wait_until("both shards running again in new processes",
                   lambda: len(running := serve.actor_pids("ShardActor")) == 2 and not set(running) & killed)
    finally:
        for w in writers:
            w._stop.set()
        for reader in readers:
            reader._stop.set()
        serve.kill()
