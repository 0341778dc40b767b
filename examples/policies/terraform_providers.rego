# Terraform resources only from the providers the platform team has reviewed. The input
# names a Terraform resource's provider by its id, `<namespace>:<provider>:<type>:<name>`
# (`hashicorp:random:random_password:db`; stackflow refuses other ids). Terraform's
# built-in provider (`builtin:terraform:terraform_data:…`, nothing to install) is allowed.
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
	provider := _provider(c.id)
	not provider in allowed_providers
	msg := sprintf(
		"%s: Terraform provider %s is not allowed (allowed: %s): use one of those, or have %s reviewed and added to terraform_providers.rego",
		[c.id, provider, concat(", ", sort(allowed_providers - {"builtin/terraform"})), provider],
	)
}

_provider(id) := lower(sprintf("%s/%s", [parts[0], parts[1]])) if {
	parts := split(id, ":")
	count(parts) == 4
	parts[0] != ""
	parts[1] != ""
}
