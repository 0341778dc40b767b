# Changes to the prod workspace go out Monday to Thursday, 08:00-17:00 UTC; outside that
# window a run needs a person's approval, unless the on-call engineer runs it. The time is
# the run's own clock (input.time), never the evaluation's: a replay judges the same input.
# Previews are not judged (the apply that follows is).
package stackflow

oncall := {"alice", "sre-oncall"}

window_days := {"Monday", "Tuesday", "Wednesday", "Thursday"}

window_hours := numbers.range(8, 16) # 08:00 to 16:59

_changes := count([c | some c in input.changes; c.action != "UnChanged"])

_in_window if {
	input.time.weekday in window_days
	input.time.hour in window_hours
}

require_approval contains msg if {
	input.stack.workspace == "prod"
	input.operation in {"apply", "destroy", "rollback"}
	_changes > 0
	not _in_window
	not input.requested_by in oncall
	msg := sprintf(
		"%s/prod: %s of %d change(s) by %s on %s %s, outside the prod change window (Monday-Thursday 08:00-17:00 UTC): an approver must confirm, or run it inside the window or through the on-call (%s)",
		[input.stack.project, input.operation, _changes, input.requested_by, input.time.weekday, substring(input.time.rfc3339, 11, 5), concat(", ", sort(oncall))],
	)
}
