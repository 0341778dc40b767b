# shellcheck shell=bash
# Shared settings for stackflow's dev scripts: where tools are cached, where services run,
# which versions are pinned. Sourced by setup.sh and services.sh.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACKFLOW_CACHE="${STACKFLOW_CACHE:-$HOME/.cache/stackflow}"
TOOLS_BIN="$STACKFLOW_CACHE/bin"
RUN_DIR="${STACKFLOW_RUN_DIR:-$REPO_ROOT/.run}"
VENV="$REPO_ROOT/.venv"

# Pinned versions (bump here, the stamps force a rebuild).
TEMPORAL_CLI_VERSION="v1.5.1"
KUBERNETES_VERSION="v1.30.14"   # 1.30.x works with Debian's etcd 3.4.23
OPENTOFU_VERSION="v1.8.11"
KWOK_VERSION="v0.6.1"           # its k8s.io deps are 0.30, like the control plane

# Loopback ports of the dev services.
TEMPORAL_PORT="${STACKFLOW_TEMPORAL_PORT:-7233}"
TEMPORAL_UI_PORT="${STACKFLOW_TEMPORAL_UI_PORT:-8233}"
REDIS_PORT="${STACKFLOW_REDIS_PORT:-16379}"
CODEC_PORT="${STACKFLOW_CODEC_PORT:-18081}"
ETCD_PORT="${STACKFLOW_ETCD_PORT:-12379}"
ETCD_PEER_PORT="${STACKFLOW_ETCD_PEER_PORT:-12380}"
KUBE_API_PORT="${STACKFLOW_KUBE_API_PORT:-16443}"
KUBE_CM_PORT="${STACKFLOW_KUBE_CM_PORT:-10357}"
KUBE_SCHED_PORT="${STACKFLOW_KUBE_SCHED_PORT:-10359}"
KWOK_PORT="${STACKFLOW_KWOK_PORT:-10361}"
PG_PORT="${STACKFLOW_PG_PORT:-55432}"

TF_MIRROR_DIR="$STACKFLOW_CACHE/terraform/mirror"
TF_PLUGIN_CACHE_DIR="$STACKFLOW_CACHE/terraform/plugin-cache"
TF_CLI_CONFIG="$STACKFLOW_CACHE/terraform/tofurc"
KUBE_DIR="$RUN_DIR/kube"
KUBECONFIG_PATH="$KUBE_DIR/kubeconfig"
PG_DIR="$RUN_DIR/postgres"      # data/ (initdb'd once), socket/, pg_hba.conf, password

if [ -t 1 ]; then _B=$'\e[1m'; _G=$'\e[32m'; _R=$'\e[31m'; _Y=$'\e[33m'; _N=$'\e[0m'; else _B=; _G=; _R=; _Y=; _N=; fi
step() { printf '%s==>%s %s\n' "$_B" "$_N" "$*"; }
ok()   { printf '    %sok%s %s\n' "$_G" "$_N" "$*"; }
warn() { printf '    %swarn%s %s\n' "$_Y" "$_N" "$*" >&2; }
die()  { printf '%serror:%s %s\n' "$_R" "$_N" "$*" >&2; exit 1; }

# stamp NAME VALUE: true when the stamp file for NAME holds VALUE (the step is done).
stamp_ok() { [ -f "$STACKFLOW_CACHE/stamps/$1" ] && [ "$(cat "$STACKFLOW_CACHE/stamps/$1")" = "$2" ]; }
stamp_set() { mkdir -p "$STACKFLOW_CACHE/stamps"; printf '%s' "$2" > "$STACKFLOW_CACHE/stamps/$1"; }

export PATH="$TOOLS_BIN:$VENV/bin:$PATH"
