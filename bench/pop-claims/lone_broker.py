"""A broker binary started alone on a fresh database, for the probes in this folder.

The database is made on the PostgreSQL at $PG_URL (default postgres://postgres@127.0.0.1:5432,
the machine's own) and dropped afterwards; the broker listens on a free loopback port, logs
at `warn` to a file in the temporary directory, and is stopped on the way out.

    with lone_broker(binary, "pop_probe") as b:
        status, body = b.call("POST", "/api/v1/push", {"items": [...]})
        b.sql("ANALYZE")
"""
import contextlib
import http.client
import json
import os
import socket
import subprocess
import tempfile
import time
import uuid


class LoneBroker:
    """The running broker: one HTTP connection to it and `psql` on its database."""

    def __init__(self, port: int, db_url: str):
        self.db_url = db_url
        self.conn = http.client.HTTPConnection("127.0.0.1", port)

    def call(self, method, path, body=None):
        """One request; the status and the answer's JSON (None when empty)."""
        self.conn.request(method, path, body=None if body is None else json.dumps(body),
                          headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else None

    def sql(self, text: str) -> str:
        """Runs one statement with psql on the broker's database; its unaligned output."""
        return subprocess.run(["psql", self.db_url, "-tAc", text], check=True,
                              capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def lone_broker(binary: str, tag: str):
    base = os.environ.get("PG_URL", "postgres://postgres@127.0.0.1:5432")
    db = f"{tag}_{uuid.uuid4().hex[:8]}"
    admin = ["psql", f"{base}/postgres", "-qc"]
    subprocess.run(admin + [f"CREATE DATABASE {db}"], check=True)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    env = dict(os.environ, HOST="127.0.0.1", PORT=str(port), FILE_BUFFER_DIR=tempfile.mkdtemp(),
               LOG_LEVEL="warn", QUEEN_CONFIG="", DATABASE_URL=f"{base}/{db}")
    log = open(os.path.join(tempfile.gettempdir(), f"{tag}-broker.log"), "w")
    broker = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(300):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        yield LoneBroker(port, f"{base}/{db}")
    finally:
        broker.terminate()
        broker.wait()
        subprocess.run(admin + [f"DROP DATABASE {db}"])
