# No container image without a tag or with `:latest` in Kubernetes workloads (Deployment,
# StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, Pod): what runs must be what was
# reviewed, and a rollback must bring back the same image.
package stackflow

import data.stackflow.lib

deny contains {"msg": msg, "resource": c.id} if {
	some c in lib.kubernetes_changing
	c.after.kind in lib.workload_kinds
	some container in lib.containers(c.after)
	image := container.image
	is_string(image)
	not startswith(image, "$kusion_path.") # a reference: known at apply
	problem := lib.image_problem(image)
	msg := sprintf(
		"%s: container %q image %q %s: pin a version tag or a digest (e.g. %s or %s@sha256:<digest>)",
		[lib.describe(c.after), container.name, image, problem, _example(image), _repository(image)],
	)
}

_repository(image) := trim_suffix(image, ":latest")

_example(image) := sprintf("%s:1.2.3", [_repository(image)])
