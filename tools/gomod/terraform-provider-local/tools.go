//go:build tools

// Package tools pins the hashicorp/local Terraform provider, installed into the offline mirror
// as version 1.4.0. Module github.com/terraform-providers/terraform-provider-local at
// v1.4.0 (tagged, terraform-plugin-sdk v1, plugin protocol 5); 2.x tags carry no /vN
// module path, so the proxy refuses them.
package tools

import _ "github.com/terraform-providers/terraform-provider-local"
