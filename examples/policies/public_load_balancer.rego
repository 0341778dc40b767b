# No Service of type LoadBalancer open to the internet: a LoadBalancer must be internal
# (the cloud's internal-load-balancer annotation); public traffic goes through the Ingress.
package stackflow

import data.stackflow.lib

# Annotations that make a cloud load balancer internal, with their (lower-cased) values.
internal_annotations := {
	"networking.gke.io/load-balancer-type": {"internal"},
	"cloud.google.com/load-balancer-type": {"internal"},
	"service.beta.kubernetes.io/aws-load-balancer-internal": {"true"},
	"service.beta.kubernetes.io/aws-load-balancer-scheme": {"internal"},
	"service.beta.kubernetes.io/azure-load-balancer-internal": {"true"},
}

deny contains {"msg": msg, "resource": c.id} if {
	some c in lib.kubernetes_changing
	c.after.kind == "Service"
	c.after.spec.type == "LoadBalancer"
	not _internal(c.after)
	msg := sprintf(
		"%s is a public LoadBalancer: make it internal (annotation networking.gke.io/load-balancer-type: Internal on GKE, service.beta.kubernetes.io/aws-load-balancer-internal: \"true\" on AWS) or use type ClusterIP behind the Ingress",
		[lib.describe(c.after)],
	)
}

_internal(service) if {
	some key, values in internal_annotations
	value := service.metadata.annotations[key]
	is_string(value)
	lower(value) in values
}
