package persist

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
)

// ErrMalformed marks an event that can never be stored as it is: it goes to
// the dead-letter topic at once, with the reason, instead of being retried.
var ErrMalformed = errors.New("malformed event")

// Column limits of the month table (sql/month_table.sql). An event over them
// is malformed here rather than a "data too long" error that would fail a
// whole batch in MySQL.
const (
	maxMsgType = 32
	maxEventID = 64
)

// DecodeEvent parses and checks one Kafka record value against the event
// contract (docs/events.md). It returns the event and its frozen month;
// the month is taken from the event as it is, never recomputed (invariant 2).
func DecodeEvent(value []byte) (*message.Event, routing.Month, error) {
	e := new(message.Event)
	if err := message.DecodeEvent(value, e); err != nil {
		return nil, routing.Month{}, fmt.Errorf("%w: json: %v", ErrMalformed, err)
	}
	if e.V != message.EventVersion {
		return nil, routing.Month{}, fmt.Errorf("%w: version %d, want %d", ErrMalformed, e.V, message.EventVersion)
	}
	if err := routing.ValidTenant(e.Tenant); err != nil {
		return nil, routing.Month{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := routing.ValidTopic(e.Topic); err != nil {
		return nil, routing.Month{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	// a month ParseMonth accepts always has a table name (FuzzParseMonth),
	// which Catalog.Table builds and checks again
	m, err := routing.ParseMonth(e.ShardMonth)
	if err != nil {
		return nil, routing.Month{}, fmt.Errorf("%w: shard_month: %v", ErrMalformed, err)
	}
	switch {
	case e.SeqID <= 0:
		return nil, routing.Month{}, fmt.Errorf("%w: seq_id %d", ErrMalformed, e.SeqID)
	case e.MessageID <= 0:
		return nil, routing.Month{}, fmt.Errorf("%w: message_id %d", ErrMalformed, e.MessageID)
	case e.EventID == "" || len(e.EventID) > maxEventID || !ascii(e.EventID):
		return nil, routing.Month{}, fmt.Errorf("%w: event_id", ErrMalformed)
	case e.MsgType == "" || len(e.MsgType) > maxMsgType || !utf8.ValidString(e.MsgType):
		return nil, routing.Month{}, fmt.Errorf("%w: msg_type", ErrMalformed)
	case e.CreatedAt.IsZero() || routing.MonthOf(e.CreatedAt.Time).IsZero():
		return nil, routing.Month{}, fmt.Errorf("%w: created_at", ErrMalformed)
	}
	// what send refuses is refused here once more: the database would
	if err := message.CheckClientMsgID(e.ClientMsgID); err != nil {
		return nil, routing.Month{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := message.CheckStored(e.Content, e.Head); err != nil {
		return nil, routing.Month{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return e, m, nil
}

func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
