#!/usr/bin/env bash
# Builds Tansu 0.6.0 (a Kafka broker with a PostgreSQL storage engine, Apache-2.0) once into a
# cache outside the repository, for the bench's kafka suite (`bench --suites kafka`): its
# binary and the PostgreSQL schema its engine expects. Not run by CI: the kafka suite leaves
# Tansu's rows out when this has not been run.
#
#   bash bench/tansu/setup.sh            # into ~/.cache/queen-bench/tansu-0.6.0
#   TANSU_DIR=/some/dir bash bench/tansu/setup.sh
#
# Tansu's postgres engine does not create its tables; its repository ships a schema for
# PostgreSQL that the crate on crates.io does not carry. The crate does carry the same tables
# for its SQLite engine (tansu-storage's src/ddl/); `schema.py` next to this script writes the
# PostgreSQL form of those from the downloaded crate, with the column types the postgres
# engine binds and reads (taken from its statements). Nothing of Tansu is kept in this
# repository.
set -euo pipefail

version=0.6.0
dir="${TANSU_DIR:-$HOME/.cache/queen-bench/tansu-$version}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$dir"

if [ ! -x "$dir/bin/tansu" ]; then
  echo "tansu-setup: building tansu $version with its postgres feature into $dir (a while)"
  CARGO_TARGET_DIR="$dir/target" cargo install --locked "tansu@$version" \
    --features postgres --root "$dir"
fi

# The crate sources cargo downloaded for the build.
ddl=""
for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"tansu-storage-$version"/src/ddl; do
  [ -d "$d" ] && ddl="$d"
done
if [ -z "$ddl" ]; then
  echo "tansu-setup: tansu-storage-$version sources not found under ${CARGO_HOME:-$HOME/.cargo}/registry/src" >&2
  exit 1
fi
python3 "$here/schema.py" "$ddl" > "$dir/schema.sql.new"
mv "$dir/schema.sql.new" "$dir/schema.sql"
echo "tansu-setup: $dir/bin/tansu and $dir/schema.sql are ready"
