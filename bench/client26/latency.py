"""End-to-end latency as a user of Queen's 2.6 Python client sees it (issue 35, item 2).

The real client from PyPI (queen-mq 2.6.0, tests/compat/requirements-2.6.txt) is both the load
generator and the consumer, so its CPU is part of the figure, as it is for a user: producers push
paced batches spread over the partitions (one partition per push call), consumers run the
client's `consume()`; the handler reads the send time each payload carries and records
now − sent. One pattern per run:

  default   `consume()` with the client's defaults: autopilot on (the broker sizes batch and
            partitions), long poll, `concurrency(C)` workers, auto-ack of each batch
  oldstyle  the pattern of the issue: autopilot off, `batch(100)`, `partitions(1)`, long poll

Prints one JSON line: pattern, offered rate, partitions, produced, consumed, p50/p90/p99/max in
ms, the client's CPU seconds. bench/client26/run.sh starts the broker and runs the table.

    python latency.py --url http://127.0.0.1:6632 --pattern default --rate 2000 \
        --partitions 100 --seconds 20
"""

import argparse
import asyncio
import json
import resource
import time
import uuid

from queen import Queen


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def produce(client, queue, partitions, rate, producers, index, batch, until, counts):
    """One producer: every `batch * producers / rate` seconds a batch of `batch` messages to
    the next of its partitions (producer i takes partitions i, i+producers, ...)."""
    mine = list(range(index, partitions, producers)) or [index % partitions]
    period = batch * producers / rate
    turn = 0
    next_at = time.monotonic()
    while time.monotonic() < until:
        partition = f"p{mine[turn % len(mine)]}"
        turn += 1
        now = time.time()
        items = [{"data": {"t": now}} for _ in range(batch)]
        await client.queue(queue).partition(partition).push(items)
        counts["produced"] += batch
        next_at += period
        delay = next_at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            next_at = time.monotonic()  # behind: do not burst to catch up


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--pattern", choices=["default", "oldstyle"], default="default")
    ap.add_argument("--rate", type=float, default=2000.0, help="offered messages per second")
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0, help="measured producing time")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--consumers", type=int, default=8, help="consume() concurrency")
    ap.add_argument("--batch", type=int, default=10, help="messages per push call")
    args = ap.parse_args()

    queue = f"lat-{args.pattern}-{uuid.uuid4().hex[:8]}"
    client = Queen(url=args.url)
    await client.queue(queue).create()

    latencies = []
    counts = {"produced": 0, "consumed": 0}
    measuring = {"from": None}

    async def handler(messages):
        now = time.time()
        batch = messages if isinstance(messages, list) else [messages]
        for m in batch:
            counts["consumed"] += 1
            sent = (m.get("data") or {}).get("t")
            if sent is not None and measuring["from"] is not None and sent >= measuring["from"]:
                latencies.append((now - sent) * 1000.0)

    builder = client.queue(queue).group("latency").concurrency(args.consumers)
    if args.pattern == "oldstyle":
        builder = builder.autopilot(False).batch(100).partitions(1)
    stop = asyncio.Event()
    consumer = asyncio.create_task(_await(builder.consume(handler, signal=stop)))

    cpu0 = cpu_seconds()
    start = time.monotonic()
    warm_until = start + args.warmup
    until = warm_until + args.seconds
    producers = [
        asyncio.create_task(produce(client, queue, args.partitions, args.rate, args.producers,
                                    i, args.batch, until, counts))
        for i in range(args.producers)
    ]
    await asyncio.sleep(args.warmup)
    measuring["from"] = time.time()
    produced_at_warm = counts["produced"]
    consumed_at_warm = counts["consumed"]
    await asyncio.gather(*producers)
    produced = counts["produced"] - produced_at_warm
    # Let what was produced drain (bounded), then stop the consumers.
    drain_until = time.monotonic() + 10.0
    while time.monotonic() < drain_until and counts["consumed"] < counts["produced"]:
        await asyncio.sleep(0.05)
    consumed = counts["consumed"] - consumed_at_warm
    stop.set()
    try:
        await asyncio.wait_for(consumer, timeout=10)
    except (asyncio.TimeoutError, Exception):  # the consumer's own shutdown is not measured
        consumer.cancel()
    cpu = cpu_seconds() - cpu0
    await client.close()

    latencies.sort()
    print(json.dumps({
        "pattern": args.pattern,
        "rate": args.rate,
        "partitions": args.partitions,
        "seconds": args.seconds,
        "produced": produced,
        "consumed": consumed,
        "consumedOverProduced": round(consumed / produced, 3) if produced else None,
        "samples": len(latencies),
        "p50Ms": percentile(latencies, 0.50),
        "p90Ms": percentile(latencies, 0.90),
        "p99Ms": percentile(latencies, 0.99),
        "maxMs": latencies[-1] if latencies else None,
        "clientCpuSeconds": round(cpu, 2),
    }))


async def _await(awaitable):
    return await awaitable


if __name__ == "__main__":
    asyncio.run(main())
