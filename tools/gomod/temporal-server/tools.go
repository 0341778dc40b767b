//go:build tools

// Package tools pins the Temporal server proper (`make up` with STACKFLOW_TEMPORAL_MODE=server),
// its SQL schema tool and the Temporal Web UI server, all built by scripts/setup.sh.
package tools

import (
	_ "github.com/temporalio/ui-server/v2/cmd/server"
	_ "go.temporal.io/server/cmd/server"
	_ "go.temporal.io/server/cmd/tools/sql"
)
