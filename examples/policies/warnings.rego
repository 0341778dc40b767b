# Warn-only: a ConfigMap or a file larger than 100 KiB (large configuration belongs in a
# volume or an image; the API server refuses objects above 1 MiB), and a resource whose
# live state drifted from what stackflow recorded (this run overwrites that change).
package stackflow

import data.stackflow.lib

large := 100 * 1024

warn contains {"msg": msg, "resource": c.id} if {
	some c in lib.kubernetes_changing
	c.after.kind == "ConfigMap"
	size := _config_map_size(c.after)
	size > large
	msg := sprintf(
		"%s holds %d KiB of data (more than 100 KiB): move large files to a volume or an image, or split it",
		[lib.describe(c.after), round(size / 1024)],
	)
}

warn contains {"msg": msg, "resource": c.id} if {
	some c in lib.changing
	c.type == "OnPrem"
	c.after.kind == "File"
	is_string(c.after.content)
	size := count(c.after.content)
	size > large
	msg := sprintf(
		"%s: file %s is %d KiB (more than 100 KiB): ship large files as a package or an artifact, not inline content",
		[c.id, c.after.path, round(size / 1024)],
	)
}

warn contains {"msg": msg, "resource": c.id} if {
	some c in input.changes
	c.drift == true
	msg := sprintf(
		"%s drifted: %s: if that change was wanted, write it into the spec first",
		[c.id, object.get(_drift, c.action, "its live state differs from what stackflow recorded")],
	)
}

_drift := {
	"Create": "it was deleted outside stackflow and this run creates it again",
	"Update": "it was changed outside stackflow and this run puts it back as the spec says",
	"Delete": "it was changed outside stackflow and this run deletes it",
}

# Characters of data plus decoded bytes of binaryData.
_config_map_size(obj) := text + binary if {
	text := sum([count(v) | some v in object.get(obj, "data", {}); is_string(v)])
	binary := sum([n | some v in object.get(obj, "binaryData", {}); is_string(v); n := (count(v) * 3) / 4])
}
