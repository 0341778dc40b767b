//go:build tools

// Package tools pins the Kubernetes commands stackflow builds: the control plane for its tests
// and kubectl at the same version (for users of the dev cluster and the benchmarks).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
