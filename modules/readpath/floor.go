package readpath

import (
	"context"
	"database/sql"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// History begins at a topic's retention floor: every seq below it is past
// retention and removed (modules/retention raises the floor before it
// removes a row). The floor is read from MySQL with each read, never
// cached, so no copy of a removed message — the hot cache, a process's
// recent copy — is served once the removal answered.

// ErrExpired answers a read of a seq below the floor.
func errExpired() error {
	return httpapi.Errorf(httpapi.CodeNotFound, "message is past retention").
		WithDetails(map[string]any{"reason": "expired"})
}

// Floor is the topic's retention floor (0: nothing expired).
func (s *Reader) Floor(ctx context.Context, db *sql.DB, topic string) (int64, error) {
	return routing.LoadFloor(ctx, db, topic)
}

// CheckExpired answers 404 expired for a seq below the topic's floor.
func (s *Reader) CheckExpired(ctx context.Context, db *sql.DB, topic string, seq int64) error {
	f, err := s.Floor(ctx, db, topic)
	if err != nil {
		return err
	}
	if seq < f {
		return errExpired()
	}
	return nil
}

// AboveFloor keeps the messages at or above floor.
func AboveFloor(ms []message.Message, floor int64) []message.Message {
	if floor <= 0 {
		return ms
	}
	out := ms[:0:0]
	for _, m := range ms {
		if m.Seq >= floor {
			out = append(out, m)
		}
	}
	return out
}
