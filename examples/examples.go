// Package examples ships the demo: a small workspace, the prompt for it and
// the scripted model script that drives the reference agent (cmd/taskrun-agent)
// through it: it lists the workspace, reads files, fixes a TODO, writes a
// changelog and a report artifact, and gives a final answer.
//
// Everything is embedded so a demo needs no file paths; gateway.DemoScriptName
// selects DemoScript as a scripted model.
package examples

import (
	"embed"
	"io/fs"
)

// DemoScript is examples/demo/script.jsonl: one scripted model response per line.
//
//go:embed demo/script.jsonl
var DemoScript []byte

// DemoPrompt is the task prompt that goes with DemoScript.
//
//go:embed demo/prompt.txt
var DemoPrompt string

//go:embed demo/workspace
var demoFiles embed.FS

// DemoWorkspace returns the demo workspace's files, rooted at the workspace.
func DemoWorkspace() fs.FS {
	sub, err := fs.Sub(demoFiles, "demo/workspace")
	if err != nil {
		panic(err) // the embedded directory is fixed at build time
	}
	return sub
}
