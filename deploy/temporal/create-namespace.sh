#!/bin/sh
# One-shot job for the `temporal-create-namespace` compose service.
#
# Runs inside temporalio/admin-tools (which ships the `temporal` CLI) once the
# server is healthy: creates the namespace stackflow uses and registers the
# custom search attributes its workflows upsert. Idempotent: existing
# namespaces and attributes are left alone, so it can run on every `up`.
set -eu

: "${TEMPORAL_ADDRESS:=temporal:7233}"
: "${TEMPORAL_NAMESPACE:=default}"
: "${NAMESPACE_RETENTION:=72h}"
# Space separated NAME=TYPE pairs; set from docker-compose.yml.
: "${STACKFLOW_SEARCH_ATTRIBUTES:?STACKFLOW_SEARCH_ATTRIBUTES must be set}"

ADDR="--address $TEMPORAL_ADDRESS"
NS="--namespace $TEMPORAL_NAMESPACE"

# retry <attempts> <command...>: re-run a command until it succeeds.
retry() {
    attempts=$1
    shift
    n=0
    until "$@"; do
        n=$((n + 1))
        if [ "$n" -ge "$attempts" ]; then
            echo "giving up after $n attempts: $*" >&2
            return 1
        fi
        sleep 2
    done
}

echo "waiting for the Temporal frontend at ${TEMPORAL_ADDRESS}"
# shellcheck disable=SC2086
retry 60 temporal operator cluster health $ADDR

# shellcheck disable=SC2086
if temporal operator namespace describe $NS $ADDR >/dev/null 2>&1; then
    echo "namespace ${TEMPORAL_NAMESPACE}: already exists"
else
    echo "namespace ${TEMPORAL_NAMESPACE}: creating (retention ${NAMESPACE_RETENTION})"
    # shellcheck disable=SC2086
    temporal operator namespace create $NS --retention "$NAMESPACE_RETENTION" $ADDR
fi
# A new namespace takes a few seconds to reach every frontend cache.
# shellcheck disable=SC2086
retry 30 temporal operator namespace describe $NS $ADDR >/dev/null

has_attribute() {
    # JSON output quotes every attribute name, whatever the exact layout is.
    # shellcheck disable=SC2086
    temporal operator search-attribute list $NS $ADDR --output json | grep -q "\"$1\""
}

for pair in $STACKFLOW_SEARCH_ATTRIBUTES; do
    name=${pair%%=*}
    type=${pair#*=}
    if has_attribute "$name"; then
        echo "search attribute ${name}: already registered"
        continue
    fi
    echo "search attribute ${name}: registering as ${type}"
    # shellcheck disable=SC2086
    if ! retry 10 temporal operator search-attribute create $NS $ADDR \
        --name "$name" --type "$type"; then
        # Another run may have won the race; only fail if it is still missing.
        has_attribute "$name" || exit 1
    fi
done

for pair in $STACKFLOW_SEARCH_ATTRIBUTES; do
    name=${pair%%=*}
    retry 15 has_attribute "$name"
done

echo "namespace ${TEMPORAL_NAMESPACE} is ready with search attributes: ${STACKFLOW_SEARCH_ATTRIBUTES}"
