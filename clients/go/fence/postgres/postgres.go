// Package postgres is a fence inside the caller's PostgreSQL transaction, through database/sql
// (any driver: pgx's stdlib, lib/pq).
//
// The same table and statement as the Rust adapter palisade_fence::postgres and the Python
// palisade.fence.postgres: writers in any of the three languages claiming the same scope are
// ordered by token, whichever runs first.
//
// Claim first, then read, then write: Claim (ClaimRead for a reader's transaction) is the first
// statement of the caller's transaction. It is one INSERT ... ON CONFLICT (scope) DO UPDATE ...
// WHERE token_max < presented OR (token_max = presented AND holder_session = presenting session,
// 0 for a shared grant: fence.StoredHolder), which locks the scope's row
// until the transaction ends, so concurrent claimers of one scope run one after another in token
// order, and an older claimer, re-evaluating the WHERE against the committed row under READ
// COMMITTED, is refused (fence.ErrStale). The caller's writes and the advance commit or roll back
// together. Under REPEATABLE READ or SERIALIZABLE a concurrent claim makes PostgreSQL abort with
// a serialization failure, a retryable fence.ErrStorage.
//
// The table name is not schema-qualified (resolved through search_path): keep it in a schema only
// trusted roles can create tables in.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"example.invalid/palisade/clients/go/fence"
	"example.invalid/palisade/clients/go/sequencer"
)

// CreateTableSQL is the DDL of the fence table (the Rust adapter's, character for character).
const CreateTableSQL = `CREATE TABLE IF NOT EXISTS palisade_fence (
        scope text PRIMARY KEY,
        lock_name text NOT NULL,
        token_max bigint NOT NULL CHECK (token_max >= 1),
        holder_session bigint NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now()
    )`

const advanceSQL = `INSERT INTO palisade_fence AS fence (scope, lock_name, token_max, holder_session)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (scope) DO UPDATE
        SET token_max = EXCLUDED.token_max,
            holder_session = EXCLUDED.holder_session,
            updated_at = now()
        WHERE fence.lock_name = EXCLUDED.lock_name
            AND (fence.token_max < EXCLUDED.token_max
                OR (fence.token_max = EXCLUDED.token_max
                    AND fence.holder_session = EXCLUDED.holder_session))
    RETURNING token_max`

const selectSQL = "SELECT lock_name, token_max, holder_session FROM palisade_fence WHERE scope = $1"

// EnsureSchema creates the fence table if it does not exist; safe from many processes at once.
func EnsureSchema(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, CreateTableSQL); err != nil {
		// Two concurrent CREATE TABLE IF NOT EXISTS can collide on the catalog (23505, 42P07).
		if state := sqlState(err); state == "23505" || state == "42P07" {
			return nil
		}
		return storage(err)
	}
	return nil
}

// Querier is a *sql.Tx (or a *sql.Conn inside a transaction).
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Claim claims scope for q inside tx, for a transaction that writes: advances the scope's
// accepted token to it, or refuses it (fence.ErrStale, fence.ErrTokenReissued,
// fence.ErrWrongLock, and a shared grant as fence.ErrSharedWrite; a reader's transaction claims
// with ClaimRead). expectLock, if not empty, refuses other bindings' sequencers even for the
// first claim. On an error, roll tx back.
func Claim(ctx context.Context, tx Querier, scope string, q sequencer.Verified, expectLock string) error {
	return ClaimWith(ctx, tx, scope, q, expectLock, fence.IntentWrite)
}

// ClaimRead is Claim for a transaction that only reads: any grant may, a shared one (a reader of
// a read-write lock) included. The transaction must not write: the fence cannot see what
// follows.
func ClaimRead(ctx context.Context, tx Querier, scope string, q sequencer.Verified, expectLock string) error {
	return ClaimWith(ctx, tx, scope, q, expectLock, fence.IntentRead)
}

// ClaimWith is the claim with the intent said (fence.IntentWrite refuses a shared grant).
func ClaimWith(ctx context.Context, tx Querier, scope string, q sequencer.Verified, expectLock string, intent fence.Intent) error {
	if err := fence.ValidateScope(scope); err != nil {
		return err
	}
	// The expected binding and a shared write need no stored state: refused before the database.
	if err := fence.Precheck(expectLock, q, intent); err != nil {
		return err
	}
	var stored int64
	// The holder is stored bit for bit in a bigint, as the Rust adapter does.
	err := tx.QueryRowContext(ctx, advanceSQL, scope, q.Binding(), int64(q.Token()), int64(fence.StoredHolder(q))).Scan(&stored)
	if err == nil {
		if uint64(stored) != q.Token() {
			return fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: the fence row holds token %d after advancing to %d; something other than the fence changed it", scope, stored, q.Token())
		}
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return storage(err)
	}
	// Refused. The upsert locked the row, so this read sees what refused us.
	state, err := read(ctx, tx, scope)
	if err != nil {
		return err
	}
	if state == nil {
		return fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: the claim was refused but no row holds the scope", scope)
	}
	return fence.ExplainRefusal(scope, *state, q, intent)
}

// State is the scope's state as tx sees it, or nil if no claim was accepted.
func State(ctx context.Context, tx Querier, scope string) (*fence.State, error) {
	if err := fence.ValidateScope(scope); err != nil {
		return nil, err
	}
	return read(ctx, tx, scope)
}

func read(ctx context.Context, tx Querier, scope string) (*fence.State, error) {
	var lock string
	var token, session int64
	err := tx.QueryRowContext(ctx, selectSQL, scope).Scan(&lock, &token, &session)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, storage(err)
	}
	state, err := fence.StoredState(scope, lock, uint64(token), uint64(session))
	return &state, err
}

// Commit commits tx (the claim and the caller's writes together). A serialization failure,
// deadlock (class 40) or deferred constraint (class 23) means it rolled back: fence.ErrStorage.
// Anything else (the connection failed during the commit) is fence.ErrOutcomeUnknown.
func Commit(tx *sql.Tx) error {
	err := tx.Commit()
	if err == nil {
		return nil
	}
	if state := sqlState(err); strings.HasPrefix(state, "40") || strings.HasPrefix(state, "23") {
		return storage(err)
	}
	return &fence.Error{Kind: fence.ErrOutcomeUnknown, Cause: err, Message: "outcome unknown: postgresql commit failed, it may or may not have committed: " +
		err.Error() + "; the write may or may not have been applied, read it back under a claim before retrying"}
}

// sqlState is the SQLSTATE of a driver's error (pgx's *pgconn.PgError and lib/pq's *pq.Error
// both have the method), or "".
func sqlState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}

func storage(err error) error {
	prefix := "postgresql error"
	if state := sqlState(err); state != "" {
		prefix += " " + state
	}
	return &fence.Error{Kind: fence.ErrStorage, Cause: err, Message: "fence storage error: " + prefix + ": " + err.Error()}
}
