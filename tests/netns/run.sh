#!/usr/bin/env bash
# Runs the partitions-by-nftables test (tests/it/chaos_faults.rs,
# `chaos_netns_partitions_by_nftables`) inside a network namespace made here and removed on
# exit. The test's PostgreSQL, its broker and its clients all live in that namespace and talk
# over its own loopback; its drop rules exist only there, never in the host's firewall.
#
#   bash tests/netns/run.sh                      # CI size (about 25 s)
#   QUEEN_CHAOS_LONG=1 bash tests/netns/run.sh   # 5 rounds of the three partitions, 20x the messages
#
# Needs root (ip netns, nft) and Debian's nftables; .ci/run installs it.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "$(id -u)" != 0 ]; then
    echo "tests/netns/run.sh needs root (it makes a network namespace)" >&2
    exit 1
fi
for tool in ip nft; do
    command -v "$tool" >/dev/null || { echo "tests/netns/run.sh needs $tool (iproute2, nftables)" >&2; exit 1; }
done

ns="queen-chaos-$$"
ip netns add "$ns"
trap 'ip netns delete "$ns"' EXIT
ip netns exec "$ns" ip link set lo up
# The test refuses to run (and fails) outside a namespace of its own: QUEEN_NETNS says where it is.
ip netns exec "$ns" env QUEEN_NETNS="$ns" \
    cargo test --offline --test it chaos_faults::chaos_netns_partitions_by_nftables -- --nocapture "$@"
