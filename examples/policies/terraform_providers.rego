# Terraform resources only from the providers the platform team has reviewed. What is
# installed is the resource's `extensions.provider` (`registry.terraform.io/hashicorp/
# random/3.6.0`); a resource without one is judged by its id,
# `<namespace>:<provider>:<type>:<name>` (`hashicorp:random:random_password:db`).
# Terraform's built-in provider (`terraform.io/builtin/terraform`, nothing to install) is
# allowed.
package stackflow

import data.stackflow.lib

allowed_providers := {
	"hashicorp/random",
	"hashicorp/null",
	"hashicorp/local",
	"hashicorp/aws",
	"builtin/terraform",
}

deny contains {"msg": msg, "resource": c.id} if {
	some c in lib.changing
	c.type == "Terraform"
	provider := _provider(c)
	not provider in allowed_providers
	msg := sprintf(
		"%s: Terraform provider %s is not allowed (allowed: %s): use one of those, or have %s reviewed and added to terraform_providers.rego",
		[c.id, provider, concat(", ", sort(allowed_providers - {"builtin/terraform"})), provider],
	)
}

# registry host / namespace / name / version: the namespace and the name
_provider(c) := lower(sprintf("%s/%s", [parts[n - 3], parts[n - 2]])) if {
	parts := split(trim_suffix(c.extensions.provider, "/"), "/")
	n := count(parts)
	n >= 4
}

# registry host / namespace / name (no version)
_provider(c) := lower(sprintf("%s/%s", [parts[1], parts[2]])) if {
	parts := split(trim_suffix(c.extensions.provider, "/"), "/")
	count(parts) == 3
}

_provider(c) := lower(sprintf("%s/%s", [parts[0], parts[1]])) if {
	not c.extensions.provider
	parts := split(c.id, ":")
	count(parts) == 4
	parts[0] != ""
	parts[1] != ""
}
