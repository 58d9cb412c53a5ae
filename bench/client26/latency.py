"""End-to-end latency as a user of Queen's 2.6 Python client sees it (issue 35, item 2).

The real client from PyPI (queen-mq 2.6.0, tests/compat/requirements-2.6.txt) is both the load
generator and the consumer, so its CPU is part of the figure, as it is for a user. One Python
process cannot push the rates asked for, so the load is several processes, each with its own
client and event loop (multiprocessing, spawn), sharing one start time; the parent merges what
they measured.

Every run uses a fresh queue. Up to `--touch-max` (1 000) partitions, they are touched first (one
message each, not measured), so the run measures existing partitions, not their creation; above
it (10 000) they are not (old-style pops would need one pop per touched partition to get past the
touch messages, minutes on this machine), so the measured pushes create most of them. Then,
from the shared start time: `--warmup` seconds, `--seconds` measured, then (with consumers) the
backlog drains for at most `--drain` seconds. A message is measured when its send time (carried
in the payload) falls inside the measured window; latency = handler time − send time.

  --pattern push-only  producers push flat out (batch `--batch`, no pacing), no consumers: the
                       push rate this client setup reaches; run.sh paces at 5 % and 50 % of it
  --pattern default    `consume()` with the client's defaults: autopilot on (the broker sizes
                       batch and partitions), long poll, auto-ack; `--consumer-procs` processes
                       × `concurrency(--concurrency)` workers
  --pattern oldstyle   the same with the issue's old pattern: autopilot off, `batch(100)`,
                       `partitions(1)`
  --pattern pinned     every consumer process owns a disjoint share of the partitions and runs
                       one `queue(q).partition(p).consume()` (defaults otherwise: autopilot
                       sizes the batch, long poll, concurrency 1) per partition it owns

Producers: `--producer-procs` processes × `--producer-tasks` tasks, each push call `--batch`
messages to one partition, round robin over the task's share of the partitions, paced so that
all of them together offer `--rate` msg/s (a task that falls behind does not burst).

Prints one JSON line: pattern, offered/produced/consumed rates, consumed ÷ produced (distinct
messages), p50/p90/p99/max in ms, the producers' and the consumers' CPU seconds.

    python latency.py --url http://127.0.0.1:6632 --pattern default --rate 2000 \
        --partitions 100 --seconds 15
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import sys
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
    return round(sorted_values[index], 2)


def share(partitions, index, count):
    """The partitions of member `index` of `count`: index, index+count, ..."""
    return list(range(index, partitions, count))


async def wait_event(event, step=0.01):
    while not event.is_set():
        await asyncio.sleep(step)


# ---------------------------------------------------------------------------------------------
# Producer process


def producer_main(index, args, shared, results):
    asyncio.run(producer(index, args, shared, results))


async def producer(index, args, shared, results):
    client = Queen(url=args.url)
    mine = share(args.partitions, index, args.producer_procs)

    # Touch every partition of this process once (not measured: t = 0).
    touch = asyncio.Semaphore(16)

    async def touch_one(p):
        async with touch:
            await client.queue(args.queue).partition(f"p{p}").push([{"data": {"t": 0, "k": -1}}])

    if args.partitions <= args.touch_max:
        await asyncio.gather(*(touch_one(p) for p in mine))
    with shared["ready"].get_lock():
        shared["ready"].value += 1
    await wait_event(shared["go"])

    start_at = shared["start_at"].value
    measure_from = start_at + args.warmup
    until = measure_from + args.seconds
    tasks_total = args.producer_procs * args.producer_tasks
    period = args.batch * tasks_total / args.rate if args.rate > 0 else 0.0
    stats = {"produced": 0, "calls": 0, "errors": 0, "behind": 0}
    cpu0 = None

    async def task(t):
        gid = index * args.producer_tasks + t  # global task id, part of each message's key
        parts = mine[t::args.producer_tasks] or [mine[t % len(mine)] if mine else 0]
        seq = 0
        turn = 0
        # Spread the tasks' first calls over one period instead of all at once.
        next_at = start_at + (period * gid / tasks_total if period else 0.0)
        await asyncio.sleep(max(0.0, next_at - time.time()))
        while time.time() < until:
            partition = f"p{parts[turn % len(parts)]}"
            turn += 1
            now = time.time()
            items = []
            for _ in range(args.batch):
                items.append({"data": {"t": now, "k": gid * 1_000_000_000 + seq}})
                seq += 1
            try:
                await client.queue(args.queue).partition(partition).push(items)
            except Exception as error:  # counted, named once on stderr
                if stats["errors"] == 0:
                    print(f"producer {index}: push failed: {error!r}", file=sys.stderr)
                stats["errors"] += 1
                continue
            if measure_from <= now < until:
                stats["produced"] += args.batch
                stats["calls"] += 1
            if period:
                next_at += period
                delay = next_at - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    stats["behind"] += 1
                    next_at = time.time()  # behind: do not burst to catch up

    await asyncio.sleep(max(0.0, start_at - time.time()))
    cpu0 = cpu_seconds()
    await asyncio.gather(*(task(t) for t in range(args.producer_tasks)))
    stats["cpu"] = cpu_seconds() - cpu0
    with shared["produced"].get_lock():
        shared["produced"].value += stats["produced"]
    await client.close()
    results.put(("producer", index, stats))


# ---------------------------------------------------------------------------------------------
# Consumer process


def consumer_main(index, args, shared, results):
    asyncio.run(consumer(index, args, shared, results))


async def consumer(index, args, shared, results):
    client = Queen(url=args.url)
    latencies = []
    keys = []
    window = {"from": None, "until": None}

    async def handler(messages):
        now = time.time()
        if window["from"] is None:
            start_at = shared["start_at"].value
            if start_at == 0.0:
                return
            window["from"] = start_at + args.warmup
            window["until"] = window["from"] + args.seconds
        lo, hi = window["from"], window["until"]
        n = 0
        for m in messages if isinstance(messages, list) else [messages]:
            data = m.get("data") or {}
            sent = data.get("t")
            if sent is not None and lo <= sent < hi:
                latencies.append((now - sent) * 1000.0)
                keys.append(data.get("k"))
                n += 1
        if n:
            with shared["consumed"].get_lock():
                shared["consumed"].value += n

    stop = asyncio.Event()
    group = "latency"
    if args.pattern == "pinned":
        runs = [
            client.queue(args.queue).group(group).partition(f"p{p}").consume(handler, signal=stop)
            for p in share(args.partitions, index, args.consumer_procs)
        ]
    else:
        builder = client.queue(args.queue).group(group).concurrency(args.concurrency)
        if args.pattern == "oldstyle":
            builder = builder.autopilot(False).batch(100).partitions(1)
        runs = [builder.consume(handler, signal=stop)]
    tasks = [asyncio.ensure_future(_await(r)) for r in runs]

    await wait_event(shared["go"], 0.05)
    cpu0 = cpu_seconds()
    await wait_event(shared["stop"], 0.05)
    cpu = cpu_seconds() - cpu0
    results.put(("consumer", index, {"latencies": latencies, "keys": keys, "cpu": cpu}))
    stop.set()
    await asyncio.wait(tasks, timeout=5)  # the consumers' own shutdown is not measured
    for t in tasks:
        t.cancel()
    try:
        await asyncio.wait_for(client.close(), timeout=5)
    except Exception:
        pass


async def _await(awaitable):
    return await awaitable


# ---------------------------------------------------------------------------------------------


async def create_queue(url, name):
    client = Queen(url=url)
    await client.queue(name).create()
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--pattern", choices=["push-only", "default", "oldstyle", "pinned"],
                    default="default")
    ap.add_argument("--rate", type=float, default=2000.0,
                    help="offered messages per second (ignored by push-only: flat out)")
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=15.0, help="measured producing time")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--drain", type=float, default=10.0)
    ap.add_argument("--producer-procs", type=int, default=4)
    ap.add_argument("--producer-tasks", type=int, default=8, help="push tasks per process")
    ap.add_argument("--consumer-procs", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4,
                    help="consume() workers per consumer process (default, oldstyle)")
    ap.add_argument("--batch", type=int, default=10, help="messages per push call")
    ap.add_argument("--touch-max", type=int, default=1000,
                    help="touch the partitions first only up to this many: a consumer that pops "
                         "one partition at a time needs a pop per touched partition to get past "
                         "them, which at 10 000 partitions outlasts the warm-up")
    ap.add_argument("--histogram", action="store_true",
                    help="also print the latencies' counts per 100 ms (the last bucket: the rest)")
    args = ap.parse_args()
    if args.pattern == "push-only":
        args.rate = 0.0
    args.queue = f"lat-{args.pattern}-{uuid.uuid4().hex[:8]}"
    load_before = os.getloadavg()[0]
    asyncio.run(create_queue(args.url, args.queue))

    ctx = mp.get_context("spawn")
    shared = {
        "ready": ctx.Value("i", 0),
        "start_at": ctx.Value("d", 0.0),
        "produced": ctx.Value("q", 0),
        "consumed": ctx.Value("q", 0),
        "go": ctx.Event(),
        "stop": ctx.Event(),
    }
    results = ctx.Queue()
    consumer_procs = 0 if args.pattern == "push-only" else args.consumer_procs
    procs = [ctx.Process(target=consumer_main, args=(i, args, shared, results))
             for i in range(consumer_procs)]
    procs += [ctx.Process(target=producer_main, args=(i, args, shared, results))
              for i in range(args.producer_procs)]
    for p in procs:
        p.start()

    deadline = time.time() + 120
    while shared["ready"].value < args.producer_procs:
        if time.time() > deadline or not all(p.is_alive() for p in procs):
            raise SystemExit("producers did not get ready (touching the partitions)")
        time.sleep(0.05)
    time.sleep(0.5)  # the consumers' first long polls
    start_at = time.time() + 0.5
    shared["start_at"].value = start_at
    shared["go"].set()
    until = start_at + args.warmup + args.seconds

    producers, consumers = {}, {}
    while len(producers) < args.producer_procs:
        kind, index, stats = results.get(timeout=until - time.time() + 60)
        (producers if kind == "producer" else consumers)[index] = stats
    produced = sum(s["produced"] for s in producers.values())
    drained_at = time.time()
    if consumer_procs:
        drain_until = time.time() + args.drain
        while time.time() < drain_until and shared["consumed"].value < produced:
            time.sleep(0.05)
        drained_at = time.time()
    shared["stop"].set()
    while len(consumers) < consumer_procs:
        kind, index, stats = results.get(timeout=60)
        consumers[index] = stats
    for p in procs:
        p.join(timeout=15)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)

    latencies = sorted(x for s in consumers.values() for x in s["latencies"])
    keys = [k for s in consumers.values() for k in s["keys"]]
    distinct = len(set(keys))
    line = {
        "pattern": args.pattern,
        "partitions": args.partitions,
        "seconds": args.seconds,
        "batch": args.batch,
        "producerProcs": args.producer_procs,
        "producerTasks": args.producer_procs * args.producer_tasks,
        "offeredRate": None if args.pattern == "push-only" else args.rate,
        "produced": produced,
        "producedRate": round(produced / args.seconds, 1),
        "pushCalls": sum(s["calls"] for s in producers.values()),
        "pushErrors": sum(s["errors"] for s in producers.values()),
        "behindCalls": sum(s["behind"] for s in producers.values()),
        "touched": args.partitions <= args.touch_max,
        "producersCpuSeconds": round(sum(s["cpu"] for s in producers.values()), 2),
        # The machine's 1-minute load average before and after the run (2 cores, shared).
        "loadAvg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }
    if consumer_procs:
        line.update({
            "consumerProcs": consumer_procs,
            "consumed": distinct,
            "duplicates": len(keys) - distinct,
            "consumedRate": round(distinct / args.seconds, 1),
            "consumedOverProduced": round(distinct / produced, 4) if produced else None,
            "drainSeconds": round(drained_at - until, 2),
            "p50Ms": percentile(latencies, 0.50),
            "p90Ms": percentile(latencies, 0.90),
            "p99Ms": percentile(latencies, 0.99),
            "maxMs": round(latencies[-1], 2) if latencies else None,
            "consumersCpuSeconds": round(sum(s["cpu"] for s in consumers.values()), 2),
        })
    if args.histogram and latencies:
        counts = [0] * 31
        for x in latencies:
            counts[min(30, int(x // 100))] += 1
        line["histogram100Ms"] = counts
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
