"""A producer flat out in its own process (tests that need load, away from their own threads and GIL).

python -m kafscale.testing.load_producer BOOTSTRAP TOPIC PARTITIONS SECONDS [MB_PER_S]: 10 KB records
(`load-N-xxx...`, each its own), acks=1,
round robin over the partitions, until SECONDS have passed or stdin closes, at most MB_PER_S (default: flat out).
Prints the records acknowledged.
"""

from __future__ import annotations

import sys
import threading
import time

from confluent_kafka import Producer

RECORD_BYTES = 10_000


def main(bootstrap: str, topic: str, partitions: int, seconds: float, mb_per_s: float = 0.0) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "compression.type": "none",
                         "queue.buffering.max.kbytes": 65536})
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    acked = [0]

    def delivered(err: object, _msg: object) -> None:
        acked[0] += err is None

    started = time.monotonic()
    deadline = started + seconds
    i = 0
    while not stop.is_set() and time.monotonic() < deadline:
        if mb_per_s and i * RECORD_BYTES > (time.monotonic() - started) * mb_per_s * 1e6:
            producer.poll(0.005)  # ahead of the rate: wait, serving delivery reports meanwhile
            continue
        try:
            value = b"load-%d-" % i
            producer.produce(topic, value=value.ljust(RECORD_BYTES, b"x"), partition=i % partitions,
                             on_delivery=delivered)
            i += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.flush(30)
    print(acked[0], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]),
                  float(sys.argv[5]) if len(sys.argv) > 5 else 0.0))
