//go:build tools

// Package tools pins the Temporal CLI (the dev server and its embedded Web UI). The CLI's
// go.mod replaces its nested module github.com/temporalio/cli/cliext with a local directory,
// and the module proxy serves no version of that nested module: cliext/ here is its source
// (MIT, github.com/temporalio/cli, tests left out), put in its place by this module's replace.
package tools

import _ "github.com/temporalio/cli/cmd/temporal"
