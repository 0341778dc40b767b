//go:build tools

// Package tools pins kubeconform, which checks the chart's rendered manifests against JSON
// schemas written offline from the dev kube-apiserver's OpenAPI (scripts/kube_schemas.py).
package tools

import (
	_ "github.com/yannh/kubeconform/cmd/kubeconform"
)
