# Scaling a Deployment or StatefulSet beyond 20 replicas needs a person's approval (creating
# it that large, or raising spec.replicas above 20); more than 100 is refused outright.
package stackflow

import data.stackflow.lib

approval_above := 20

deny_above := 100

_scaled := {"Deployment", "StatefulSet"}

require_approval contains {"msg": msg, "resource": c.id} if {
	some c in lib.kubernetes_changing
	c.after.kind in _scaled
	replicas := c.after.spec.replicas
	is_number(replicas)
	replicas > approval_above
	replicas <= deny_above
	replicas > _replicas_before(c)
	msg := sprintf(
		"%s %s (more than %d needs approval): an approver must confirm, or keep spec.replicas at %d or fewer",
		[lib.describe(c.after), _scaling(c, replicas), approval_above, approval_above],
	)
}

deny contains {"msg": msg, "resource": c.id} if {
	some c in lib.kubernetes_changing
	c.after.kind in _scaled
	replicas := c.after.spec.replicas
	is_number(replicas)
	replicas > deny_above
	msg := sprintf(
		"%s asks for %d replicas, more than the %d allowed: lower spec.replicas (or split the workload)",
		[lib.describe(c.after), replicas, deny_above],
	)
}

_scaling(c, replicas) := sprintf("is created with %d replicas", [replicas]) if c.action == "Create"

_scaling(c, replicas) := sprintf("scales from %d to %d replicas", [_replicas_before(c), replicas]) if {
	c.action == "Update"
}

# Replicas before this run: 0 for a new object, Kubernetes' default 1 when unset.
_replicas_before(c) := object.get(c.before, ["spec", "replicas"], 1) if is_object(c.before)

_replicas_before(c) := 0 if not is_object(c.before)
