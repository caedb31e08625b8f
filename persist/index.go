package persist

import (
	"bytes"
	"context"
	"sort"
	"strings"
	"time"
)

// IndexEntry is one run in a tenant's run index, as its key names it.
type IndexEntry struct {
	// Key is the index object's key (see IndexKey).
	Key    string    `json:"key"`
	UserID string    `json:"user_id"`
	RunID  string    `json:"run_id"`
	Start  time.Time `json:"start"`
}

// PutIndex writes a run's index object, a small JSON document, at
// IndexKey(ref, start), replacing an earlier one for the same run and start.
func (s *Store) PutIndex(ctx context.Context, ref RunRef, start time.Time, doc []byte) (ObjectInfo, error) {
	key, err := IndexKey(ref, start)
	if err != nil {
		return ObjectInfo{}, err
	}
	k, err := parseKey(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	return s.put(ctx, k, bytes.NewReader(doc), "application/json")
}

// ListIndex returns the run index, newest first: userID's runs, or with
// userID "" every tenant's. It lists only index keys, never the rest of the
// bucket. limit > 0 keeps the newest limit entries.
func (s *Store) ListIndex(ctx context.Context, userID string, limit int) ([]IndexEntry, error) {
	users := []string{userID}
	if userID == "" {
		var err error
		if users, err = s.Tenants(ctx); err != nil {
			return nil, err
		}
	}
	var out []IndexEntry
	for _, u := range users {
		prefix, err := IndexPrefix(u)
		if err != nil {
			return nil, err
		}
		keys, err := s.List(ctx, prefix)
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			e, err := ParseIndexKey(k)
			if err != nil {
				continue // not written by IndexKey: not part of the index
			}
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Start.Equal(out[j].Start) {
			return out[i].Start.After(out[j].Start)
		}
		return out[i].Key < out[j].Key
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Tenants lists the users that have anything stored, in key order, with one
// delimited listing of the tenants root.
func (s *Store) Tenants(ctx context.Context) ([]string, error) {
	var users []string
	err := s.do(ctx, "list", tenantsRoot+"/", func(ctx context.Context) error {
		users = users[:0]
		objs, err := s.bucket.List(ctx, tenantsRoot+"/", "/")
		if err != nil {
			return err
		}
		for _, obj := range objs {
			if !obj.IsDir {
				continue
			}
			u := strings.TrimSuffix(strings.TrimPrefix(obj.Key, tenantsRoot+"/"), "/")
			if validateID("user", u) == nil {
				users = append(users, u)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(users)
	return users, nil
}
