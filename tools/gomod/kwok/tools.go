//go:build tools

// Package tools pins kwok, which fakes nodes and pod status beside stackflow's test control
// plane so Deployments roll out and Jobs complete without a kubelet.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
