# Helpers the example policies share. A module in another package than `stackflow` is a
# library: the policies import it (`import data.stackflow.lib`), it is not a policy itself.
package stackflow.lib

# What this run creates or changes. The policies hold these to their rules; a resource the
# run leaves as it is (UnChanged) or deletes is not judged again (see protected.rego for
# deletes).
changing contains c if {
	some c in input.changes
	c.action in {"Create", "Update"}
}

# Kubernetes objects this run creates or changes (`after` is the manifest).
kubernetes_changing contains c if {
	some c in changing
	c.type == "Kubernetes"
	is_object(c.after)
}

# "Deployment shop/web" (or "Namespace shop"): how messages name an object.
describe(obj) := sprintf("%s %s/%s", [obj.kind, obj.metadata.namespace, obj.metadata.name]) if {
	obj.metadata.namespace
} else := sprintf("%s %s", [object.get(obj, "kind", "object"), object.get(obj, ["metadata", "name"], "?")])

_template_kinds := {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}

workload_kinds := _template_kinds | {"CronJob", "Pod"}

# The pod spec of a workload manifest.
pod_spec(obj) := obj.spec if obj.kind == "Pod"

pod_spec(obj) := obj.spec.template.spec if obj.kind in _template_kinds

pod_spec(obj) := obj.spec.jobTemplate.spec.template.spec if obj.kind == "CronJob"

# Every container of a workload (init and ephemeral ones too).
containers(obj) := [container |
	spec := pod_spec(obj)
	some field in ["initContainers", "containers", "ephemeralContainers"]
	some container in object.get(spec, field, [])
]

# Why an image reference is not pinned (undefined when it is): a digest (`@sha256:…`) pins
# it; otherwise the last path segment must carry a tag other than `latest` (a registry port,
# `registry:5000/app`, is not a tag).
image_problem(image) := "names no tag (Kubernetes pulls :latest)" if {
	not contains(image, "@")
	not contains(_last_segment(image), ":")
}

image_problem(image) := "uses the moving :latest tag" if {
	not contains(image, "@")
	endswith(_last_segment(image), ":latest")
}

_last_segment(image) := parts[count(parts) - 1] if parts := split(image, "/")
