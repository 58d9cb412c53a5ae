"""Compatibility check: Queen's official Python client (`queen-mq`) against our broker.

Runs the client's basic flows through its public API only: create/configure a queue, push,
pop with ack, consume with a consumer group, a transaction (ack + push), lease renewal, DLQ
listing, the admin reads, a queue with a size limit (`maxSize`) and an encrypted queue
(`encryptionEnabled`; run.sh starts the broker with a QUEEN_ENCRYPTION_KEY). The same flows run
with each pinned client version (run.sh: queen-mq 1.3.0 and 0.15.0). Each flow reports PASS, FAIL or SKIP; SKIP means the broker
answered 404 `no_such_route` for a route the flow needs (the route is not built yet), which
QUEEN_COMPAT_STRICT=1 turns into a failure.

Usage: python compat.py http://127.0.0.1:PORT   (tests/compat/run.sh does the set-up)
"""

import asyncio
import os
import sys
import traceback
import uuid

import httpx
from queen import Queen

BASE = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("QUEEN_URL", "http://127.0.0.1:6632")
RUN = uuid.uuid4().hex[:8]  # queue names unique per run, so a reused database does not interfere


def q(name: str) -> str:
    return f"compat-{RUN}-{name}"


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


# Which routes each flow needs; probed once with a request that cannot change anything.
PROBES = {
    "push": ("POST", "/api/v1/push", {"items": []}),
    "configure": ("POST", "/api/v1/configure", {}),
    "pop": ("GET", "/api/v1/pop/queue/compat-probe-no-such-queue", None),
    "ack": ("POST", "/api/v1/ack", {}),
    "transaction": ("POST", "/api/v1/transaction", {}),
    "lease": ("POST", "/api/v1/lease/compat-probe/extend", {}),
    "dlq": ("GET", "/api/v1/dlq?queue=compat-probe-no-such-queue", None),
    "resources": ("GET", "/api/v1/resources/queues", None),
    "messages": ("GET", "/api/v1/messages?limit=1", None),
}


async def missing_routes() -> set:
    missing = set()
    async with httpx.AsyncClient(base_url=BASE, timeout=10) as http:
        for name, (method, path, body) in PROBES.items():
            r = await http.request(method, path, json=body)
            if r.status_code == 404:
                try:
                    code = r.json().get("code")
                except ValueError:
                    code = None
                if code == "no_such_route":
                    missing.add(name)
    return missing


async def flow_configure(client: Queen) -> None:
    created = await client.queue(q("configure")).create()
    check(created.get("configured") is True, f"create answers configured: {created}")
    check(created["options"]["leaseTime"] == 300, f"default leaseTime: {created}")
    check(created["options"]["dedupWindowSeconds"] == 3600, f"default window: {created}")

    configured = (
        await client.queue(q("configure"))
        .namespace("compat")
        .task("check")
        .config({"lease_time": 60, "retry_limit": 5, "priority": 7, "dedup_window_seconds": 0})
        .create()
    )
    o = configured["options"]
    check(
        (o["leaseTime"], o["retryLimit"], o["priority"], o["maxSize"], o["dedupWindowSeconds"])
        == (60, 5, 7, 0, 0),
        f"options echoed: {configured}",
    )
    check(configured["namespace"] == "compat" and configured["task"] == "check", f"{configured}")

    # A full replace: configure without the window puts it back to 3600.
    reset = await client.queue(q("configure")).config({"lease_time": 60}).create()
    check(reset["options"]["dedupWindowSeconds"] == 3600, f"window reset: {reset}")
    check(reset["namespace"] == "", f"namespace reset: {reset}")

    # A wrongly typed option is refused with its name, not stored and ignored.
    try:
        await client.queue(q("configure")).config({"max_size": "ten"}).create()
    except Exception as e:  # the client raises with the broker's error text
        check("maxSize" in str(e), f"refusal names the option: {e}")
    else:
        raise AssertionError("max_size='ten' was accepted")


async def flow_push(client: Queen) -> None:
    name = q("push")
    await client.queue(name).create()
    results = await client.queue(name).push([{"data": {"n": 1}}, {"data": {"n": 2}}, {"data": None}])
    check([r["status"] for r in results] == ["queued"] * 3, f"queued: {results}")

    duplicates = []

    async def on_duplicate(items, error):
        duplicates.extend(items)

    first = await client.queue(name).partition("p1").push({"transactionId": "same", "data": 1})
    again = (
        await client.queue(name)
        .partition("p1")
        .push({"transactionId": "same", "data": 1})
        .on_duplicate(on_duplicate)
    )
    check(again[0]["status"] == "duplicate", f"duplicate: {again}")
    check(again[0]["message_id"] == first[0]["message_id"], "duplicate names the original")
    check(len(duplicates) == 1, "on_duplicate called once")


async def flow_admin(client: Queen) -> None:
    name = q("admin.reads")
    await client.queue(name).create()
    await client.queue(name).partition("p").push([{"data": {"k": "v", "n": 1.10}}])
    admin = client.admin
    queues = await admin.list_queues()
    check(any(x["name"] == name for x in queues["queues"]), "queue listed")
    detail = await admin.get_queue(name)
    check(detail["totals"]["total"] == 1, f"detail totals: {detail}")
    check({p["name"] for p in detail["partitions"]} == {"Default", "p"}, f"{detail}")
    check("namespaces" in await admin.get_namespaces(), "namespaces")
    check("tasks" in await admin.get_tasks(), "tasks")
    check("messages" in await admin.get_overview(), "overview")
    listed = await admin.list_messages(queue=name)
    check(len(listed["messages"]) == 1, f"messages listed: {listed}")
    m = listed["messages"][0]
    one = await admin.get_message(m["partitionId"], m["transactionId"])
    check(one["payload"] == {"k": "v", "n": 1.10}, f"payload: {one}")
    deleted = await client.queue(name).delete()
    check(deleted.get("deleted") is True, f"delete: {deleted}")
    try:
        await admin.get_queue(name)
    except Exception as e:
        check("Queue not found" in str(e), f"deleted queue is gone: {e}")
    else:
        raise AssertionError("deleted queue still answers")


async def flow_pop_ack(client: Queen) -> None:
    name = q("pop")
    await client.queue(name).create()
    await client.queue(name).push([{"data": {"n": n}} for n in range(3)])
    seen = []
    for _ in range(10):
        msgs = await client.queue(name).batch(2).wait(False).pop()
        if not msgs:
            break
        for m in msgs:
            check(m.get("partitionId") and m.get("leaseId"), f"pop message shape: {m}")
            seen.append(m["data"]["n"])
            ack = await client.ack(m, True)
            check(ack.get("success") is True, f"ack: {ack}")
    check(seen == [0, 1, 2], f"popped in order once each: {seen}")
    check(await client.queue(name).wait(False).pop() == [], "nothing left after acks")


async def flow_consume_group(client: Queen) -> None:
    name = q("consume")
    await client.queue(name).create()
    await client.queue(name).push([{"data": {"n": n}} for n in range(4)])
    for group in ("g1", "g2"):  # every group sees every message
        seen = []

        async def handler(message):
            seen.append(message["data"]["n"])

        await asyncio.wait_for(
            client.queue(name).group(group).batch(2).each().limit(4).timeout_millis(2000).consume(handler),
            timeout=60,
        )
        check(sorted(seen) == [0, 1, 2, 3], f"group {group} got everything: {seen}")
    leftover = await client.queue(name).group("g1").wait(False).pop()
    check(leftover == [], f"group g1 acked everything: {leftover}")


async def flow_transaction(client: Queen) -> None:
    source, target = q("tx-in"), q("tx-out")
    await client.queue(source).create()
    await client.queue(target).create()
    await client.queue(source).push({"data": {"step": 1}})
    msgs = await client.queue(source).wait(False).pop()
    check(len(msgs) == 1, f"popped the source message: {msgs}")
    result = await client.transaction().ack(msgs[0]).queue(target).push([{"data": {"step": 2}}]).commit()
    check(result.get("success") is True, f"transaction: {result}")
    out = await client.queue(target).wait(False).pop()
    check([m["data"] for m in out] == [{"step": 2}], f"pushed in the transaction: {out}")
    await client.ack(out[0], True)
    check(await client.queue(source).wait(False).pop() == [], "acked in the transaction")


async def flow_lease_renewal(client: Queen) -> None:
    name = q("lease")
    await client.queue(name).config({"lease_time": 2}).create()
    await client.queue(name).push({"data": "hold"})
    msgs = await client.queue(name).wait(False).pop()
    check(len(msgs) == 1, f"popped: {msgs}")
    # Queen's 1.3 client reads a dict from the renew reply while the protocol answers an array
    # (reference §14.1), so its own success flag cannot be trusted; the effect is what counts.
    await client.renew(msgs[0])
    await asyncio.sleep(3)  # past the 2 s lease: without the renewal the message would be redelivered
    again = await client.queue(name).wait(False).pop()
    check(again == [], f"renewed lease still held: {again}")
    ack = await client.ack(msgs[0], True)
    check(ack.get("success") is True, f"ack after renewal: {ack}")


async def flow_dlq(client: Queen) -> None:
    name = q("dlq")
    await client.queue(name).config({"retry_limit": 1}).create()
    await client.queue(name).push({"data": {"poison": True}})
    for _ in range(5):  # delivered, failed, redelivered, failed -> dead-lettered
        msgs = await client.queue(name).wait(False).pop()
        if not msgs:
            break
        await client.ack(msgs[0], False, {"error": "boom"})
    dlq = await client.queue(name).dlq().limit(10).get()
    messages = dlq.get("messages", [])
    check(len(messages) == 1, f"one dead letter: {dlq}")
    check(messages[0]["data"] == {"poison": True}, f"dead letter data: {messages[0]}")
    check(messages[0]["errorMessage"] == "boom", f"dead letter reason: {messages[0]}")


async def flow_max_size(client: Queen) -> None:
    name = q("bounded")
    created = await client.queue(name).config({"max_size": 3}).create()
    check(created["options"]["maxSize"] == 3, f"maxSize echoed: {created}")
    refused = []

    async def on_error(items, error):
        refused.append((items, str(error)))

    # The clients hand failed items to on_error with the broker's `error` text ...
    results = await client.queue(name).push([{"data": {"n": n}} for n in range(5)]).on_error(on_error)
    statuses = [r["status"] for r in results]
    check(statuses == ["queued"] * 3 + ["failed"] * 2, f"two beyond the limit fail: {results}")
    check(len(refused) == 1 and len(refused[0][0]) == 2, f"on_error got the two: {refused}")
    check(name in refused[0][1] and "maxSize 3" in refused[0][1], f"the error names the queue: {refused}")
    # ... and without a callback they raise it.
    try:
        await client.queue(name).push([{"data": {"n": 9}}])
    except Exception as e:
        check(name in str(e), f"the raised error names the queue: {e}")
    else:
        raise AssertionError("a push to the full queue did not fail")
    seen = []
    for _ in range(10):
        msgs = await client.queue(name).batch(3).wait(False).pop()
        if not msgs:
            break
        for m in msgs:
            seen.append(m["data"]["n"])
            ack = await client.ack(m, True)
            check(ack.get("success") is True, f"ack: {ack}")
    check(seen == [0, 1, 2], f"the three stored ones, in order: {seen}")
    again = await client.queue(name).push([{"data": {"n": 5}}])
    check(again[0]["status"] == "queued", f"consumed messages make room: {again}")


async def flow_encryption(client: Queen) -> None:
    name = q("vault")
    created = await client.queue(name).config({"encryption_enabled": True, "lease_time": 30}).create()
    check(created["options"]["encryptionEnabled"] is True, f"encryptionEnabled echoed: {created}")
    payloads = [{"card": "4111-1111-1111-1111", "amount": 12.50}, ["a", 1, None], "plain text"]
    results = await client.queue(name).push([{"data": p} for p in payloads])
    check([r["status"] for r in results] == ["queued"] * 3, f"queued: {results}")
    got = []
    for _ in range(10):
        msgs = await client.queue(name).batch(3).wait(False).pop()
        if not msgs:
            break
        for m in msgs:
            got.append(m["data"])
            ack = await client.ack(m, True)
            check(ack.get("success") is True, f"ack: {ack}")
    check(got == payloads, f"payloads come back decrypted and unchanged: {got}")
    listed = await client.admin.list_messages(queue=name)
    m = listed["messages"][0]
    one = await client.admin.get_message(m["partitionId"], m["transactionId"])
    check(one.get("isEncrypted") is True, f"the detail says encrypted: {one}")
    check(one["payload"] in payloads, f"the detail shows the payload decrypted: {one}")


FLOWS = [
    ("configure", flow_configure, {"configure"}),
    ("push", flow_push, {"configure", "push"}),
    ("admin", flow_admin, {"configure", "push", "resources", "messages"}),
    ("pop+ack", flow_pop_ack, {"configure", "push", "pop", "ack"}),
    ("consume with group", flow_consume_group, {"configure", "push", "pop", "ack"}),
    ("transaction", flow_transaction, {"configure", "push", "pop", "ack", "transaction"}),
    ("lease renewal", flow_lease_renewal, {"configure", "push", "pop", "ack", "lease"}),
    ("dlq listing", flow_dlq, {"configure", "push", "pop", "ack", "dlq"}),
    ("maxSize", flow_max_size, {"configure", "push", "pop", "ack"}),
    ("encryptionEnabled", flow_encryption, {"configure", "push", "pop", "ack", "messages"}),
]


async def main() -> int:
    strict = os.environ.get("QUEEN_COMPAT_STRICT") == "1"
    missing = await missing_routes()
    passed = failed = skipped = 0
    try:
        from importlib.metadata import version

        print(f"client: queen-mq {version('queen-mq')}", flush=True)
    except Exception:  # the version line is informative only
        pass
    client = Queen(BASE, retry_attempts=1)
    try:
        for name, flow, needs in FLOWS:
            absent = sorted(needs & missing)
            if absent:
                skipped += 1
                print(f"SKIP {name}: the broker has no route for {', '.join(absent)}", flush=True)
                continue
            try:
                await asyncio.wait_for(flow(client), timeout=120)
                passed += 1
                print(f"PASS {name}", flush=True)
            except Exception as e:  # report every flow, then fail the run
                failed += 1
                print(f"FAIL {name}: {e!r}", flush=True)
                traceback.print_exc()
    finally:
        await client.close()
    if strict and skipped:
        print(f"QUEEN_COMPAT_STRICT=1: {skipped} skipped flow(s) count as failed", flush=True)
        failed, skipped = failed + skipped, 0
    summary = f"{passed} passed, {failed} failed"
    print(f"{summary}, {skipped} skipped" if skipped else summary, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
