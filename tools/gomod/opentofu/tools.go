//go:build tools

// Package tools pins the OpenTofu CLI stackflow's Terraform runtime drives.
package tools

import _ "github.com/opentofu/opentofu/cmd/tofu"
