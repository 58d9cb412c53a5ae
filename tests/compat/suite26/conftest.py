# The `client` fixture that the queen-mq 2.6.0 sdist suite leaves to its runner (suite26.sh):
# a Queen client on QUEEN_URL with the client's defaults (JSON push and pop, autopilot on).
#
# SUITE26_CLIENT_OPTS switches on the client's opt-in wire formats (constructor keywords of
# queen.Queen, reference 2.x §3), comma-separated: binary_push (QPB1 pushes), push_compression
# (with binary_push: QPB1 flag 8 and QTB1 transactions), framed_pop (frames=true on pops), e.g.
#   SUITE26_CLIENT_OPTS=binary_push,push_compression bash tests/compat/suite26.sh test_push.py
import os

import pytest_asyncio
from queen import Queen

_KNOWN = {"binary_push", "push_compression", "framed_pop"}


def _client_opts():
    names = [n.strip() for n in os.environ.get("SUITE26_CLIENT_OPTS", "").split(",") if n.strip()]
    unknown = set(names) - _KNOWN
    if unknown:
        raise ValueError(f"SUITE26_CLIENT_OPTS: unknown option(s) {sorted(unknown)}; known: {sorted(_KNOWN)}")
    return {name: True for name in names}


@pytest_asyncio.fixture
async def client():
    c = Queen(url=os.environ.get("QUEEN_URL", "http://127.0.0.1:6632"), **_client_opts())
    try:
        yield c
    finally:
        await c.close()
