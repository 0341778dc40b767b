//go:build tools

// Package tools pins Helm, which lints and renders deploy/helm/stackflow in the chart's test
// (built from the Go module proxy in setup).
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
