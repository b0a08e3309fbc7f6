// Package mysql is a fence inside the caller's MySQL or MariaDB (InnoDB) transaction, through
// database/sql with github.com/go-sql-driver/mysql.
//
// The same table and statements as the Rust adapter palisade_fence::mysql: writers in either
// language claiming the same scope are ordered by token. Claim is the first statement of the
// caller's transaction: it inserts the scope's row if it is new (a first claim is always
// accepted), locks it with SELECT ... FOR UPDATE until the transaction ends, checks the
// sequencer against it (fence.Check) and advances it. Concurrent claimers of one scope run one
// after another; an older one finds the newer token and is refused (fence.ErrStale).
package mysql

import (
	"context"
	"database/sql"
	"errors"

	mysqldriver "github.com/go-sql-driver/mysql"

	"example.invalid/palisade/clients/go/fence"
	"example.invalid/palisade/clients/go/sequencer"
)

// CreateTableSQL is the DDL of the fence table (the Rust adapter's, character for character).
const CreateTableSQL = `CREATE TABLE IF NOT EXISTS palisade_fence (
        scope VARBINARY(512) NOT NULL PRIMARY KEY,
        lock_name VARBINARY(256) NOT NULL,
        token_max BIGINT UNSIGNED NOT NULL CHECK (token_max >= 1),
        holder_session BIGINT UNSIGNED NOT NULL,
        updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
    ) ENGINE = InnoDB`

// LockNameBytesMax is the lock_name column's size: a permit's binding (the lock, U+001F, up to
// four digits) must fit it.
const LockNameBytesMax = 256

const (
	lockRowSQL = `INSERT INTO palisade_fence (scope, lock_name, token_max, holder_session) VALUES (?, ?, ?, ?)
    ON DUPLICATE KEY UPDATE scope = scope`
	selectForUpdateSQL = "SELECT lock_name, token_max, holder_session FROM palisade_fence WHERE scope = ? FOR UPDATE"
	selectSQL          = "SELECT lock_name, token_max, holder_session FROM palisade_fence WHERE scope = ?"
	advanceSQL         = `UPDATE palisade_fence
    SET token_max = ?, holder_session = ?, updated_at = CURRENT_TIMESTAMP(6) WHERE scope = ?`
)

// EnsureSchema creates the fence table if it does not exist. Run it outside a transaction:
// MySQL commits the open transaction before any DDL.
func EnsureSchema(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, CreateTableSQL); err != nil {
		return storage(err)
	}
	return nil
}

// Claim claims scope for q inside tx, for a transaction that writes, or refuses it
// (fence.ErrStale, fence.ErrTokenReissued, fence.ErrWrongLock, and a shared grant as
// fence.ErrSharedWrite; a reader's transaction claims with ClaimRead). expectLock, if not empty,
// refuses other bindings' sequencers even for the first claim. On an error, roll tx back.
func Claim(ctx context.Context, tx *sql.Tx, scope string, q sequencer.Verified, expectLock string) error {
	return ClaimWith(ctx, tx, scope, q, expectLock, fence.IntentWrite)
}

// ClaimRead is Claim for a transaction that only reads: any grant may, a shared one (a reader of
// a read-write lock) included. The transaction must not write: the fence cannot see what
// follows.
func ClaimRead(ctx context.Context, tx *sql.Tx, scope string, q sequencer.Verified, expectLock string) error {
	return ClaimWith(ctx, tx, scope, q, expectLock, fence.IntentRead)
}

// ClaimWith is the claim with the intent said (fence.IntentWrite refuses a shared grant).
func ClaimWith(ctx context.Context, tx *sql.Tx, scope string, q sequencer.Verified, expectLock string, intent fence.Intent) error {
	if err := fence.ValidateScope(scope); err != nil {
		return err
	}
	if err := fence.Precheck(expectLock, q, intent); err != nil {
		return err
	}
	if binding := q.Binding(); len(binding) > LockNameBytesMax {
		return fence.Errorf(fence.ErrInvalidRequest, "invalid fenced request: the binding of %s of lock %q is %d bytes, more than the %d of the lock_name column: use a lock name of at most %d bytes for a semaphore fenced in MySQL",
			q.Access(), q.Lock(), len(binding), LockNameBytesMax, LockNameBytesMax-5)
	}
	if _, err := tx.ExecContext(ctx, lockRowSQL, []byte(scope), []byte(q.Binding()), q.Token(), fence.StoredHolder(q)); err != nil {
		return storage(err)
	}
	stored, err := read(ctx, tx, selectForUpdateSQL, scope)
	if err != nil {
		return err
	}
	if stored == nil {
		return fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: the fence row was locked but cannot be read", scope)
	}
	next, err := fence.Check(stored, expectLock, q, intent)
	if err != nil {
		return err
	}
	if next == *stored {
		return nil
	}
	result, err := tx.ExecContext(ctx, advanceSQL, next.TokenMax, next.HolderSession, []byte(scope))
	if err != nil {
		return storage(err)
	}
	if rows, err := result.RowsAffected(); err != nil || rows != 1 {
		return fence.Errorf(fence.ErrCorrupt, "fence state of scope %q is corrupt: advancing the locked fence row changed %d rows, not 1", scope, rows)
	}
	return nil
}

// State is the scope's state as tx sees it, or nil if no claim was accepted.
func State(ctx context.Context, tx *sql.Tx, scope string) (*fence.State, error) {
	if err := fence.ValidateScope(scope); err != nil {
		return nil, err
	}
	return read(ctx, tx, selectSQL, scope)
}

func read(ctx context.Context, tx *sql.Tx, query, scope string) (*fence.State, error) {
	var lock []byte
	var token, session uint64
	err := tx.QueryRowContext(ctx, query, []byte(scope)).Scan(&lock, &token, &session)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, storage(err)
	}
	state, err := fence.StoredState(scope, string(lock), token, session)
	return &state, err
}

// rolledBack are the server errors that mean a commit rolled back: a deadlock, a lock wait
// timeout, a failed binary-log write.
var rolledBack = map[uint16]bool{1213: true, 1205: true, 1180: true, 1181: true}

// Commit commits tx. Only server errors that mean it rolled back are fence.ErrStorage; anything
// else is fence.ErrOutcomeUnknown: it may or may not have committed.
func Commit(tx *sql.Tx) error {
	err := tx.Commit()
	if err == nil {
		return nil
	}
	var server *mysqldriver.MySQLError
	if errors.As(err, &server) && rolledBack[server.Number] {
		return storage(err)
	}
	return &fence.Error{Kind: fence.ErrOutcomeUnknown, Cause: err, Message: "outcome unknown: mysql commit failed, it may or may not have committed: " +
		err.Error() + "; the write may or may not have been applied, read it back under a claim before retrying"}
}

func storage(err error) error {
	return &fence.Error{Kind: fence.ErrStorage, Cause: err, Message: "fence storage error: mysql error: " + err.Error()}
}
