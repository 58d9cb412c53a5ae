"""How long one queue-level pop takes in the broker, one client popping alone.

Starts the broker binary given on a fresh database of the PostgreSQL at $PG_URL (default
postgres://postgres@127.0.0.1:5432, the machine's own), pushes PER messages to each of
PARTITIONS partitions of one queue, runs ANALYZE (the statistics a running deployment has; set
ANALYZE=0 to keep a fresh database's), then pops POPS times with `batch=BATCH&partitions=CLAIM
&wait=false`, acking each answer in one batch ack (not timed). Prints one JSON line: the median
and p90 time of a pop as the client saw it, messages and partitions per pop, and how often
`queen.partitions` and `queen.partition_consumers` had been analyzed by then (by hand or by the
broker, and by autovacuum). With one client and
no other load, a pop's time is the broker's and PostgreSQL's.

    python3 bench/pop-claims/probe.py BROKER_BIN PARTITIONS PER BATCH CLAIM POPS

docs/history/benchmarks.md, "A pop's partitions claimed in one statement", runs it alternately
against two broker builds.
"""
import json
import os
import statistics
import sys
import time

from lone_broker import lone_broker


def main() -> None:
    binary = sys.argv[1]
    parts, per, batch, claim, pops = (int(a) for a in sys.argv[2:7])
    with lone_broker(binary, "pop_probe") as b:
        call = b.call
        items = [{"queue": "pq", "partition": f"p{i}", "payload": {"n": k}}
                 for k in range(per) for i in range(parts)]
        for i in range(0, len(items), 1000):
            status, body = call("POST", "/api/v1/push", {"items": items[i:i + 1000]})
            if status not in (200, 201):
                raise SystemExit(f"push answered {status}: {body}")
        time.sleep(1)
        if os.environ.get("ANALYZE", "1") == "1":
            b.sql("ANALYZE")
        times, counts, claimed = [], [], []
        for _ in range(pops):
            t = time.perf_counter()
            status, body = call("GET", f"/api/v1/pop/queue/pq?batch={batch}&partitions={claim}&wait=false")
            elapsed = time.perf_counter() - t
            if status == 204 or not body or not body.get("messages"):
                break
            msgs = body["messages"]
            times.append(elapsed * 1000)
            counts.append(len(msgs))
            claimed.append(len({m["partitionId"] for m in msgs}))
            acks = [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                     "leaseId": m["leaseId"], "status": "completed"} for m in msgs]
            status, body = call("POST", "/api/v1/ack/batch", {"acknowledgments": acks})
            if status != 200:
                raise SystemExit(f"ack answered {status}: {body}")
        if not times:
            raise SystemExit("no pop found a message")
        # Who had analyzed the tables by the end: (manual, autovacuum) analyses of each.
        analyses = b.sql(
            "SELECT relname, analyze_count, autoanalyze_count FROM pg_stat_user_tables"
            " WHERE schemaname = 'queen' AND relname IN ('partitions', 'partition_consumers')"
        ).split()
        print(json.dumps({
            "bin": binary, "partitions": parts, "per": per, "batch": batch, "claim": claim,
            "analyzed": os.environ.get("ANALYZE", "1") == "1", "pops": len(times),
            "median_ms": round(statistics.median(times), 2),
            "p90_ms": round(sorted(times)[int(len(times) * 0.9)], 2),
            "msgs_per_pop": round(statistics.mean(counts), 1),
            "partitions_per_pop": round(statistics.mean(claimed), 1),
            "analyses": {row.split("|")[0]: [int(n) for n in row.split("|")[1:]]
                         for row in analyses},
        }))


if __name__ == "__main__":
    main()
