package persist

import (
	"context"
	"errors"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
)

// failure is how a batch attempt failed, which decides what happens next.
type failure int

const (
	// transient: the database is down, busy or refusing everyone (connection
	// refused, deadlock, lock wait timeout, too many connections, read-only,
	// access denied): retried with backoff and jitter for as long as it
	// takes, offsets held back. Nothing about the events is wrong.
	transient failure = iota
	// missingTable: the month table is not registered or not there; retried
	// with backoff and counted as shard_missing, dead-lettered after
	// persist.max_retries.
	missingTable
	// permanent: the database refuses the data itself (invalid JSON, data too
	// long, incorrect string value, out of range, a check constraint) and
	// will refuse it on every attempt: the batch is split to find the events
	// refused, which are dead-lettered at once; the rest is stored.
	permanent
	// unclassified: an error persist does not know: retried with backoff
	// like a transient one, but only persist.max_retries times; then the
	// batch is split and the events still refused are dead-lettered.
	unclassified
	// fatal: the event can never be stored here (its tenant is not
	// configured): dead-lettered at once.
	fatal
	// aborted: the process is stopping; the batch is abandoned uncommitted.
	aborted
	// moved: the tenant's placement fence refused the batch (a move's
	// switch is under way, or this process still follows the placement
	// before it): nothing was written. The batch is parked — never
	// dead-lettered — and retried every movedRetry until this process
	// follows the new placement (within mysql.placement_poll).
	moved
)

// movedRetry is the fixed wait of a batch the placement fence refused: a
// switch parks the tenant's persistence for about a second, and a backoff
// growing past that would stretch the pause.
const movedRetry = 100 * time.Millisecond

// Server error numbers (MariaDB 10.11 and MySQL 8 share the numbers below
// 3000; the 3xxx ones are MySQL's, the 4xxx ones MariaDB's). Classified by
// number, never by message text.
//
// Refusals of the data: the same row fails the same way on every attempt.
var permanentErrors = map[uint16]string{
	1048: "ER_BAD_NULL_ERROR",                  // column cannot be null
	1153: "ER_NET_PACKET_TOO_LARGE",            // one event bigger than max_allowed_packet
	1263: "ER_WARN_NULL_TO_NOTNULL",            // NULL for a NOT NULL column (strict mode)
	1264: "ER_WARN_DATA_OUT_OF_RANGE",          // out of range value for column
	1265: "WARN_DATA_TRUNCATED",                // data truncated for column
	1292: "ER_TRUNCATED_WRONG_VALUE",           // incorrect datetime/number value
	1300: "ER_INVALID_CHARACTER_STRING",        // invalid utf8mb4 character string
	1366: "ER_TRUNCATED_WRONG_VALUE_FOR_FIELD", // incorrect string value (invalid UTF-8)
	1367: "ER_ILLEGAL_VALUE_FOR_TYPE",          // illegal value found during parsing
	1406: "ER_DATA_TOO_LONG",                   // data too long for column
	1411: "ER_WRONG_VALUE_FOR_TYPE",            // incorrect value for function
	1690: "ER_DATA_OUT_OF_RANGE",               // value out of range
	3140: "ER_INVALID_JSON_TEXT",               // MySQL: invalid JSON text for a JSON column
	3141: "ER_INVALID_JSON_TEXT_IN_PARAM",      // MySQL: invalid JSON text in argument
	3144: "ER_INVALID_JSON_CHARSET",            // MySQL: JSON from a binary string
	3146: "ER_INVALID_TYPE_FOR_JSON",           // MySQL: invalid data type for JSON
	3157: "ER_JSON_DOCUMENT_TOO_DEEP",          // MySQL: JSON nested deeper than 100
	3819: "ER_CHECK_CONSTRAINT_VIOLATED",       // MySQL: check constraint violated
	3854: "ER_CANNOT_CONVERT_STRING",           // MySQL: string not valid in the column's charset
	4025: "ER_CONSTRAINT_FAILED",               // MariaDB: a CHECK failed — json_valid() on a JSON column
}

// Conditions of the server or the connection: the next attempt may pass.
var transientErrors = map[uint16]string{
	1021: "ER_DISK_FULL",
	1037: "ER_OUTOFMEMORY",
	1038: "ER_OUT_OF_SORTMEMORY",
	1040: "ER_CON_COUNT_ERROR", // too many connections
	1041: "ER_OUT_OF_RESOURCES",
	1044: "ER_DBACCESS_DENIED_ERROR",
	1045: "ER_ACCESS_DENIED_ERROR",
	1047: "ER_UNKNOWN_COM_ERROR", // Galera node not ready
	1049: "ER_BAD_DB_ERROR",      // the tenant database is not there (yet)
	1053: "ER_SERVER_SHUTDOWN",
	1114: "ER_RECORD_FILE_FULL",
	1142: "ER_TABLEACCESS_DENIED_ERROR",
	1158: "ER_NET_READ_ERROR",
	1159: "ER_NET_READ_INTERRUPTED",
	1160: "ER_NET_ERROR_ON_WRITE",
	1161: "ER_NET_WRITE_INTERRUPTED",
	1180: "ER_ERROR_DURING_COMMIT",
	1203: "ER_TOO_MANY_USER_CONNECTIONS",
	1205: "ER_LOCK_WAIT_TIMEOUT",
	1213: "ER_LOCK_DEADLOCK",
	1226: "ER_USER_LIMIT_REACHED",
	1290: "ER_OPTION_PREVENTS_STATEMENT", // read-only (a failover in progress)
	1317: "ER_QUERY_INTERRUPTED",
	1614: "ER_XA_RBDEADLOCK",
	1792: "ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION",
	1836: "ER_READ_ONLY_MODE",
	1927: "ER_CONNECTION_KILLED",
	1969: "ER_STATEMENT_TIMEOUT", // MariaDB max_statement_time
	3024: "ER_QUERY_TIMEOUT",     // MySQL max_execution_time
}

func classify(ctx context.Context, err error) failure {
	if ctx.Err() != nil {
		return aborted
	}
	if errors.Is(err, routing.ErrShardNotRegistered) || errors.Is(err, errNotWritable) || routing.IsNoSuchTable(err) {
		return missingTable
	}
	if errors.Is(err, tenantdb.ErrUnknownTenant) {
		return fatal
	}
	if errors.Is(err, routing.ErrPlacementMoved) {
		return moved
	}
	if errors.Is(err, errInsertCollision) {
		// the slow path reads the existing keys with locks, so no concurrent
		// writer can slip in between: a row still not inserted collides on
		// a key persist cannot tell apart (message_id alone, or a
		// client_msg_id the column's collation compares equal to another)
		// and will on every attempt. Splitting the batch tries each part
		// again, which a race would pass.
		return permanent
	}
	if errors.Is(err, mysql.ErrPktTooLarge) {
		// the driver refused to send a statement over max_allowed_packet
		return permanent
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch {
		case permanentErrors[me.Number] != "":
			return permanent
		case transientErrors[me.Number] != "":
			return transient
		}
		return unclassified
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
	case permanent:
		return "rejected"
	case unclassified:
		return "unclassified"
	case fatal:
		return "unknown_tenant"
	case moved:
		return "moved"
	}
	return "aborted"
}
