package httpapi

import (
	"strconv"
	"time"
)

// InvalidField is a 400 invalid_argument whose details name the field or
// parameter the client must fix (docs/api.md "Times, tokens and cursors").
func InvalidField(field, msg string) *Error {
	return Errorf(CodeInvalidArgument, msg).WithDetails(map[string]any{"field": field})
}

// Bounds of every time a client sends. Nothing the service stores or
// compares predates EarliestTime — the first month a table can be built
// for — and nothing a client means lies more than HorizonYears ahead: a
// value outside is a client bug or a forgery, refused before it can reach
// a DATETIME column, a cache entry or a comparison with stored times.
var EarliestTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// HorizonYears is how far past the server's clock a client time may lie.
const HorizonYears = 100

// Horizon is the latest time a client may send at now.
func Horizon(now time.Time) time.Time { return now.UTC().AddDate(HorizonYears, 0, 0) }

// CheckTime refuses t, the value of field, unless EarliestTime <= t <=
// Horizon(now).
func CheckTime(field string, t, now time.Time) error {
	if t.Before(EarliestTime) || t.After(Horizon(now)) {
		return InvalidField(field, field+" must lie between "+EarliestTime.Format(time.RFC3339)+
			" and "+strconv.Itoa(HorizonYears)+" years from now")
	}
	return nil
}

// ParseTime reads field's RFC 3339 value and checks it (CheckTime); the
// answer is in UTC.
func ParseTime(field, v string, now time.Time) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, InvalidField(field, field+" must be an RFC 3339 time")
	}
	if err := CheckTime(field, t, now); err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}
