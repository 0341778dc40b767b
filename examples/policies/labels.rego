# Every Kubernetes object this run creates or changes carries the labels that say what it is
# and who owns it: `app.kubernetes.io/name` and `team` (non-empty).
package stackflow

import data.stackflow.lib

required_labels := {"app.kubernetes.io/name", "team"}

deny contains {"msg": msg, "resource": c.id} if {
	some c in lib.kubernetes_changing
	labels := object.get(c.after, ["metadata", "labels"], {})
	missing := {label | some label in required_labels; not _set(labels, label)}
	count(missing) > 0
	msg := sprintf(
		"%s lacks the label(s) %s: add them under metadata.labels (app.kubernetes.io/name: the application, team: the owning team)",
		[lib.describe(c.after), concat(", ", sort(missing))],
	)
}

_set(labels, label) if {
	is_string(labels[label])
	labels[label] != ""
}
