package inbox

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/routing"
)

// The opaque values the read-state routes hand out — the topic list's
// cursor and the sync token — are base64url (no padding) of a compact JSON
// object. Each is decoded here, and only here, into a value every later
// step can use as is, or a 400 naming the parameter: a forged or damaged
// one never reaches MySQL (whose DATETIME cannot hold a time past year
// 9999) or a comparison with stored times.

// maxOpaque bounds the length of a cursor or token, far above any the API
// writes (a topic of 64 bytes and two moments).
const maxOpaque = 512

// TokenSkew is how far past this server's clock the moment a cursor or
// token names may lie: the sync token's is MySQL's clock and the list
// cursor's another server's, either of which may run ahead of this one's.
const TokenSkew = time.Hour

// listCursor pins a topic list snapshot: the moment of the first page and
// the sort key of the last topic served.
type listCursor struct {
	Snapshot int64  `json:"s"` // unix ms
	Pinned   bool   `json:"p"`
	Activity int64  `json:"a"` // unix ms
	Topic    string `json:"t"`
}

// syncToken is where a device's last sync ended: every change up to Since
// was reported, and of the changes at exactly Since those up to Topic.
type syncToken struct {
	Since int64  `json:"s"` // unix ms, MySQL's clock
	Topic string `json:"t,omitempty"`
}

func encodeOpaque(v any) string {
	b, _ := json.Marshal(v) // plain structs of numbers and strings
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeOpaque reads s into v, which must be the one value whose encoding
// is exactly s: padding, other field orders, spacing, unknown or repeated
// fields and numbers written another way are not what the API writes.
func decodeOpaque(field, s string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
	}
	if err != nil || encodeOpaque(v) != s {
		return badOpaque(field)
	}
	return nil
}

func badOpaque(field string) error {
	return httpapi.InvalidField(field, field+" is not one this API handed out")
}

// checkMoment refuses a moment (unix ms) before httpapi.EarliestTime or
// past now + TokenSkew.
func checkMoment(field string, ms int64, now time.Time) error {
	if ms < httpapi.EarliestTime.UnixMilli() || ms > now.Add(TokenSkew).UnixMilli() {
		return badOpaque(field)
	}
	return nil
}

// parseListCursor decodes the topic list's ?cursor= at now: a snapshot
// moment in bounds, the last topic served a topic, its activity not after
// the snapshot (a topic is placed by its activity at the snapshot).
func parseListCursor(s string, now time.Time) (listCursor, error) {
	const field = "cursor"
	var c listCursor
	if err := decodeOpaque(field, s, &c); err != nil {
		return listCursor{}, err
	}
	if err := checkMoment(field, c.Snapshot, now); err != nil {
		return listCursor{}, err
	}
	if c.Activity > c.Snapshot || routing.ValidTopic(c.Topic) != nil {
		return listCursor{}, badOpaque(field)
	}
	return c, nil
}

// parseSyncToken decodes ?token= of a sync at now: a moment in bounds and,
// when the token ended within the changes of one moment, a topic.
func parseSyncToken(s string, now time.Time) (syncToken, error) {
	const field = "token"
	var t syncToken
	if err := decodeOpaque(field, s, &t); err != nil {
		return syncToken{}, err
	}
	if err := checkMoment(field, t.Since, now); err != nil {
		return syncToken{}, err
	}
	if t.Topic != "" && routing.ValidTopic(t.Topic) != nil {
		return syncToken{}, badOpaque(field)
	}
	return t, nil
}
