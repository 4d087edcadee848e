package persist

import (
	"context"
	"errors"

	"github.com/go-sql-driver/mysql"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
)

// failure is how a batch attempt failed, which decides what happens next.
type failure int

const (
	// transient: the database is down or busy (connection refused, deadlock,
	// lock wait timeout): retried with backoff for as long as it takes,
	// offsets held back.
	transient failure = iota
	// missingTable: the month table is not registered or not there; retried
	// with backoff and counted as shard_missing, dead-lettered after
	// persist.max_retries.
	missingTable
	// poison: the rows themselves are refused (data too long, bad value):
	// the batch is split to find the event, which is dead-lettered after
	// persist.max_retries.
	poison
	// fatal: the event can never be stored here (its tenant is not
	// configured): dead-lettered at once.
	fatal
	// aborted: the process is stopping; the batch is abandoned uncommitted.
	aborted
)

// MySQL server error numbers persist tells apart.
const (
	erTooManyConns   = 1040
	erServerShutdown = 1053
	erLockWait       = 1205
	erDeadlock       = 1213
	erReadOnly       = 1290
	erNoSuchTable    = 1146
	erConnKilled     = 1927
	erQueryInterrupt = 1317
	erLockDeadlockMy = 1614 // XA deadlock
	erWsrepNotReady  = 1047
)

func classify(ctx context.Context, err error) failure {
	if ctx.Err() != nil {
		return aborted
	}
	if errors.Is(err, routing.ErrShardNotRegistered) {
		return missingTable
	}
	if errors.Is(err, tenantdb.ErrUnknownTenant) {
		return fatal
	}
	if errors.Is(err, errInsertRace) {
		// a real race passes on the next attempt; a row that collides on
		// message_id alone never does, and must end in the dead letters
		return poison
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case erNoSuchTable:
			return missingTable
		case erTooManyConns, erServerShutdown, erLockWait, erDeadlock, erReadOnly, erConnKilled,
			erQueryInterrupt, erLockDeadlockMy, erWsrepNotReady:
			return transient
		}
		return poison
	}
	// Everything else is the connection: refused, reset, timed out, bad conn.
	return transient
}

func (f failure) String() string {
	switch f {
	case transient:
		return "transient"
	case missingTable:
		return "shard_missing"
	case poison:
		return "rejected"
	case fatal:
		return "unknown_tenant"
	}
	return "aborted"
}
