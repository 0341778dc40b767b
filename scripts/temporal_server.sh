#!/usr/bin/env bash
# shellcheck shell=bash
# The Temporal server proper on the dev PostgreSQL, beside its Web UI: the `temporal` service of
# `STACKFLOW_TEMPORAL_MODE=server make up` (default: dev, the CLI's `start-dev` on SQLite).
#
# Sourced by services.sh, it gives the `temporal` service its command, health check and version
# in server mode. Before each start (temporal_server_cmd): the databases $TEMPORAL_DB and
# $TEMPORAL_VISIBILITY_DB are created and their schemas set up and upgraded by temporal-sql-tool
# (`create`, `setup-schema -v 0.0`, then `update-schema` with the versioned schema dirs the
# server module ships: every step idempotent, so an upgraded server upgrades its schemas on the
# next start); the server's config is written (0600: it holds the database password) with the
# dynamic config file deploy/temporal/dynamicconfig/stackflow.yaml. The service's process is
# this script's `run`: the server, then (once its frontend serves) the `default` namespace and
# stackflow's search attributes, then the UI server; it lives as long as both do, and stopping
# the service stops the process group, both with it.
#
# The frontend listens on TEMPORAL_PORT (7233, the dev server's address) and the UI on
# TEMPORAL_UI_PORT (8233); the other services' ports follow the frontend's as in Temporal's
# own development config: history +1, matching +2, worker +6, the frontend's HTTP API +10, each
# membership port 300 below its gRPC port. Switching modes restarts the service (its recorded
# version names the mode), so the other mode's server stops first.

# services.sh has sourced lib.sh; run as the service's process, this script sources it.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"; fi

TEMPORAL_MODE="${STACKFLOW_TEMPORAL_MODE:-dev}"
case "$TEMPORAL_MODE" in
  dev|server) ;;
  *) die "STACKFLOW_TEMPORAL_MODE=$TEMPORAL_MODE: use dev (Temporal's dev server on SQLite, the default) or server (the Temporal server on the dev PostgreSQL)" ;;
esac
TEMPORAL_DB="${STACKFLOW_TEMPORAL_DB:-temporal}"
TEMPORAL_VISIBILITY_DB="${STACKFLOW_TEMPORAL_VISIBILITY_DB:-temporal_visibility}"
# Fixed once a database is set up: the server refuses to start on another count.
TEMPORAL_SHARDS=4
TEMPORAL_SERVER_DIR="$RUN_DIR/temporal-server-$TEMPORAL_SERVER_VERSION"
TEMPORAL_SCHEMA_DIR="${TEMPORAL_SERVER_BIN_DIR%/bin}/schema/postgresql/v12"
TEMPORAL_DYNAMIC_CONFIG="$REPO_ROOT/deploy/temporal/dynamicconfig/stackflow.yaml"
# name=type pairs, as the dev server's --search-attribute flags in services.sh
STACKFLOW_SEARCH_ATTRIBUTES="StackflowProject=Keyword StackflowWorkspace=Keyword StackflowPhase=Keyword StackflowDrift=Bool"

# What the `temporal` service runs with (services.sh's version_of): a running service of the
# other mode, or of other versions or databases, is restarted by `up`.
temporal_version() {
  if [ "$TEMPORAL_MODE" = server ]; then
    echo "temporal-server $TEMPORAL_SERVER_VERSION postgresql $PG_PORT $TEMPORAL_DB $TEMPORAL_VISIBILITY_DB"
  else
    echo "temporal $TEMPORAL_CLI_VERSION $TEMPORAL_DATA_DIR"
  fi
}

# The mode the running `temporal` service was started in (by its recorded version).
temporal_running_mode() {
  case "$(cat "$RUN_DIR/pids/temporal.version" 2>/dev/null)" in
    temporal-server*) echo server ;; temporal*) echo dev ;; *) echo none ;;
  esac
}

# temporal-sql-tool DB ARGS...: as the stackflow role (CREATEDB) over loopback TCP.
temporal_sql_tool() {
  local db="$1"; shift
  SQL_PASSWORD="$(pg_password)" "$TEMPORAL_SERVER_BIN_DIR/temporal-sql-tool" --plugin postgres12 \
    --ep 127.0.0.1 -p "$PG_PORT" -u stackflow --db "$db" "$@"
}

# Both databases created, their schemas set up and upgraded to this server's versions.
temporal_schema() {
  local log="$TEMPORAL_SERVER_DIR/schema.log" db dir
  : > "$log"
  for db in "$TEMPORAL_DB:temporal" "$TEMPORAL_VISIBILITY_DB:visibility"; do
    dir="$TEMPORAL_SCHEMA_DIR/${db#*:}/versioned" db="${db%%:*}"
    { temporal_sql_tool "$db" create &&
      temporal_sql_tool "$db" setup-schema -v 0.0 &&
      temporal_sql_tool "$db" update-schema -d "$dir"; } >>"$log" 2>&1 ||
      { tail -n 20 "$log" >&2; die "temporal: setting up the schema of database $db failed; log: $log"; }
  done
}

# The server's config: PostgreSQL for both stores, every service on loopback.
temporal_server_config() {
  local p="$TEMPORAL_PORT" pw svc grpc
  pw="$(pg_password)"
  (umask 077 && cat > "$TEMPORAL_SERVER_DIR/config.yaml.tmp" <<YAML
# Written by scripts/temporal_server.sh on every start of the temporal service (server mode).
log:
  stdout: true
  level: warn
persistence:
  defaultStore: postgres-default
  visibilityStore: postgres-visibility
  numHistoryShards: $TEMPORAL_SHARDS
  datastores:
    postgres-default:
      sql: &sql
        pluginName: postgres12
        databaseName: $TEMPORAL_DB
        connectAddr: "127.0.0.1:$PG_PORT"
        connectProtocol: tcp
        user: stackflow
        password: "$pw"
        maxConns: 20
        maxIdleConns: 20
        maxConnLifetime: 1h
    postgres-visibility:
      sql:
        <<: *sql
        databaseName: $TEMPORAL_VISIBILITY_DB
        maxConns: 10
        maxIdleConns: 10
global:
  membership:
    maxJoinDuration: 30s
    broadcastAddress: 127.0.0.1
services:
YAML
  for svc in frontend:0 history:1 matching:2 worker:6; do
    grpc=$((p + ${svc#*:}))
    printf '  %s:\n    rpc:\n      grpcPort: %s\n      membershipPort: %s\n      bindOnLocalHost: true\n' \
      "${svc%%:*}" "$grpc" "$((grpc - 300))"
    [ "${svc%%:*}" != frontend ] || printf '      httpPort: %s\n' "$((p + 10))"
  done >> "$TEMPORAL_SERVER_DIR/config.yaml.tmp"
  cat >> "$TEMPORAL_SERVER_DIR/config.yaml.tmp" <<YAML
clusterMetadata:
  enableGlobalNamespace: false
  failoverVersionIncrement: 10
  masterClusterName: active
  currentClusterName: active
  clusterInformation:
    active:
      enabled: true
      initialFailoverVersion: 1
      rpcName: frontend
      rpcAddress: "127.0.0.1:$p"
dcRedirectionPolicy:
  policy: noop
dynamicConfigClient:
  filepath: "$TEMPORAL_DYNAMIC_CONFIG"
  pollInterval: 10s
YAML
  )
  mv "$TEMPORAL_SERVER_DIR/config.yaml.tmp" "$TEMPORAL_SERVER_DIR/config.yaml"
  # The UI server reads base.yaml and <env>.yaml from its config dir (env: stackflow).
  mkdir -p "$TEMPORAL_SERVER_DIR/ui"
  cat > "$TEMPORAL_SERVER_DIR/ui/stackflow.yaml" <<YAML
# Written by scripts/temporal_server.sh: the Temporal Web UI beside the server (as start-dev's).
temporalGrpcAddress: "127.0.0.1:$p"
host: 127.0.0.1
port: $TEMPORAL_UI_PORT
enableUi: true
defaultNamespace: default
disableNewsFetch: true
hideLogs: true
cors:
  cookieInsecure: true
codec:
  endpoint: "http://127.0.0.1:$CODEC_PORT"
YAML
}

# services.sh's cmd_temporal in server mode: the schemas and config made, then the command.
temporal_server_cmd() {
  local b
  for b in temporal-server temporal-sql-tool temporal-ui-server; do
    [ -x "$TEMPORAL_SERVER_BIN_DIR/$b" ] ||
      die "temporal: no $TEMPORAL_SERVER_BIN_DIR/$b; run 'STACKFLOW_TEMPORAL_MODE=server make setup' (or scripts/setup.sh temporal-server)"
  done
  [ -d "$TEMPORAL_SCHEMA_DIR" ] || die "temporal: no schema dir $TEMPORAL_SCHEMA_DIR; run 'scripts/setup.sh temporal-server'"
  health_postgres || die "temporal: the server mode needs the dev PostgreSQL on 127.0.0.1:$PG_PORT; start it with 'make up' (or scripts/services.sh up postgres)"
  mkdir -p "$TEMPORAL_SERVER_DIR"
  temporal_schema
  temporal_server_config
  echo bash "$REPO_ROOT/scripts/temporal_server.sh" run
}

# The UI answers (added to the frontend's health check in server mode).
health_temporal_ui() {
  [ "$TEMPORAL_MODE" != server ] ||
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$TEMPORAL_UI_PORT/" 2>/dev/null)" = 200 ]
}

# ---- the service's process (`temporal_server.sh run`) ------------------------------------------
temporal_register() {
  local addr="--address 127.0.0.1:$TEMPORAL_PORT" pair args=() i
  # shellcheck disable=SC2086
  if ! temporal operator namespace describe --namespace default $addr >/dev/null 2>&1; then
    echo "stackflow: creating namespace default (retention 72h)"
    # shellcheck disable=SC2086
    temporal operator namespace create --namespace default --retention 72h $addr || return 1
  fi
  # A new namespace reaches the frontend's namespace cache within seconds.
  for i in $(seq 1 60); do
    # shellcheck disable=SC2086
    temporal operator search-attribute list --namespace default $addr >/dev/null 2>&1 && break
    sleep 1
  done
  for pair in $STACKFLOW_SEARCH_ATTRIBUTES; do
    # shellcheck disable=SC2086
    temporal operator search-attribute list --namespace default $addr -o json 2>/dev/null |
      grep -q "\"${pair%%=*}\"" || args+=(--name "${pair%%=*}" --type "${pair#*=}")
  done
  [ ${#args[@]} -eq 0 ] && return 0
  echo "stackflow: registering search attributes ${args[*]}"
  # shellcheck disable=SC2086
  temporal operator search-attribute create --namespace default $addr "${args[@]}"
}

temporal_server_run() {
  local dir="$TEMPORAL_SERVER_DIR" i server ui
  TS_PIDS=()
  # Stopping the service (SIGTERM to the group) lets the server shut down cleanly: it leaves
  # the membership ring and closes its shards (services.sh kills what is left after 10 s).
  trap 'kill -TERM "${TS_PIDS[@]}" 2>/dev/null; wait; exit 0' TERM INT
  "$TEMPORAL_SERVER_BIN_DIR/temporal-server" --config-file "$dir/config.yaml" --allow-no-auth start &
  server=$! TS_PIDS=("$server")
  for i in $(seq 1 120); do
    kill -0 "$server" 2>/dev/null || { wait "$server"; exit $?; }
    temporal operator cluster health --address "127.0.0.1:$TEMPORAL_PORT" 2>/dev/null | grep -q SERVING && break
    sleep 0.5
  done
  for i in $(seq 1 10); do temporal_register && break; sleep 2; done
  "$TEMPORAL_SERVER_BIN_DIR/temporal-ui-server" --root "$dir" --config ui --env stackflow start \
    >>"$RUN_DIR/logs/temporal-ui.log" 2>&1 &
  ui=$! TS_PIDS+=("$ui")
  # Whichever ends first ends the other: the service is both or nothing.
  wait -n "$server" "$ui" || true
  kill -TERM "${TS_PIDS[@]}" 2>/dev/null || true
  wait
  exit 1
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-}" in
    run) temporal_server_run ;;
    *) die "usage: temporal_server.sh run (the temporal service's process in server mode; start it with STACKFLOW_TEMPORAL_MODE=server make up)" ;;
  esac
fi
