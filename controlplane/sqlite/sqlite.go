// Package sqlite is the control plane's store on SQLite (modernc.org/sqlite,
// pure Go): zero setup, one file, one writer. It suits one `taskrun serve`
// replica; use controlplane/postgres for several.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // the database/sql driver "sqlite"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// dialect: one connection, so every transaction runs alone; BEGIN IMMEDIATE
// takes the write lock up front against other processes on the same file.
var dialect = sqlstore.Dialect{Name: "sqlite", SchemaVersion: 5}

// Store is a controlplane.Store on one SQLite file.
type Store struct {
	*sqlstore.Store
}

var _ controlplane.Store = (*Store)(nil)

// Open opens (creating it if needed) the database file at path and applies
// the embedded migrations.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, fmt.Errorf("sqlite: no database path: give --db sqlite:///path/to/taskrun.db")
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("sqlite: create the database's directory: %w", err)
		}
	}
	q := url.Values{}
	q.Set("_txlock", "immediate")
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(NORMAL)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	ms, err := sqlstore.LoadMigrations(migrations, "migrations")
	if err != nil {
		db.Close()
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	err = sqlstore.Migrate(ctx, conn, dialect, ms)
	conn.Close()
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Store{sqlstore.New(db, dialect)}, nil
}
