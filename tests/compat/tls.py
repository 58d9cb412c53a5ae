"""Queen's Python client (`queen-mq` 2.6.0) over HTTPS.

Against a broker serving TLS with a throwaway CA's certificate (tests/compat/tls.sh sets it up):
push, pop and ack with the client trusting the CA through SSL_CERT_FILE (httpx, the client's HTTP
library, reads it when it builds its TLS context); then the same client with its default trust
store (certifi), which must refuse the broker's certificate. Prints PASS or FAIL per flow and
exits non-zero on a failure.

Usage: SSL_CERT_FILE=ca.pem python tls.py https://127.0.0.1:PORT
"""

import asyncio
import os
import sys
import traceback
import uuid

from queen import Queen

BASE = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("QUEEN_URL", "https://127.0.0.1:6632")
QUEUE = f"compat-tls-{uuid.uuid4().hex[:8]}"


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


async def flow_push_pop_ack() -> None:
    client = Queen(url=BASE)
    try:
        pushed = await client.queue(QUEUE).push([{"data": {"n": 1}}, {"data": {"n": 2}}])
        check(len(pushed) == 2 and all(p.get("status") == "queued" for p in pushed), f"push: {pushed}")
        msgs = await client.queue(QUEUE).batch(10).wait(False).pop()
        check([m["data"] for m in msgs] == [{"n": 1}, {"n": 2}], f"pop: {msgs}")
        acked = await client.ack(msgs, True)
        check(acked.get("success") is not False, f"ack: {acked}")
        again = await client.queue(QUEUE).batch(10).wait(False).pop()
        check(again == [], f"after the ack nothing is left: {again}")
    finally:
        await client.close()


async def flow_untrusted_ca_is_refused() -> None:
    # Without SSL_CERT_FILE httpx trusts certifi's public roots, which do not hold the test CA.
    trusted = os.environ.pop("SSL_CERT_FILE")
    client = Queen(url=BASE, retry_attempts=1, enable_failover=False)
    try:
        await client.queue(QUEUE).push([{"data": {"n": 3}}])
    except Exception as e:  # the client's own error types wrap httpx's
        text = f"{type(e).__name__}: {e!r} {e.__cause__!r}"
        check("CERTIFICATE_VERIFY_FAILED" in text, f"refused, but not for the certificate: {text}")
    else:
        raise AssertionError("the push went through without trusting the CA")
    finally:
        os.environ["SSL_CERT_FILE"] = trusted
        await client.close()


FLOWS = [
    ("push, pop and ack over HTTPS", flow_push_pop_ack),
    ("a client without the CA is refused", flow_untrusted_ca_is_refused),
]


async def main() -> int:
    check(BASE.startswith("https://"), f"expected an https URL, got {BASE}")
    check(bool(os.environ.get("SSL_CERT_FILE")), "SSL_CERT_FILE must name the test CA")
    failed = 0
    for name, flow in FLOWS:
        try:
            await flow()
            print(f"PASS {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"compat-tls: {len(FLOWS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
