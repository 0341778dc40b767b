#!/usr/bin/env bash
# Starts, stops and reports stackflow's dev services on loopback: PostgreSQL (Debian's server,
# its own cluster under the run dir), etcd + kube-apiserver + kube-controller-manager (an
# envtest-style control plane), the Temporal dev server (with Web UI), Redis, a stackflow
# worker and the HTTP API (`stackflow serve`, with a dev admin token). Every service gets a pid file, a log file and a
# health check under the run dir; one that does not become healthy is stopped again and
# its log is printed. Usage: services.sh up|down|status|env [service...]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# STACKFLOW_TEMPORAL_MODE=server: the `temporal` service is the Temporal server on PostgreSQL
source "$(dirname "${BASH_SOURCE[0]}")/temporal_server.sh"

SERVICES=(postgres redis codec temporal etcd kube-apiserver kube-controller-manager kube-scheduler kwok worker api)

pidfile() { echo "$RUN_DIR/pids/$1.pid"; }
logfile() { echo "$RUN_DIR/logs/$1.log"; }
is_running() { local f; f="$(pidfile "$1")"; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ---- PostgreSQL: binaries, owner, password ---------------------------------------------------
# The newest server major of Debian's packages (/usr/lib/postgresql/N/bin); the packages' own
# cluster `main` is never started or used. PostgreSQL refuses to run as root, so as root the
# cluster belongs to the `postgres` OS user. setpriv execs the server (runuser would stay as a
# root parent that does not pass SIGINT, the fast shutdown, on to it).
PG_BIN="$(printf '%s\n' /usr/lib/postgresql/*/bin/postgres | sort -V | tail -n 1)"; PG_BIN="${PG_BIN%/postgres}"
if [ "$(id -u)" -eq 0 ]; then
  PG_OWNER=postgres; PG_AS="setpriv --reuid=postgres --regid=postgres --init-groups --"
else
  PG_OWNER="$(id -un)"; PG_AS=""
fi
# shellcheck disable=SC2086
pg_as() { $PG_AS "$@"; }
# The stackflow role's password: generated once, kept (0600) next to the cluster.
pg_password() {
  if [ ! -s "$PG_DIR/password" ]; then
    mkdir -p "$PG_DIR"
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$PG_DIR/password.tmp")
    mv "$PG_DIR/password.tmp" "$PG_DIR/password"
  fi
  chmod 0600 "$PG_DIR/password"
  cat "$PG_DIR/password"
}
pg_url() { echo "postgresql://stackflow:$(pg_password)@127.0.0.1:$PG_PORT/stackflow"; }

# ---- health checks -------------------------------------------------------------------------
health_postgres() {
  [ "$(PGCONNECT_TIMEOUT=3 "$PG_BIN/psql" -XAtw -c 'select 1' "$(pg_url)" 2>/dev/null)" = 1 ]
}
health_redis() { [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = "PONG" ]; }
health_codec() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' -X OPTIONS "http://127.0.0.1:$CODEC_PORT/decode" 2>/dev/null)" = "204" ]
}
health_temporal() {
  temporal operator cluster health --address "127.0.0.1:$TEMPORAL_PORT" 2>/dev/null | grep -q SERVING &&
    temporal operator search-attribute list --address "127.0.0.1:$TEMPORAL_PORT" 2>/dev/null | grep -q StackflowDrift &&
    health_temporal_ui
}
health_etcd() { curl -fsS "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"'; }
health_kube-apiserver() {
  curl -fsS --cacert "$KUBE_DIR/ca.crt" -H "Authorization: Bearer $(cat "$KUBE_DIR/admin.token")" \
    "https://127.0.0.1:$KUBE_API_PORT/readyz" 2>/dev/null | grep -q '^ok$'
}
health_kube-controller-manager() { curl -fsSk "https://127.0.0.1:$KUBE_CM_PORT/healthz" 2>/dev/null | grep -q '^ok$'; }
health_kube-scheduler() { curl -fsSk "https://127.0.0.1:$KUBE_SCHED_PORT/healthz" 2>/dev/null | grep -q '^ok$'; }
# kwok is healthy once it serves /healthz and its fake node reports Ready.
health_kwok() {
  curl -fsS "http://127.0.0.1:$KWOK_PORT/healthz" >/dev/null 2>&1 &&
    kube_api GET /api/v1/nodes/kwok-node-0 | grep -q '"type":"Ready","status":"True"'
}
health_worker() { grep -q "stackflow worker ready" "$(logfile worker)" 2>/dev/null; }
health_api() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$API_PORT/v1/readyz" 2>/dev/null)" = 200 ]; }
# The worker and the API run this checkout's code: a running one whose code changed since it
# started is restarted by `up`, so `make demo`/`make test` never run against stale workflows.
code_hash() {
  (cd "$REPO_ROOT" && find stackflow -name '*.py' -print0 |
    sort -z | xargs -0 cat | sha256sum | cut -c1-16)
}
stale_code() { [ "$(cat "$RUN_DIR/pids/$1.code" 2>/dev/null)" != "$(code_hash)" ]; }
runs_our_code() { [ "$1" = worker ] || [ "$1" = api ]; }
# The tool versions a service runs with: a running service started with other versions (after an
# upgrade, or with another STACKFLOW_KUBE_VERSION) is restarted by `up`.
version_of() {
  case "$1" in
    temporal) temporal_version ;;
    etcd) echo "etcd $ETCD_VERSION $ETCD_DATA_DIR" ;;
    kube-apiserver|kube-controller-manager|kube-scheduler) echo "kubernetes $KUBERNETES_VERSION etcd $ETCD_VERSION" ;;
    kwok) echo "kwok $KWOK_VERSION kubernetes $KUBERNETES_VERSION" ;;
    *) echo "" ;;
  esac
}
stale_version() { [ "$(cat "$RUN_DIR/pids/$1.version" 2>/dev/null)" != "$(version_of "$1")" ]; }

# ---- kube certificates & kubeconfig ------------------------------------------------------------
kube_pki() {
  [ -f "$KUBE_DIR/kubeconfig" ] && return
  mkdir -p "$KUBE_DIR"
  local d="$KUBE_DIR"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=stackflow-dev-ca" \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$d/apiserver.key" -out "$d/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n' > "$d/san.ext"
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -extfile "$d/san.ext" -out "$d/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$d/admin.token"
  printf '%s,stackflow-admin,stackflow-admin,"system:masters"\n' "$(cat "$d/admin.token")" > "$d/tokens.csv"
  cat > "$d/kubeconfig.tmp" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: stackflow-dev
  cluster:
    server: https://127.0.0.1:$KUBE_API_PORT
    certificate-authority-data: $(base64 -w0 < "$d/ca.crt")
users:
- name: stackflow-admin
  user:
    token: $(cat "$d/admin.token")
contexts:
- name: stackflow-dev
  context: {cluster: stackflow-dev, user: stackflow-admin}
current-context: stackflow-dev
KCFG
  mv "$d/kubeconfig.tmp" "$d/kubeconfig"
}

# ---- PostgreSQL cluster ------------------------------------------------------------------------
# Server settings (a change applies on the next start): loopback only, the socket inside the run
# dir, scram-sha-256 over TCP (pg_hba.conf below), light for a 2-core machine, and room for
# several workers' connection pools during the tests.
pg_flags() {
  echo -c listen_addresses="$1" -c port="$PG_PORT" -c unix_socket_directories="$PG_DIR/socket" \
    -c hba_file="$PG_DIR/pg_hba.conf" -c password_encryption=scram-sha-256 \
    -c shared_buffers=128MB -c max_connections=200 -c cluster_name=stackflow-dev
}
# initdb once; then the role `stackflow` (LOGIN CREATEDB, password from pg_password) and its
# database `stackflow`, through a socket-only server, whenever the password file is newer than
# the last time. Everything but the command goes to stderr or the init log.
pg_init() {
  local data="$PG_DIR/data" sock="$PG_DIR/socket" log="$RUN_DIR/logs/postgres-init.log" pw
  mkdir -p "$PG_DIR" "$RUN_DIR/logs"
  cd "$PG_DIR"
  chmod 0755 "$PG_DIR"
  pw="$(pg_password)"
  local d="$PG_DIR" blocked=""
  while [ "$d" != / ]; do pg_as test -x "$d" || blocked="$d"; d="$(dirname "$d")"; done
  [ -z "$blocked" ] ||
    die "postgres: the $PG_OWNER user cannot reach $PG_DIR: $blocked is not searchable by it; chmod o+x $blocked or set STACKFLOW_RUN_DIR"
  [ ${#sock} -le 90 ] || die "postgres: socket dir $sock is too long for a Unix socket path; set STACKFLOW_RUN_DIR to a shorter path"
  mkdir -p "$data" "$sock"
  : > "$log"
  [ -z "$PG_AS" ] || chown "$PG_OWNER:" "$data" "$sock" "$log"
  chmod 0700 "$data" "$sock"
  cat > "$PG_DIR/pg_hba.conf" <<HBA
# Written by scripts/services.sh on every start.
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 peer
host    all       all   127.0.0.1/32  scram-sha-256
HBA
  chmod 0644 "$PG_DIR/pg_hba.conf"
  if [ ! -s "$data/PG_VERSION" ]; then
    rm -f "$PG_DIR/bootstrapped"
    pg_as "$PG_BIN/initdb" -D "$data" -U "$PG_OWNER" --auth-local=peer --auth-host=scram-sha-256 \
      --encoding=UTF8 --locale=C >>"$log" 2>&1 || { tail -n 25 "$log" >&2; die "postgres: initdb failed; log: $log"; }
  fi
  local have want; have="$(cat "$data/PG_VERSION")"; want="$(basename "$(dirname "$PG_BIN")")"
  [ "$have" = "$want" ] || die "postgres: $data was created by PostgreSQL $have, the installed server is $want; remove $PG_DIR to start over (its data is lost)"
  if [ ! -f "$PG_DIR/bootstrapped" ] || [ "$PG_DIR/password" -nt "$PG_DIR/bootstrapped" ]; then
    pg_as "$PG_BIN/pg_ctl" -D "$data" -w -t 60 -l "$log" -o "$(pg_flags "''")" start >>"$log" 2>&1 ||
      { tail -n 25 "$log" >&2; die "postgres: the bootstrap server did not start; log: $log"; }
    if ! pg_as "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$sock" -p "$PG_PORT" -U "$PG_OWNER" -d postgres >>"$log" 2>&1 <<SQL
SELECT 'CREATE ROLE stackflow' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'stackflow')\gexec
ALTER ROLE stackflow LOGIN CREATEDB PASSWORD '$pw';
-- the tests drop their databases WITH (FORCE): an autovacuum worker in one is not stackflow's
GRANT pg_signal_backend TO stackflow;
SELECT 'CREATE DATABASE stackflow OWNER stackflow' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'stackflow')\gexec
SQL
    then
      pg_as "$PG_BIN/pg_ctl" -D "$data" -w -m fast stop >>"$log" 2>&1 || true
      tail -n 25 "$log" >&2; die "postgres: creating the stackflow role and database failed; log: $log"
    fi
    pg_as "$PG_BIN/pg_ctl" -D "$data" -w -t 60 -m fast stop >>"$log" 2>&1 ||
      { tail -n 25 "$log" >&2; die "postgres: the bootstrap server did not stop; log: $log"; }
    touch "$PG_DIR/bootstrapped"
  fi
}

# ---- commands of each service ------------------------------------------------------------------
cmd_postgres() {
  [ -x "$PG_BIN/postgres" ] || die "postgres: no server under /usr/lib/postgresql/*/bin; run 'make setup' first"
  pg_init
  # shellcheck disable=SC2086,SC2046
  echo $PG_AS "$PG_BIN/postgres" -D "$PG_DIR/data" $(pg_flags 127.0.0.1)
}
cmd_redis() {
  mkdir -p "$RUN_DIR/redis"
  echo redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save "''" --appendonly no --dir "$RUN_DIR/redis"
}
# SQLite in WAL mode with synchronous=NORMAL: a commit appends to the log without an fsync
# of the database each time (about a fifth off a 1,000-resource apply, measured with
# benchmarks/onprem_bench.py). A killed server loses nothing committed; a power cut may lose
# the last transactions, acceptable for the dev server.
cmd_temporal() {
  if [ "$TEMPORAL_MODE" = server ]; then temporal_server_cmd; return; fi
  mkdir -p "$TEMPORAL_DATA_DIR"
  echo temporal server start-dev --ip 127.0.0.1 --port "$TEMPORAL_PORT" --ui-ip 127.0.0.1 \
    --ui-port "$TEMPORAL_UI_PORT" --ui-codec-endpoint "http://127.0.0.1:$CODEC_PORT" --db-filename "$TEMPORAL_DATA_DIR/temporal.db" --log-level warn \
    --sqlite-pragma journal_mode=wal --sqlite-pragma synchronous=NORMAL \
    --search-attribute StackflowProject=Keyword --search-attribute StackflowWorkspace=Keyword \
    --search-attribute StackflowPhase=Keyword --search-attribute StackflowDrift=Bool
}
cmd_etcd() {
  echo etcd --name stackflow-dev --data-dir "$ETCD_DATA_DIR" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "stackflow-dev=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync --log-level warn
}
# --endpoint-reconciler-type none: the apiserver advertises 127.0.0.1, which 1.37 refuses to
# publish as the `kubernetes` Service's endpoint ("may not be in the loopback range"); no pod
# here talks to the API through that Service (kwok's pods run nothing).
cmd_kube-apiserver() {
  kube_pki
  local d="$KUBE_DIR"
  echo kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" --bind-address 127.0.0.1 \
    --advertise-address 127.0.0.1 --secure-port "$KUBE_API_PORT" \
    --tls-cert-file "$d/apiserver.crt" --tls-private-key-file "$d/apiserver.key" \
    --client-ca-file "$d/ca.crt" --token-auth-file "$d/tokens.csv" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$d/sa.pub" --service-account-signing-key-file "$d/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 --authorization-mode RBAC --allow-privileged=true \
    --endpoint-reconciler-type none \
    --cert-dir "$d/certs" --v 1
}
cmd_kube-controller-manager() {
  local d="$KUBE_DIR"
  echo kube-controller-manager --kubeconfig "$d/kubeconfig" --authentication-kubeconfig "$d/kubeconfig" \
    --authorization-kubeconfig "$d/kubeconfig" --bind-address 127.0.0.1 --secure-port "$KUBE_CM_PORT" \
    --service-account-private-key-file "$d/sa.key" --root-ca-file "$d/ca.crt" \
    --cluster-signing-cert-file "$d/ca.crt" --cluster-signing-key-file "$d/ca.key" \
    --leader-elect=false --use-service-account-credentials=false --cert-dir "$d/cm-certs" --v 1
}
cmd_kube-scheduler() {
  local d="$KUBE_DIR"
  echo kube-scheduler --kubeconfig "$d/kubeconfig" --authentication-kubeconfig "$d/kubeconfig" \
    --authorization-kubeconfig "$d/kubeconfig" --bind-address 127.0.0.1 --secure-port "$KUBE_SCHED_PORT" \
    --leader-elect=false --cert-dir "$d/sched-certs" --v 1
}
# kube_api METHOD PATH [JSON]: one request to the dev kube-apiserver as its admin.
kube_api() {
  curl -sS --cacert "$KUBE_DIR/ca.crt" -H "Authorization: Bearer $(cat "$KUBE_DIR/admin.token")" \
    -H 'Content-Type: application/json' -X "$1" "https://127.0.0.1:$KUBE_API_PORT$2" ${3:+--data "$3"} 2>/dev/null | tr -d ' \n'
}
# kwok fakes one node (kwok-node-0, created here if missing) and the status of pods on it
# (the stages setup.sh copies from kwok's module),
# so Deployments roll out and Jobs complete without a kubelet. Pod IPs stay outside the
# service range 10.0.0.0/24. The node heartbeats through a Lease renewed every 10 s: without
# one, kwok patched the node's status every 45 s, past the controller-manager's 40 s grace, so
# the node went NotReady for 5 s in every 45 and a pod started in that window was marked not
# ready for good (a rollout waited forever).
cmd_kwok() {
  kube_api POST /api/v1/nodes '{"apiVersion":"v1","kind":"Node","metadata":{"name":"kwok-node-0",
    "annotations":{"kwok.x-k8s.io/node":"fake","node.alpha.kubernetes.io/ttl":"0"},
    "labels":{"type":"kwok","kubernetes.io/hostname":"kwok-node-0","kubernetes.io/os":"linux","kubernetes.io/arch":"amd64"}},
    "status":{"capacity":{"cpu":"32","memory":"256Gi","pods":"250"},"allocatable":{"cpu":"32","memory":"256Gi","pods":"250"}}}' >/dev/null
  [ -s "$KWOK_BIN_DIR/stages.yaml" ] || die "kwok: no stages file $KWOK_BIN_DIR/stages.yaml; run 'make setup' first"
  echo kwok --kubeconfig "$KUBE_DIR/kubeconfig" --config "$KWOK_BIN_DIR/stages.yaml" \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --server-address "127.0.0.1:$KWOK_PORT" --cidr 10.244.0.1/16 --node-ip 127.0.0.1 \
    --node-lease-duration-seconds 40
}
# The dev loop's encryption key (payloads, sensitive state): made once, 0600, under .run/keys.
KEY_FILE="$RUN_DIR/keys/stackflow.keys"
dev_key() {
  [ -s "$KEY_FILE" ] && return
  (cd "$REPO_ROOT" && "$VENV/bin/python" -c "
from pathlib import Path
from stackflow.core.crypto import KeyRing, new_key_line, write_key_file
write_key_file(Path('$KEY_FILE'), KeyRing.parse(new_key_line('dev1'), 'dev'))") ||
    die "could not write the dev encryption key $KEY_FILE"
}
# What a service's process gets of `env`: everything but the API token (argv is public).
service_env() { env_exports | grep -v '^export STACKFLOW_API_TOKEN=' | sed 's/^export //'; }
cmd_codec() {
  dev_key
  echo env $(service_env) "$VENV/bin/stackflow" codec-server \
    --port "$CODEC_PORT" --origin "http://127.0.0.1:$TEMPORAL_UI_PORT"
}
cmd_worker() {
  echo env $(service_env) "$VENV/bin/python" -m stackflow.worker
}
# The API's dev tokens: one admin token (approver on every project), made once, 0600, under
# .run/api; the tokens file holds only its sha256. `make -s env` exports the token.
API_DIR="$RUN_DIR/api"
dev_api_token() {
  if [ ! -s "$API_DIR/admin.token" ]; then
    mkdir -p "$API_DIR"
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$API_DIR/admin.token.tmp")
    mv "$API_DIR/admin.token.tmp" "$API_DIR/admin.token"
  fi
  if [ ! -s "$API_DIR/tokens.json" ] || [ "$API_DIR/admin.token" -nt "$API_DIR/tokens.json" ]; then
    (umask 077 && printf '[{"name": "dev-admin", "sha256": "%s", "roles": {"*": "approver"}}]\n' \
      "$(tr -d '\n' < "$API_DIR/admin.token" | sha256sum | cut -c1-64)" > "$API_DIR/tokens.json")
  fi
}
cmd_api() {
  dev_api_token
  echo env $(service_env) STACKFLOW_API_TOKENS="$API_DIR/tokens.json" \
    "$VENV/bin/stackflow" serve --host 127.0.0.1 --port "$API_PORT"
}
port_of() {
  case "$1" in
    postgres) echo "$PG_PORT" ;; redis) echo "$REDIS_PORT" ;; codec) echo "$CODEC_PORT" ;; temporal) echo "$TEMPORAL_PORT" ;; etcd) echo "$ETCD_PORT" ;;
    api) echo "$API_PORT" ;;
    kube-apiserver) echo "$KUBE_API_PORT" ;; kube-controller-manager) echo "$KUBE_CM_PORT" ;;
    kube-scheduler) echo "$KUBE_SCHED_PORT" ;; kwok) echo "$KWOK_PORT" ;; *) echo "" ;;
  esac
}
timeout_of() { case "$1" in kube-apiserver) echo 120 ;; temporal) echo 90 ;; *) echo 60 ;; esac; }

start_one() {
  local name="$1" log pid cmd port t0=$SECONDS limit
  log="$(logfile "$name")"; limit="$(timeout_of "$name")"
  mkdir -p "$RUN_DIR/pids" "$RUN_DIR/logs"
  if is_running "$name" && runs_our_code "$name" && stale_code "$name"; then
    warn "$name code changed since it started: restarting it"; stop_one "$name"
  fi
  if is_running "$name" && stale_version "$name"; then
    warn "$name runs other versions than $(version_of "$name"): restarting it"; stop_one "$name"
  fi
  if is_running "$name"; then
    if "health_$name"; then ok "$name already running (pid $(cat "$(pidfile "$name")"))"; return; fi
    warn "$name is running but unhealthy: restarting it"; stop_one "$name"
  fi
  port="$(port_of "$name")"
  if [ -n "$port" ] && port_open "$port"; then
    die "$name: port 127.0.0.1:$port is taken by another process (not started by this checkout); stop it or set STACKFLOW_*_PORT"
  fi
  cmd="$("cmd_$name")"
  command -v "${cmd%% *}" >/dev/null 2>&1 || [ "${cmd%% *}" = env ] || die "$name: '${cmd%% *}' not found; run 'make setup' first"
  : > "$log"
  # shellcheck disable=SC2086
  (cd "$RUN_DIR" && eval "exec setsid $cmd" >>"$log" 2>&1 </dev/null) &
  pid=$!
  echo "$pid" > "$(pidfile "$name")"
  ! runs_our_code "$name" || code_hash > "$RUN_DIR/pids/$name.code"
  version_of "$name" > "$RUN_DIR/pids/$name.version"
  until "health_$name"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$(pidfile "$name")"
      tail -n 25 "$log" >&2
      die "$name exited during start-up; log: $log"
    fi
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      stop_one "$name"
      tail -n 25 "$log" >&2
      die "$name not healthy after ${limit}s; stopped it again; log: $log"
    fi
    sleep 0.5
  done
  ok "$name up in $((SECONDS - t0))s (pid $pid, log $log)"
}

stop_one() {
  local name="$1" f pid i
  f="$(pidfile "$name")"
  [ -f "$f" ] || return 0
  pid="$(cat "$f")"
  if kill -0 "$pid" 2>/dev/null; then
    if [ "$name" = postgres ]; then
      # Fast shutdown, by the postmaster alone: SIGTERM would wait for every client to leave.
      kill -INT "$pid" 2>/dev/null || true
    else
      kill -TERM "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    fi
    for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# The dev worker's OnPrem hosts: loopback (over SSH) with the same roots as local files.
loopback_hosts() {
  local out="" root host
  IFS=: read -ra roots <<<"$1"
  for root in "${roots[@]}"; do
    for host in '127.*' localhost '::1'; do out+="${out:+,}$host:$root"; done
  done
  printf '%s' "$out"
}

env_exports() {
  [ -x "$VENV/bin/python" ] && dev_key
  dev_api_token
  cat <<ENV
export TEMPORAL_ADDRESS=127.0.0.1:$TEMPORAL_PORT
export TEMPORAL_NAMESPACE=default
export STACKFLOW_TASK_QUEUE=${STACKFLOW_TASK_QUEUE:-stackflow}
export STACKFLOW_TEMPORAL_UI=http://127.0.0.1:$TEMPORAL_UI_PORT
export STACKFLOW_ENCRYPTION_KEY_FILE=$KEY_FILE
export STACKFLOW_CODEC_ENDPOINT=http://127.0.0.1:$CODEC_PORT
export STACKFLOW_API_URL=http://127.0.0.1:$API_PORT
export STACKFLOW_API_TOKEN=$(cat "$API_DIR/admin.token")
export REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
export STACKFLOW_POSTGRES_URL=$(pg_url)
export KUBECONFIG=$KUBECONFIG_PATH
export STACKFLOW_TF_BIN=$TOFU_BIN_DIR/tofu
export STACKFLOW_OPA_BIN=$OPA_BIN_DIR/opa
export STACKFLOW_KUBECTL=$KUBE_BIN_DIR/kubectl
export TF_CLI_CONFIG_FILE=$TF_CLI_CONFIG
export STACKFLOW_HOME=${STACKFLOW_HOME:-$RUN_DIR/home}
export STACKFLOW_ONPREM_ROOTS=${STACKFLOW_ONPREM_ROOTS:-${TMPDIR:-/tmp}}
export STACKFLOW_ONPREM_HOSTS=${STACKFLOW_ONPREM_HOSTS:-$(loopback_hosts "${STACKFLOW_ONPREM_ROOTS:-${TMPDIR:-/tmp}}")}
export PATH=$TOOLS_PATH:$VENV/bin:\$PATH
ENV
}

selected() { if [ $# -gt 0 ]; then printf '%s\n' "$@"; else printf '%s\n' "${SERVICES[@]}"; fi; }

main() {
  local action="${1:-status}"; shift || true
  case "$action" in
    up)
      step "starting services (run dir $RUN_DIR)"
      for s in $(selected "$@"); do start_one "$s"; done
      step "services up: Temporal UI http://127.0.0.1:$TEMPORAL_UI_PORT — eval \"\$(make -s env)\" to use them" ;;
    down)
      step "stopping services"
      local list; list="$(selected "$@" | tac)"
      for s in $list; do if is_running "$s"; then stop_one "$s"; ok "$s stopped"; else rm -f "$(pidfile "$s")"; fi; done ;;
    status)
      local rc=0
      for s in $(selected "$@"); do
        if is_running "$s" && "health_$s"; then printf '%-26s %shealthy%s  pid %s  log %s\n' "$s" "$_G" "$_N" "$(cat "$(pidfile "$s")")" "$(logfile "$s")"
        elif is_running "$s"; then printf '%-26s %sunhealthy%s pid %s  log %s\n' "$s" "$_Y" "$_N" "$(cat "$(pidfile "$s")")" "$(logfile "$s")"; rc=1
        else printf '%-26s %sstopped%s\n' "$s" "$_R" "$_N"; rc=1; fi
      done
      return $rc ;;
    env) env_exports ;;
    *) die "unknown action '$action' (use up, down, status or env)" ;;
  esac
}

main "$@"
