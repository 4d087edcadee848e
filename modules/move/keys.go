package move

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// encodeKey keeps a primary key value list as text with its types (a
// BIGINT compared to a string argument would be compared as a double and
// lose precision): "i:" signed, "u:" unsigned, "s:" bytes in base64.
func encodeKey(vals []any) (string, error) {
	parts := make([]string, len(vals))
	for i, v := range vals {
		switch x := v.(type) {
		case int64:
			parts[i] = "i:" + strconv.FormatInt(x, 10)
		case uint64:
			parts[i] = "u:" + strconv.FormatUint(x, 10)
		case []byte:
			parts[i] = "s:" + base64.StdEncoding.EncodeToString(x)
		case string:
			parts[i] = "s:" + base64.StdEncoding.EncodeToString([]byte(x))
		default:
			return "", fmt.Errorf("move: primary key value of type %T", v)
		}
	}
	b, err := json.Marshal(parts)
	return string(b), err
}

func decodeKey(s string) ([]any, error) {
	var parts []string
	if err := json.Unmarshal([]byte(s), &parts); err != nil {
		return nil, fmt.Errorf("move: chunk key: %w", err)
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		kind, val, ok := strings.Cut(p, ":")
		if !ok {
			return nil, fmt.Errorf("move: chunk key %q", s)
		}
		var err error
		switch kind {
		case "i":
			out[i], err = strconv.ParseInt(val, 10, 64)
		case "u":
			out[i], err = strconv.ParseUint(val, 10, 64)
		case "s":
			var b []byte
			b, err = base64.StdEncoding.DecodeString(val)
			out[i] = string(b)
		default:
			err = fmt.Errorf("kind %q", kind)
		}
		if err != nil {
			return nil, fmt.Errorf("move: chunk key %q: %w", s, err)
		}
	}
	return out, nil
}
