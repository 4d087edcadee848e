package readpath

import (
	"context"
	"database/sql"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// History begins at a topic's retention floor: every seq below it is past
// retention and removed (modules/retention raises the floor's record and
// its Redis copy before it removes a row). Each read checks the copy — a
// page in its one Redis round trip — never a per-process cache, so no copy
// of a removed message (the hot cache, a process's recent copy) is served
// once the removal answered; see routing.Floors.

// ErrExpired answers a read of a seq below the floor.
func errExpired() error {
	return httpapi.Errorf(httpapi.CodeNotFound, "message is past retention").
		WithDetails(map[string]any{"reason": "expired"})
}

// floors reads the topics' retention floors.
func (s *Reader) floors() routing.Floors {
	return routing.Floors{Redis: s.p.Redis, Scripts: s.p.Scripts}
}

// RetentionFloor is the topic's retention floor (0: nothing expired).
func (s *Reader) RetentionFloor(ctx context.Context, db *sql.DB, keys routing.Keys, topic string) (int64, error) {
	return s.floors().Load(ctx, db, keys, topic)
}

// CheckExpired answers 404 expired for a seq below the topic's floor.
func (s *Reader) CheckExpired(ctx context.Context, db *sql.DB, keys routing.Keys, topic string, seq int64) error {
	f, err := s.RetentionFloor(ctx, db, keys, topic)
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
