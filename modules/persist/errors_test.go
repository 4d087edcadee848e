package persist

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/tenantdb"
)

func serverErr(n uint16) error {
	// wrapped as writeTx wraps it
	return fmt.Errorf("persist: insert im_group_messages_202601: %w", &mysql.MySQLError{Number: n, Message: "…"})
}

func TestClassifyByErrorNumber(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want failure
	}{
		// the data: refused on every attempt
		{"MariaDB json_valid check (deep, lone surrogate)", serverErr(4025), permanent},
		{"MySQL invalid JSON text", serverErr(3140), permanent},
		{"MySQL JSON too deep", serverErr(3157), permanent},
		{"MySQL check constraint", serverErr(3819), permanent},
		{"MySQL string not convertible", serverErr(3854), permanent},
		{"incorrect string value (invalid UTF-8)", serverErr(1366), permanent},
		{"data too long", serverErr(1406), permanent},
		{"out of range", serverErr(1264), permanent},
		{"value out of range", serverErr(1690), permanent},
		{"data truncated", serverErr(1265), permanent},
		{"column cannot be null", serverErr(1048), permanent},
		{"packet too large (server)", serverErr(1153), permanent},
		{"packet too large (driver)", fmt.Errorf("x: %w", mysql.ErrPktTooLarge), permanent},
		// the server or the connection: the next attempt may pass
		{"deadlock", serverErr(1213), transient},
		{"lock wait timeout", serverErr(1205), transient},
		{"too many connections", serverErr(1040), transient},
		{"server shutdown", serverErr(1053), transient},
		{"connection killed", serverErr(1927), transient},
		{"read-only", serverErr(1290), transient},
		{"access denied", serverErr(1045), transient},
		{"unknown database", serverErr(1049), transient},
		{"disk full", serverErr(1021), transient},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, transient},
		{"bad connection", fmt.Errorf("begin: %w", driver.ErrBadConn), transient},
		{"invalid connection", mysql.ErrInvalidConn, transient},
		{"eof", io.ErrUnexpectedEOF, transient},
		// the month table
		{"no such table", serverErr(1146), missingTable},
		{"month not registered", fmt.Errorf("x: %w", routing.ErrShardNotRegistered), missingTable},
		{"month not writable", fmt.Errorf("%w: prepared", errNotWritable), missingTable},
		// neither
		{"unknown column (schema drift)", serverErr(1054), unclassified},
		{"insert collides on a key persist cannot see", errInsertCollision, permanent},
		{"unknown tenant", fmt.Errorf("x: %w", tenantdb.ErrUnknownTenant), fatal},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := classify(context.Background(), c.err); got != c.want {
				t.Fatalf("classify(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := classify(ctx, serverErr(4025)); got != aborted {
		t.Fatalf("a stopping process aborts, got %v", got)
	}
}

func TestErrorNumbersAreInOneClassOnly(t *testing.T) {
	for n := range permanentErrors {
		if transientErrors[n] != "" || n == 1146 {
			t.Fatalf("error %d is in two classes", n)
		}
	}
	if transientErrors[1146] != "" {
		t.Fatal("1146 is the missing-table class")
	}
}

func TestRetryDelayIsJitteredWithinTheBackoff(t *testing.T) {
	s := &Service{p: Params{Config: config.Persist{RetryBackoff: 100 * time.Millisecond, RetryBackoffMax: time.Second}}}
	for n, d := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		d *= time.Millisecond
		seen := map[time.Duration]bool{}
		for range 50 {
			got := s.retryDelay(n)
			if got < d/2 || got > d {
				t.Fatalf("retryDelay(%d) = %v, want within [%v, %v]", n, got, d/2, d)
			}
			seen[got] = true
		}
		if len(seen) < 2 {
			t.Fatalf("retryDelay(%d) is not jittered: %v", n, seen)
		}
	}
}
