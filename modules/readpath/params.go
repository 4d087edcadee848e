package readpath

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/imshard/imshard/modules/httpapi"
)

func Invalid(msg string) error { return httpapi.Errorf(httpapi.CodeInvalidArgument, msg) }

// Single returns the one value of key: a repeated parameter is ambiguous,
// so it is an error; an empty value counts as absent.
func Single(q url.Values, key string) (string, bool, error) {
	vs, ok := q[key]
	if !ok {
		return "", false, nil
	}
	if len(vs) != 1 {
		return "", false, httpapi.InvalidField(key, key+" given more than once")
	}
	if vs[0] == "" {
		return "", false, nil
	}
	return vs[0], true, nil
}

// ParseCursor reads a seq cursor: a decimal int64 of at least min. Signs,
// spaces, hex and values beyond int64 are rejected (invariant 11) with a
// 400 naming the parameter.
func ParseCursor(name, v string, min int64) (int64, error) {
	if v == "" || len(v) > 19 {
		return 0, httpapi.InvalidField(name, name+" must be a decimal seq")
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, httpapi.InvalidField(name, name+" must be a decimal seq")
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, httpapi.InvalidField(name, name+" is out of range")
	}
	if n < min {
		return 0, httpapi.InvalidField(name, name+" must be at least "+strconv.FormatInt(min, 10))
	}
	return n, nil
}

// ParseLimit reads a page size in [1, max]; absent means def.
func ParseLimit(name, v string, present bool, def, max int) (int, error) {
	if !present {
		return def, nil
	}
	n, err := ParseCursor(name, v, 1)
	if err != nil || n > int64(max) {
		return 0, httpapi.InvalidField(name, name+" must be 1.."+strconv.Itoa(max))
	}
	return int(n), nil
}

func PathSeq(r *http.Request) (int64, error) { return ParseCursor("seq", r.PathValue("seq"), 1) }
