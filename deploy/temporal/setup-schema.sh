#!/bin/sh
# One-shot schema job for the `temporal-schema` compose service.
#
# Runs inside temporalio/admin-tools. Creates the `temporal` and
# `temporal_visibility` databases on PostgreSQL and brings both schemas up to
# the newest version shipped with the image. Every step is idempotent, so the
# job is safe to re-run on each `docker compose up` and it also performs the
# schema upgrade after the image tags are bumped.
set -eu

: "${POSTGRES_SEEDS:=postgresql}"
: "${DB_PORT:=5432}"
: "${POSTGRES_USER:=temporal}"
: "${DBNAME:=temporal}"
: "${VISIBILITY_DBNAME:=temporal_visibility}"
# temporal-sql-tool reads the password from SQL_PASSWORD.
: "${SQL_PASSWORD:?SQL_PASSWORD must be set}"
export SQL_PASSWORD

SCHEMA_ROOT=/etc/temporal/schema/postgresql/v12

sql_tool() {
    temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -p "$DB_PORT" \
        -u "$POSTGRES_USER" "$@"
}

echo "waiting for PostgreSQL at ${POSTGRES_SEEDS}:${DB_PORT}"
tries=0
until nc -z "$POSTGRES_SEEDS" "$DB_PORT"; do
    tries=$((tries + 1))
    if [ "$tries" -ge 60 ]; then
        echo "PostgreSQL did not open its port in time" >&2
        exit 1
    fi
    sleep 1
done

setup_db() {
    db=$1
    versioned_dir=$2
    echo "schema: database ${db}"
    # `create` ignores an already existing database.
    sql_tool --db "$db" create
    # `setup-schema -v 0.0` only creates the version tables; it never lowers a
    # version that is already recorded.
    sql_tool --db "$db" setup-schema -v 0.0
    # Applies only the versioned migrations newer than the recorded version.
    sql_tool --db "$db" update-schema -d "$versioned_dir"
}

setup_db "$DBNAME" "$SCHEMA_ROOT/temporal/versioned"
setup_db "$VISIBILITY_DBNAME" "$SCHEMA_ROOT/visibility/versioned"

echo "schema: done"
