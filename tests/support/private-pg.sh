# Sourced by the shell test runners (tests/compat/*.sh, tests/openapi/run.sh): a free port, and
# a throwaway PostgreSQL cluster from the local server binaries in the caller's temp dir.
#
#   free_port                   prints a free TCP port on 127.0.0.1
#   start_private_pg TAG        initdb + start in "$tmp/pg" (fsync off unless PRIVATE_PG_DURABLE=1,
#                               socket in "$tmp"); sets
#                               pg_port, pg_ctl_cmd (the pg_ctl to call, as the postgres user
#                               when run as root), psql_bin (the psql beside that pg_ctl) and
#                               exports DATABASE_URL; TAG prefixes messages
#   stop_private_pg             immediate stop, when this file started a cluster
#
# The caller sets `tmp` (an existing directory) before starting, and calls stop_private_pg in
# its EXIT trap before removing "$tmp".

pg_ctl_cmd=()
psql_bin=""

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_private_pg() {
    local tag=$1 pg_ctl_path pgbin as_pg=()
    pg_ctl_path=$(command -v pg_ctl || ls -d /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$pg_ctl_path" ] || { echo "$tag: no pg_ctl found; install PostgreSQL or set DATABASE_URL" >&2; exit 2; }
    pgbin=$(dirname "$pg_ctl_path")
    psql_bin=$pgbin/psql
    [ -x "$psql_bin" ] || psql_bin=$(command -v psql || true)
    [ -n "$psql_bin" ] || { echo "$tag: no psql found beside $pg_ctl_path or on PATH" >&2; exit 2; }
    if [ "$(id -u)" = 0 ]; then  # PostgreSQL refuses to run as root
        as_pg=(runuser -u postgres --)
        chown postgres "$tmp"
    fi
    pg_port=$(free_port)
    "${as_pg[@]}" "$pgbin/initdb" -D "$tmp/pg" -U postgres --auth=trust >"$tmp/initdb.log" 2>&1 \
        || { cat "$tmp/initdb.log" >&2; exit 2; }
    pg_ctl_cmd=("${as_pg[@]}" "$pgbin/pg_ctl")
    local durability="-c fsync=off"
    [ "${PRIVATE_PG_DURABLE:-0}" = 1 ] && durability=""
    "${pg_ctl_cmd[@]}" -D "$tmp/pg" -l "$tmp/pg/server.log" -w \
        -o "-p $pg_port -k $tmp -c listen_addresses=127.0.0.1 -c max_connections=300 $durability" \
        start >/dev/null
    export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
    echo "$tag: private PostgreSQL on port $pg_port"
}

stop_private_pg() {
    if [ ${#pg_ctl_cmd[@]} -gt 0 ]; then
        "${pg_ctl_cmd[@]}" -D "$tmp/pg" -m immediate stop >/dev/null 2>&1 || true
    fi
}
