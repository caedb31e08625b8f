package runindex

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/taskrun/taskrun/persist"
)

// execsDir holds a run's exec records, one object per command, so that
// recording one never races with the run rewriting its index record.
const execsDir = "execs/"

// maxExecs bounds how many exec records Execs reads.
const maxExecs = 1000

// PutExec records e, a command run inside the live container of rec's run,
// as the run object "execs/<time>.json".
func PutExec(ctx context.Context, store persist.PersistStorage, rec *Record, e Exec) (persist.ObjectInfo, error) {
	doc, err := json.Marshal(e)
	if err != nil {
		return persist.ObjectInfo{}, err
	}
	name := fmt.Sprintf("%s%019d.json", execsDir, e.At.UnixNano())
	info, err := store.PutRunFile(ctx, rec.Ref(), name, strings.NewReader(string(doc)), "application/json")
	if err != nil {
		return persist.ObjectInfo{}, fmt.Errorf("runindex: record exec in run %s: %w", rec.RunID, err)
	}
	return info, nil
}

// Execs returns the commands run inside rec's container, oldest first.
func Execs(ctx context.Context, store *persist.Store, rec *Record) ([]Exec, error) {
	prefix, err := persist.RunPrefix(rec.Ref())
	if err != nil {
		return nil, err
	}
	keys, err := store.List(ctx, prefix+execsDir)
	if err != nil {
		return nil, fmt.Errorf("runindex: list execs of run %s: %w", rec.RunID, err)
	}
	sort.Strings(keys)
	if len(keys) > maxExecs {
		keys = keys[len(keys)-maxExecs:]
	}
	var out []Exec
	for _, k := range keys {
		rc, err := store.Open(ctx, k)
		if err != nil {
			return nil, err
		}
		raw, err := io.ReadAll(io.LimitReader(rc, maxRecordBytes))
		rc.Close()
		if err != nil {
			return nil, err
		}
		var e Exec
		if err := json.Unmarshal(raw, &e); err != nil {
			return nil, fmt.Errorf("runindex: decode %s: %w", k, err)
		}
		out = append(out, e)
	}
	return out, nil
}
