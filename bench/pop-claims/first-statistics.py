"""How long a new database's pop plans its write-order scan blind, and what that scan costs.

Starts the broker binary given on a fresh database of the PostgreSQL at $PG_URL (default
postgres://postgres@127.0.0.1:5432, the machine's own), pushes PER messages to each of
PARTITIONS partitions of one queue (in pushes of 1 000), then every half second runs
`EXPLAIN ANALYZE` of the one-statement pop's write-order scan (the `recent` CTE of
`storage::consume::statements::READY_SQL`, from watermark zero: every partition written since)
until it is planned as the ordered index scan, or WATCH seconds (default 90) have passed; then
runs `ANALYZE` itself if nobody had, and times the scan five more times. Prints one JSON line:
seconds from the last push until the plan was the index scan (null: not within WATCH), the
median execution time of the scan as planned before and after, and who analyzed
`queen.partitions` by then (manual analyses, the broker's included, and autovacuum's).

    python3 bench/pop-claims/first-statistics.py BROKER_BIN PARTITIONS PER

docs/history/benchmarks.md, "A new database's tables analyzed by the broker", runs it against a
broker that analyzes the tables it grows and one that leaves them to autovacuum.
"""
import json
import os
import statistics
import sys
import time

from lone_broker import lone_broker

SCAN = """
SELECT w.id, w.next_offset
  FROM queen.partitions w
 WHERE w.queue_id = (SELECT id FROM queen.queues WHERE name = 'fq')
   AND (w.last_write_xid, w.id) >= ((SELECT 0::int8), (SELECT 0::int8))
 ORDER BY w.last_write_xid, w.id
 LIMIT 16
"""


def main() -> None:
    binary = sys.argv[1]
    parts, per = int(sys.argv[2]), int(sys.argv[3])
    watch = float(os.environ.get("WATCH", "90"))
    with lone_broker(binary, "first_stats") as b:

        def scan():
            plan = json.loads(b.sql("EXPLAIN (ANALYZE, FORMAT JSON) " + SCAN))[0]
            nodes, todo = [], [plan["Plan"]]
            while todo:
                n = todo.pop()
                nodes.append(n)
                todo.extend(n.get("Plans", []))
            on = [n["Node Type"] for n in nodes if n.get("Relation Name") == "partitions"]
            return on[0], plan["Execution Time"]

        items = [{"queue": "fq", "partition": f"p{i}", "payload": {"n": k}}
                 for k in range(per) for i in range(parts)]
        for i in range(0, len(items), 1000):
            status, _ = b.call("POST", "/api/v1/push", {"items": items[i:i + 1000]})
            if status not in (200, 201):
                raise SystemExit(f"push answered {status}")
        pushed = time.monotonic()
        blind, flipped = [], None
        while time.monotonic() - pushed < watch:
            node, ms = scan()
            if node == "Index Scan":
                flipped = round(time.monotonic() - pushed, 1)
                break
            blind.append(ms)
            time.sleep(0.5)
        analyses = b.sql("SELECT analyze_count || ' ' || autoanalyze_count"
                         " FROM pg_stat_user_tables WHERE relid = 'queen.partitions'::regclass"
                         ).split()
        if flipped is None:
            b.sql("ANALYZE queen.partitions")
        after = [scan() for _ in range(5)]
        print(json.dumps({
            "bin": binary, "partitions": parts, "per": per, "watch_s": watch,
            "index_scan_after_s": flipped,
            "blind_scans": len(blind),
            "blind_median_ms": round(statistics.median(blind), 2) if blind else None,
            "after_plan": after[-1][0],
            "after_median_ms": round(statistics.median(ms for _, ms in after), 2),
            "partitions_analyses": {"manual": int(analyses[0]), "autovacuum": int(analyses[1])},
        }))


if __name__ == "__main__":
    main()
