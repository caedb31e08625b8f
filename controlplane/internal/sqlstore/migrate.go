package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Migration is one schema step, applied once, in version order.
type Migration struct {
	Version int
	SQL     string
}

// LoadMigrations reads NNNN_name.sql files from dir in fsys.
func LoadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	ents, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var out []Migration
	for _, e := range ents {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(name, ".sql") {
			return nil, fmt.Errorf("migration %q: name it NNNN_what.sql", name)
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		out = append(out, Migration{Version: v, SQL: string(b)})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

// Migrate applies, on conn, each migration newer than the schema's version,
// each in its own transaction with its version row. The caller serializes
// concurrent migrators (an advisory lock on PostgreSQL; SQLite's write lock,
// taken at BEGIN with _txlock=immediate).
func Migrate(ctx context.Context, conn *sql.Conn, d Dialect, ms []Migration) error {
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		return fmt.Errorf("%s: create schema_migrations: %w", d.Name, err)
	}
	s := &Store{d: d}
	for _, m := range ms {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("%s: migration %d: %w", d.Name, m.Version, err)
		}
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM schema_migrations WHERE version = ?`), m.Version).Scan(&n); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("%s: migration %d: %w", d.Name, m.Version, err)
		}
		if n > 0 {
			_ = tx.Rollback()
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("%s: apply migration %d: %w", d.Name, m.Version, err)
		}
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`), m.Version, time.Now().UnixMilli()); err != nil {
			_ = tx.Rollback()
			return fmt.Errorf("%s: record migration %d: %w", d.Name, m.Version, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("%s: commit migration %d: %w", d.Name, m.Version, err)
		}
	}
	return nil
}
