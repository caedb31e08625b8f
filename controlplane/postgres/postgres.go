// Package postgres is the control plane's store on PostgreSQL (pgx): several
// `taskrun serve` replicas share one database. A lease is one transaction that
// picks the oldest fitting queued run with SELECT ... FOR UPDATE SKIP LOCKED
// and raises its epoch, so replicas never hand one run to two workers.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/taskrun/taskrun/controlplane"
	"github.com/taskrun/taskrun/controlplane/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

var dialect = sqlstore.Dialect{
	Name:          "postgres",
	Numbered:      true,
	LockRows:      "FOR UPDATE OF r",
	SkipLocked:    "FOR UPDATE OF r SKIP LOCKED",
	SchemaVersion: 5,
}

// migrationLock is the advisory lock key that serializes replicas applying
// migrations at the same time ("taskrun" in ASCII).
const migrationLock = 0x7461736b72756e

// Store is a controlplane.Store on PostgreSQL.
type Store struct {
	*sqlstore.Store
}

var _ controlplane.Store = (*Store)(nil)

// Open connects to dsn (postgres://user@host:port/db?sslmode=...), applies
// the embedded migrations under an advisory lock, and returns the store.
func Open(ctx context.Context, dsn string) (*Store, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	db.SetMaxOpenConns(16)
	if err := migrate(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return &Store{sqlstore.New(db, dialect)}, nil
}

func migrate(ctx context.Context, db *sql.DB) error {
	ms, err := sqlstore.LoadMigrations(migrations, "migrations")
	if err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("postgres: connect: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, int64(migrationLock)); err != nil {
		return fmt.Errorf("postgres: take the migration lock: %w", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(migrationLock)) //nolint:errcheck // the session ends with conn anyway
	return sqlstore.Migrate(ctx, conn, dialect, ms)
}

// the pgx driver registers itself as "pgx" when stdlib is imported.
var _ = stdlib.GetDefaultDriver
