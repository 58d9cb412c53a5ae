"""The queen-mq 2.6.0 Stream runtime (`queen.streams`) against the broker's /streams/v1/* routes.

Real pipelines built with the SDK's builder, each on queues unique to this run, each checked for
its exact output on the sink (every record once, in order):

- map / filter / key_by → sink, over two source partitions;
- a processing-time tumbling window with aggregate, closed by the idle flush (the ripe read);
- a session window per key (key_by) with aggregate, closed by the idle flush;
- a gate (a per-key budget) that denies mid-batch: partial acks with release_lease=false, the
  denied tail redelivered in order after the lease runs out;
- with --broker BIN: an event-time tumbling window whose broker is killed with SIGKILL mid-run,
  while a cycle is in flight, and started again on the same port; the pipeline resumes and the
  sink is still exact;
- with --pg-restart CMD: the same pipeline on the shared broker while its PostgreSQL is
  restarted (immediate shutdown: the server's crash path) with a cycle in flight.

Producers push and the checks read the sink through the broker at URL (the shared one). The
restart flow starts a second broker of its own (BIN, against DATABASE_URL, the same database)
for the pipeline, so the shared broker is never interrupted.

Usage: python streams26.py http://127.0.0.1:PORT [--broker path/to/queen-broker]
       (tests/compat/run.sh does the set-up)
"""

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid

import httpx
from queen import Queen
from queen.streams import Stream

RUN = uuid.uuid4().hex[:8]


def q(name: str) -> str:
    return f"streams26-{RUN}-{name}"


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


class Broker:
    """The shared broker: set-up, pushes and sink reads over plain HTTP."""

    def __init__(self, url: str):
        self.url = url
        self.http = httpx.AsyncClient(base_url=url, timeout=30)

    async def configure(self, queue: str, **options) -> None:
        r = await self.http.post("/api/v1/configure", json={"queue": queue, "options": options})
        check(r.status_code == 200, f"configure {queue}: {r.status_code} {r.text}")

    async def push(self, queue: str, partition: str, payloads: list) -> None:
        items = [{"queue": queue, "partition": partition, "payload": p} for p in payloads]
        r = await self.http.post("/api/v1/push", json={"items": items})
        check(r.status_code == 201, f"push: {r.status_code} {r.text}")
        # `buffered` (PostgreSQL away: spooled, replayed in order) is a promise too.
        check(all(x["status"] in ("queued", "buffered") for x in r.json()), f"push: {r.text}")

    async def drain(self, queue: str, partition: str, group: str) -> list:
        """Everything new on a sink partition for a reading group (committed at delivery)."""
        out = []
        while True:
            r = await self.http.get(
                f"/api/v1/pop/queue/{queue}/partition/{partition}",
                params={"batch": 1000, "autoAck": "true", "consumerGroup": group},
            )
            if r.status_code in (204, 503):  # nothing new, or PostgreSQL not back yet
                return out
            check(r.status_code == 200, f"pop {queue}/{partition}: {r.status_code} {r.text}")
            msgs = r.json().get("messages", [])
            if not msgs:
                return out
            out.extend(m["data"] for m in msgs)

    async def collect(self, queue: str, expected: dict, timeout: float = 60) -> dict:
        """Reads every sink partition of `expected` until each holds as many records as
        expected (or `timeout`), then a moment more so extra records would show."""
        group = f"verify-{uuid.uuid4().hex[:6]}"
        got = {p: [] for p in expected}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in expected:
                got[p].extend(await self.drain(queue, p, group))
            if all(len(got[p]) >= len(expected[p]) for p in expected):
                await asyncio.sleep(1.0)
                for p in expected:
                    got[p].extend(await self.drain(queue, p, group))
                return got
            await asyncio.sleep(0.2)
        return got


def assert_exact(got: dict, expected: dict, what: str) -> None:
    for p in expected:
        check(got[p] == expected[p], f"{what}, partition {p}:\n  got      {got[p]}\n  expected {expected[p]}")


async def run_stream(stream, name: str, url: str, **opts):
    return await stream.run(query_id=name, url=url, **opts)


async def flow_map_filter_key_by(shared: Broker, url: str) -> None:
    src, sink = q("mfk-src"), q("mfk-sink")
    client = Queen(url=url)
    try:
        for p in ("p0", "p1"):
            await shared.push(src, p, [{"n": n, "p": p} for n in range(100)])
        stream = (
            Stream.from_(client.queue(src))
            .filter(lambda m: m["data"]["n"] % 3 != 0)
            .map(lambda m: {"n": m["data"]["n"], "sq": m["data"]["n"] ** 2, "p": m["data"]["p"]})
            .key_by(lambda m: m["data"]["n"] % 2)
            .to(client.queue(sink))
        )
        runner = await run_stream(stream, q("mfk"), url, batch_size=25)
        try:
            expected = {
                p: [{"n": n, "sq": n * n, "p": p} for n in range(100) if n % 3 != 0] for p in ("p0", "p1")
            }
            assert_exact(await shared.collect(sink, expected), expected, "map/filter/key_by")
        finally:
            await runner.stop()
        check(runner.metrics()["errorsTotal"] == 0, f"runner errors: {runner.metrics()}")
    finally:
        await client.close()


async def flow_tumbling_idle_flush(shared: Broker, url: str) -> None:
    src, sink = q("tumb-src"), q("tumb-sink")
    client = Queen(url=url)
    try:
        stream = (
            Stream.from_(client.queue(src))
            .window_tumbling(seconds=1, idle_flush_ms=200)
            .aggregate({"count": lambda d: 1, "sum": lambda d: d["v"]})
            .to(client.queue(sink))
        )
        runner = await run_stream(stream, q("tumb"), url)
        try:
            # Each burst is one push: one arrival time, so one window per partition, closed by
            # the idle flush once the wall clock passes its end.
            expected = {"p0": [], "p1": []}
            for burst in range(2):
                for i, p in enumerate(("p0", "p1")):
                    values = [burst * 1000 + i * 100 + n for n in range(50)]
                    await shared.push(src, p, [{"v": v} for v in values])
                    expected[p].append({"count": 50, "sum": sum(values)})
                await asyncio.sleep(2.2)  # the next burst lands in a later window
            assert_exact(await shared.collect(sink, expected), expected, "tumbling window")
        finally:
            await runner.stop()
        check(runner.metrics()["flushCyclesTotal"] >= 2, f"idle flush never ran: {runner.metrics()}")
    finally:
        await client.close()


async def flow_session_idle_flush(shared: Broker, url: str) -> None:
    src, sink = q("sess-src"), q("sess-sink")
    client = Queen(url=url)
    try:
        stream = (
            Stream.from_(client.queue(src))
            .key_by(lambda m: m["data"]["user"])
            .window_session(gap=0.5, idle_flush_ms=200)
            .aggregate({"count": lambda d: 1, "sum": lambda d: d["v"]})
            .map(lambda acc, ctx=None: {**acc, "user": (ctx or {}).get("key")})
            .to(client.queue(sink))
        )
        runner = await run_stream(stream, q("sess"), url)
        try:
            expected = {"p0": []}
            for burst in range(2):
                payloads = [{"user": f"u{n % 3}", "v": burst * 100 + n} for n in range(30)]
                await shared.push(src, "p0", payloads)
                for u in range(3):
                    mine = [x["v"] for x in payloads if x["user"] == f"u{u}"]
                    expected["p0"].append({"count": len(mine), "sum": sum(mine), "user": f"u{u}"})
                await asyncio.sleep(1.5)  # past the gap: the sessions close before the next burst
            got = await shared.collect(sink, expected)
            # One flush closes a burst's three sessions together; compare each burst as a set.
            key = lambda r: (r["sum"], r["user"])  # noqa: E731
            got_bursts = [sorted(got["p0"][i:i + 3], key=key) for i in (0, 3)]
            want_bursts = [sorted(expected["p0"][i:i + 3], key=key) for i in (0, 3)]
            check(len(got["p0"]) == 6 and got_bursts == want_bursts,
                  f"session window:\n  got      {got['p0']}\n  expected {expected['p0']}")
        finally:
            await runner.stop()
    finally:
        await client.close()


async def flow_gate_partial_acks(shared: Broker, url: str) -> None:
    src, sink = q("gate-src"), q("gate-sink")
    await shared.configure(src, leaseTime=1)
    client = Queen(url=url)

    def budget(value, ctx):
        # 10 messages per key per 300 ms of stream time; the rest of a batch is denied.
        st = ctx.state
        slot = ctx.stream_time_ms // 300
        if st.get("slot") != slot:
            st["slot"], st["used"] = slot, 0
        if st["used"] >= 10:
            return False
        st["used"] += 1
        return True

    try:
        await shared.push(src, "p0", [{"n": n} for n in range(60)])
        stream = Stream.from_(client.queue(src)).gate(budget).to(client.queue(sink))
        runner = await run_stream(stream, q("gate"), url)
        try:
            expected = {"p0": [{"n": n} for n in range(60)]}
            assert_exact(await shared.collect(sink, expected, timeout=90), expected, "gate")
        finally:
            await runner.stop()
        m = runner.metrics()
        check(m.get("gateDenialsTotal", 0) > 0, f"the gate never denied (no partial ack): {m}")
        check(m["errorsTotal"] == 0, f"runner errors: {m}")
    finally:
        await client.close()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class OwnBroker:
    """A broker process of this script's own, against the shared database."""

    def __init__(self, binary: str):
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="streams26-broker-")
        self.proc = None
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(self.port),
               "FILE_BUFFER_DIR": os.path.join(self.dir, "spool"), "QUEEN_CONFIG": "",
               "LOG_LEVEL": os.environ.get("LOG_LEVEL", "warn")}
        log = open(os.path.join(self.dir, "broker.log"), "ab")
        self.proc = subprocess.Popen([self.binary], env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=1) as http:
            while time.monotonic() < deadline:
                try:
                    if (await http.get(f"{self.url}/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError(f"own broker did not become healthy (log in {self.dir})")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def flow_restart(shared: Broker, binary: str | None = None, pg_restart: str | None = None) -> None:
    """An event-time tumbling window, and a fault while the runtime has a cycle in flight:
    with `binary`, the pipeline's own broker is SIGKILLed and started again; with `pg_restart`
    (a shell command), PostgreSQL is restarted (immediate shutdown) under the shared broker."""
    what = "broker SIGKILL" if binary else "PostgreSQL restart"
    tag = "restart" if binary else "pgrestart"
    src, sink = q(f"{tag}-src"), q(f"{tag}-sink")
    await shared.configure(src, leaseTime=2)
    own = OwnBroker(binary) if binary else None
    if own:
        await own.start()
    url = own.url if own else shared.url
    client = Queen(url=url)
    t0 = 1_700_000_000_000
    per_partition, chunk = 1000, 50
    try:
        stream = (
            Stream.from_(client.queue(src))
            .window_tumbling(seconds=1, event_time=lambda m: m["data"]["t"])
            .aggregate({"count": lambda d: 1, "sum": lambda d: d["v"]})
            .map(lambda acc, ctx=None: {**acc, "windowStart": (ctx or {}).get("windowStart")})
            .to(client.queue(sink))
        )
        runner = await run_stream(stream, q(tag), url, batch_size=100)

        async def produce() -> None:
            for start in range(0, per_partition, chunk):
                for p in ("p0", "p1"):
                    await shared.push(src, p, [{"t": t0 + i * 10, "v": i} for i in range(start, start + chunk)])
                await asyncio.sleep(0.15)
            # One event far ahead per partition: its watermark closes every window before it.
            for p in ("p0", "p1"):
                await shared.push(src, p, [{"t": t0 + 100_000, "v": 0}])

        producer = asyncio.create_task(produce())
        try:
            # Kill the pipeline's broker mid-run: once two windows of p0 went out, with more to
            # come (the producer is still pushing).
            seen, deadline = 0, time.monotonic() + 60
            while seen < 2 and time.monotonic() < deadline:
                seen += len(await shared.drain(sink, "p0", "kill-probe"))
                await asyncio.sleep(0.05)
            check(2 <= seen < per_partition // 100, f"{seen} windows of p0 out before the kill")
            check(not producer.done(), "the producer finished before the kill")
            # ... at the moment the runtime sends a cycle: the broker dies while the cycle is in
            # flight (before, during or after its commit, whichever the timing gives).
            sent = asyncio.Event()
            post = runner.http._client.post

            async def watched(url, *a, **kw):
                if url.endswith("/streams/v1/cycle"):
                    sent.set()
                return await post(url, *a, **kw)

            runner.http._client.post = watched
            await asyncio.wait_for(sent.wait(), timeout=30)
            if own:
                own.kill9()
                runner.http._client.post = post
                await asyncio.sleep(1.0)
                await own.start()
            else:
                runner.http._client.post = post
                done = await asyncio.to_thread(
                    subprocess.run, pg_restart, shell=True, capture_output=True, text=True)
                check(done.returncode == 0, f"PostgreSQL restart failed: {done.stderr}")
            await producer
            expected = {
                p: [{"count": 100, "sum": sum(range(k * 100, k * 100 + 100)), "windowStart": t0 + k * 1000}
                    for k in range(per_partition // 100)]
                for p in ("p0", "p1")
            }
            got = await shared.collect(sink, expected, timeout=120)
            assert_exact(got, expected, f"tumbling window across a {what}")
        finally:
            producer.cancel()
            await runner.stop()
        print(f"  {tag}: runner {runner.metrics()}")
    finally:
        await client.close()
        if own:
            own.stop()


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--broker", help="broker binary for the SIGKILL flow (its own process)")
    parser.add_argument("--pg-restart", help="shell command that restarts the shared broker's "
                        "PostgreSQL (immediate shutdown, then start): the PostgreSQL restart flow")
    args = parser.parse_args()
    shared = Broker(args.url)
    flows = [
        ("map / filter / key_by to a sink", lambda: flow_map_filter_key_by(shared, args.url)),
        ("tumbling window, idle flush", lambda: flow_tumbling_idle_flush(shared, args.url)),
        ("session window, idle flush", lambda: flow_session_idle_flush(shared, args.url)),
        ("gate with partial acks", lambda: flow_gate_partial_acks(shared, args.url)),
    ]
    if args.broker:
        flows.append(("broker SIGKILL mid-pipeline", lambda: flow_restart(shared, binary=args.broker)))
    if args.pg_restart:
        flows.append(("PostgreSQL restart mid-pipeline",
                      lambda: flow_restart(shared, pg_restart=args.pg_restart)))
    failed = 0
    for name, flow in flows:
        try:
            await asyncio.wait_for(flow(), timeout=180)
            print(f"PASS {name}")
        except Exception:  # noqa: BLE001 - every failure is reported, then counted
            print(f"FAIL {name}")
            traceback.print_exc()
            failed += 1
    await shared.http.aclose()
    print(f"streams26: {len(flows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
