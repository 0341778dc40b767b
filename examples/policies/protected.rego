# No run deletes a resource marked protected: `stackflow.io/protected: "true"` as an
# annotation or label of a Kubernetes object, or a tag of a Terraform resource, as recorded
# (`before`). To delete one on purpose, first apply with the mark removed.
package stackflow

mark := "stackflow.io/protected"

deny contains {"msg": msg, "resource": c.id} if {
	some c in input.changes
	c.action == "Delete"
	is_object(c.before)
	some where in _marked(c.before)
	msg := sprintf(
		"%s is marked %s=\"true\" (%s) and this %s would delete it: keep it in the spec, or first apply with the mark removed, then delete it",
		[c.id, mark, where, input.operation],
	)
}

_marked(before) := {where |
	some where, value in {
		"annotation": object.get(before, ["metadata", "annotations", mark], null),
		"label": object.get(before, ["metadata", "labels", mark], null),
		"tag": object.get(before, ["tags", mark], null),
	}
	_true(value)
}

_true(value) if value == "true"

_true(value) if value == true
