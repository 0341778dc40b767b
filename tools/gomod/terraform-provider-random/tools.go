//go:build tools

// Package tools pins the hashicorp/random Terraform provider, installed into the offline mirror
// as version 3.6.0. Module github.com/terraform-providers/terraform-provider-random at
// v3.6.0 source: the proxy's pseudo-version of the 2023-12-04 release commit (CHANGELOG tops at 3.6.0);
// the hashicorp/ path's v2+ tags carry no /vN module path, so the proxy refuses them.
package tools

import _ "github.com/terraform-providers/terraform-provider-random"
