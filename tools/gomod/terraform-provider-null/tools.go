//go:build tools

// Package tools pins the hashicorp/null Terraform provider, installed into the offline mirror
// as version 2.1.2. Module github.com/terraform-providers/terraform-provider-null at
// v2.1.2 source: the proxy's pseudo-version of the 2019-04-30 release commit (Terraform 0.12 SDK,
// plugin protocol 5); later tags carry no /vN module path, so the proxy refuses them.
package tools

import _ "github.com/terraform-providers/terraform-provider-null"
