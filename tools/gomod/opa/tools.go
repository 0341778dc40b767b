//go:build tools

// Package tools pins OPA, the Rego engine of stackflow's policy gate (built from the Go
// module proxy in setup; the worker runs `opa eval` with a restricted capabilities file).
package tools

import (
	_ "github.com/open-policy-agent/opa"
)
