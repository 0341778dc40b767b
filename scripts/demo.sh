#!/usr/bin/env bash
# `make demo` (the README's Quick start): apply examples/onprem.yaml through a real
# ApplyWorkflow on the running dev services, then list the stack's releases.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
eval "$("$REPO_ROOT/scripts/services.sh" env)"
cd "$REPO_ROOT"
step "stackflow apply -f examples/onprem.yaml --project demo --workspace dev --yes"
stackflow apply -f examples/onprem.yaml --project demo --workspace dev --yes --detail
step "stackflow release list --project demo --workspace dev"
stackflow release list --project demo --workspace dev
step "files written"
ls -l /tmp/stackflow-demo
