"""Compatibility flows with Queen's 2.x Python client (`queen-mq` 2.6.0), the project's own.

The 2.x surfaces through the client's public API only, each flow on queue and key names unique
to this run: KV (put/get/incr with a limit/once), a lock and a semaphore with fencing tokens and
a guarded transaction, timers (schedule → delivered message with the timer's txn, cancel),
transactions with KV riders (a lost precondition is returned, nothing applied), the ack window
(a batch with a nack clamps the cursor), reads by offset (fetch, changed_since) and a default
consume (autopilot on). Each flow reports PASS, FAIL or SKIP; SKIP means the broker answered 404
`no_such_route` for a route the flow needs, which QUEEN_COMPAT_STRICT=1 turns into a failure.

Usage: python compat26.py http://127.0.0.1:PORT   (tests/compat/run.sh does the set-up)
"""

import asyncio
import os
import sys
import time
import traceback
import uuid

import httpx
from queen import Queen

BASE = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("QUEEN_URL", "http://127.0.0.1:6632")
RUN = uuid.uuid4().hex[:8]
NS = f"compat26-{RUN}"


def q(name: str) -> str:
    return f"compat26-{RUN}-{name}"


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


PROBES = {
    "kv": ("POST", "/api/v1/kv", {"operations": [{"op": "get", "ns": "probe", "key": "probe"}]}),
    "locks": ("POST", "/api/v1/locks", {"operations": [{"op": "get", "name": "probe"}]}),
    "timers": ("GET", "/api/v1/timers/compat-probe-no-such-queue", None),
    "fetch": ("POST", "/api/v1/fetch", {"entries": []}),
    "changed": ("POST", "/api/v1/partitions/changed", {"entries": []}),
}


async def missing_routes() -> set:
    missing = set()
    async with httpx.AsyncClient(base_url=BASE, timeout=10) as http:
        for name, (method, path, body) in PROBES.items():
            r = await http.request(method, path, json=body)
            if r.status_code == 404 and "no_such_route" in r.text:
                missing.add(name)
    return missing


async def flow_kv(client: Queen) -> None:
    put = await client.kv.put(NS, "k:1", {"n": 1}, ttl_seconds=60)
    check(put["applied"] is True and put["version"] > 0, f"put: {put}")
    got = await client.kv.get(NS, "k:1")
    check(got["found"] and got["value"] == {"n": 1} and got["version"] == put["version"], f"get: {got}")
    again = await client.kv.put(NS, "k:1", {"n": 2}, ttl_seconds=60, expect=put["version"])
    check(again["applied"] and again["version"] > put["version"], f"put with expect: {again}")
    stale = await client.kv.put(NS, "k:1", {"n": 3}, ttl_seconds=60, expect=put["version"])
    check(stale["applied"] is False and stale["reason"] == "version", f"stale expect: {stale}")
    values = [await client.kv.incr(NS, "counter", delta=1, max=2, ttl_seconds=60) for _ in range(3)]
    check([v["applied"] for v in values] == [True, True, False], f"incr with max: {values}")
    check(values[2]["reason"] == "limit" and int(values[2]["value"]) == 2, f"refused incr: {values[2]}")
    check((await client.kv.once(NS, "once", ttl_seconds=60)) is True, "first once")
    check((await client.kv.once(NS, "once", ttl_seconds=60)) is False, "second once")
    deleted = await client.kv.delete(NS, "k:1")
    check(deleted["applied"] is True, f"delete: {deleted}")
    check((await client.kv.get(NS, "k:1"))["found"] is False, "deleted key still found")
    recreated = await client.kv.put(NS, "k:1", {"n": 4}, ttl_seconds=60)
    check(recreated["version"] > again["version"], "a version after a delete is not higher")


async def flow_locks(client: Queen) -> None:
    name = f"compat26-{RUN}-lock"
    a = client.lock(name, ttl_seconds=30)
    b = client.lock(name, ttl_seconds=30)
    check(await a.acquire() is True, "first handle did not acquire")
    check(await b.acquire() is False, "second handle acquired a held lock")
    first_token = a.token
    res = await client.transaction().guard(a).queue(q("locked")).push([{"data": {"step": 1}}]).commit()
    check(res["success"] is True, f"guarded step: {res}")
    check(await a.release() is True, "release")
    check(await b.acquire() is True, "free after release")
    check(b.token > first_token, "the next holder's token is not higher")
    await b.release()
    sem = [client.semaphore(f"{name}-sem", 2, ttl_seconds=30) for _ in range(3)]
    granted = [await s.acquire() for s in sem]
    check(granted == [True, True, False], f"semaphore of 2: {granted}")
    for s in sem[:2]:
        await s.release()


async def flow_timers(client: Queen) -> None:
    queue = q("timers")
    txn = f"compat26-{RUN}-timer"
    res = await client.timers.schedule(queue, "remind/me", {"hello": "timer"}, delay_ms=300, txn=txn)
    check(res["ok"] is True and res["status"] == "scheduled", f"schedule: {res}")
    cancel_me = await client.timers.schedule(queue, "never", {"x": 1}, delay_ms=60_000)
    check(cancel_me["status"] == "scheduled", f"second schedule: {cancel_me}")
    cancelled = await client.timers.cancel(queue, "never")
    check(cancelled["status"] == "cancelled", f"cancel: {cancelled}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        msgs = await client.queue(queue).batch(10).wait(False).pop()
        if msgs:
            check(len(msgs) == 1, f"one message per fired timer: {msgs}")
            check(msgs[0]["data"] == {"hello": "timer"}, f"fired data: {msgs[0]}")
            check(msgs[0]["transactionId"] == txn, f"fired transactionId: {msgs[0]}")
            await client.ack(msgs[0], True)
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the timer did not fire within 20 s")


async def flow_transaction_riders(client: Queen) -> None:
    queue = q("riders")
    first = await client.transaction().queue(queue).push([{"data": {"n": 1}}]).once(NS, "gate", ttl_seconds=60).commit()
    check(first["success"] is True, f"first gate: {first}")
    second = await client.transaction().queue(queue).push([{"data": {"n": 2}}]).once(NS, "gate", ttl_seconds=60).commit()
    check(second["success"] is False and second["reason"] == "kv_precondition", f"second gate: {second}")
    msgs = await client.queue(queue).batch(10).wait(False).pop()
    check([m["data"] for m in msgs] == [{"n": 1}], f"only the first bundle's push exists: {msgs}")
    await client.ack(msgs, True)


async def flow_ack_window(client: Queen) -> None:
    queue = q("window")
    await client.queue(queue).create()
    await client.queue(queue).push([{"data": {"i": i}} for i in range(4)])
    msgs = await client.queue(queue).batch(4).wait(False).pop()
    check(len(msgs) == 4, f"popped {len(msgs)} of 4")
    results = await client.ack([msgs[0], {**msgs[1], "_status": "failed"}, msgs[2], msgs[3]], True)
    again = await client.queue(queue).batch(4).wait(False).pop()
    check([m["data"]["i"] for m in again] == [1, 2, 3], f"after a nack of #1 the rest redelivers: {again} ({results})")
    await client.ack(again, True)


async def flow_reads(client: Queen) -> None:
    queue = q("reads")
    for p in ("a", "b"):
        await client.queue(queue).partition(p).push([{"transactionId": f"{p}-{i}", "data": {"i": i}} for i in range(3)])
    read = await client.queue(queue).fetch(["a", "b"])
    check(set(read) >= {"a", "b"}, f"fetch answered {read}")
    changed = await client.queue(queue).changed_since()
    names = sorted(p["name"] for p in changed["partitions"])
    check(names == ["a", "b"], f"changed partitions: {changed}")
    popped = await client.queue(queue).partition("a").batch(10).wait(False).pop()
    check(len(popped) == 3, "a read by offset moved a cursor")


async def flow_consume_default(client: Queen) -> None:
    queue = q("consume")
    await client.queue(queue).push([{"data": {"i": i}} for i in range(20)])
    seen = []

    async def handler(msg):
        seen.append(msg["data"]["i"])

    await client.queue(queue).limit(20).each().consume(handler)
    check(sorted(seen) == list(range(20)), f"consumed {seen}")


FLOWS = [
    ("kv", {"kv"}, flow_kv),
    ("locks", {"locks", "kv"}, flow_locks),
    ("timers", {"timers"}, flow_timers),
    ("transaction riders", {"kv"}, flow_transaction_riders),
    ("ack window", set(), flow_ack_window),
    ("reads by offset", {"fetch", "changed"}, flow_reads),
    ("consume with the client's defaults", set(), flow_consume_default),
]


async def main() -> int:
    strict = os.environ.get("QUEEN_COMPAT_STRICT") == "1"
    missing = await missing_routes()
    failed = 0
    client = Queen(url=BASE)
    try:
        for name, needs, flow in FLOWS:
            if needs & missing:
                print(f"SKIP {name} (no route: {', '.join(sorted(needs & missing))})")
                failed += strict
                continue
            try:
                await asyncio.wait_for(flow(client), timeout=60)
                print(f"PASS {name}")
            except Exception:  # noqa: BLE001 - every failure is reported, then counted
                print(f"FAIL {name}")
                traceback.print_exc()
                failed += 1
    finally:
        await client.close()
    print(f"compat26: {len(FLOWS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
