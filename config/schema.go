package config

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// leaf is one settable key. The key list is derived from the Config type itself, so
// a field added to Config automatically gets a default, an env variable and
// unknown-key checking; a hand-kept list would drift.
type leaf struct {
	key   string // dotted, e.g. "http.shutdown_grace"
	index []int  // field path inside Config
	typ   reflect.Type
}

func (l leaf) env() string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(l.key, ".", "_"))
}

// isList reports a []string key, which env and flags give comma-separated.
func (l leaf) isList() bool {
	return l.typ.Kind() == reflect.Slice && l.typ.Elem().Kind() == reflect.String
}

func leaves() []leaf {
	var out []leaf
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			key := joinKey(prefix, keyName(f))
			idx := append(slices.Clone(index), i)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, key, idx)
				continue
			}
			out = append(out, leaf{key: key, index: idx, typ: f.Type})
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return out
}

// Keys lists every configuration key, in the order of the file (tenants is
// one key).
func Keys() []string {
	ls := leaves()
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.key
	}
	return out
}

func keyName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
	if name == "" {
		name = strings.ToLower(f.Name)
	}
	return name
}

func joinKey(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// normalize checks raw input (a parsed file or the IMSHARD_TENANTS JSON) against the
// shape of t and returns it with string-keyed, lower-cased maps. Doing this before
// viper sees the data matters: viper lets a scalar shadow a whole section (`http: 5`
// would silently drop the defaults below it) and only mapstructure's ErrorUnused
// would notice unknown keys, naming them without their full path.
func normalize(key string, in any, t reflect.Type) (any, []error) {
	switch {
	case t.Kind() == reflect.Struct:
		m, ok := asMap(in)
		if !ok {
			return nil, []error{&KeyError{Key: orRoot(key), Msg: "expected a mapping, got " + describe(in)}}
		}
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			fields[keyName(t.Field(i))] = t.Field(i).Type
		}
		out := make(map[string]any, len(m))
		seen := map[string]bool{}
		var errs []error
		for _, k := range sortedKeys(m) {
			name := strings.ToLower(k)
			sub := joinKey(key, name)
			ft, known := fields[name]
			switch {
			case !known:
				errs = append(errs, &KeyError{Key: sub, Msg: "unknown key"})
				continue
			case seen[name]:
				// Keys are case-insensitive, so "addr" and "Addr" are the same key twice.
				errs = append(errs, &KeyError{Key: sub, Msg: "given more than once (keys are case-insensitive)"})
				continue
			}
			seen[name] = true
			// A null value (`http:` with nothing below) means "keep the default".
			if m[k] == nil {
				continue
			}
			// Keep what is sound below a bad key, so its other values are still
			// decoded and their problems reported in the same run.
			v, e := normalize(sub, m[k], ft)
			errs = append(errs, e...)
			if v != nil {
				out[name] = v
			}
		}
		return out, errs

	case t.Kind() == reflect.Pointer:
		// an optional section (a tenant's own limits): checked as the
		// section it points to
		return normalize(key, in, t.Elem())

	case t.Kind() == reflect.Slice:
		switch v := in.(type) {
		case []any:
			if t.Elem().Kind() != reflect.Struct {
				return v, nil // element types are checked by the decode hook
			}
			out := make([]any, len(v))
			var errs []error
			for i, e := range v {
				n, ee := normalize(key+"["+strconv.Itoa(i)+"]", e, t.Elem())
				out[i], errs = n, append(errs, ee...)
			}
			return out, errs
		case string:
			if t.Elem().Kind() == reflect.String {
				return v, nil // comma-separated; split by the decode hook
			}
		}
		return nil, []error{&KeyError{Key: key, Msg: "expected a list, got " + describe(in)}}

	default:
		switch in.(type) {
		case []any, map[string]any, map[any]any:
			return nil, []error{&KeyError{Key: key, Msg: "expected a single value, got " + describe(in)}}
		}
		return in, nil
	}
}

func asMap(in any) (map[string]any, bool) {
	switch m := in.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		// YAML allows non-string keys; they can only be unknown keys, so a
		// printable form is enough to report them.
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[fmt.Sprint(k)] = v
		}
		return out, true
	}
	return nil, false
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// describe names a value's kind for error messages without printing it, because
// the value may be a secret.
func describe(in any) string {
	switch in.(type) {
	case nil:
		return "null"
	case map[string]any, map[any]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int, int64, uint64, float64:
		return "a number"
	}
	return fmt.Sprintf("%T", in)
}

func orRoot(key string) string {
	if key == "" {
		return "(top level)"
	}
	return key
}

// plain turns a Config value into maps, slices and scalars, the form viper stores;
// used to register every default.
func plain(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Struct:
		m := make(map[string]any, v.NumField())
		for i := range v.NumField() {
			m[keyName(v.Type().Field(i))] = plain(v.Field(i))
		}
		return m
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.String {
			return slices.Clone(v.Interface().([]string))
		}
		out := make([]any, v.Len())
		for i := range v.Len() {
			out[i] = plain(v.Index(i))
		}
		return out
	}
	return v.Interface()
}

// decodeHook converts scalars strictly. Strings come from env and flags and are
// parsed; YAML already typed the rest. It replaces mapstructure's weak typing, which
// would turn `shutdown_grace: 30` into 30ns and `auto_advance: 1` into true, and its
// stock duration hook, whose error drops the offending value.
func decodeHook(from, to reflect.Type, data any) (any, error) {
	if from == to || data == nil {
		return data, nil
	}
	switch {
	case to == reflect.TypeFor[time.Duration]():
		return toDuration(data)
	case to.Kind() == reflect.Bool:
		if s, ok := data.(string); ok {
			b, err := strconv.ParseBool(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("invalid boolean %q", s)
			}
			return b, nil
		}
		return nil, fmt.Errorf("expected true or false, got %s", describe(data))
	case to.Kind() == reflect.Int || to.Kind() == reflect.Int64:
		return toInt(data)
	case to.Kind() == reflect.Float64:
		return toFloat(data)
	case to.Kind() == reflect.String:
		// Not converting numbers keeps a password like 0123 from silently becoming "83".
		return nil, fmt.Errorf("expected a string, got %s (quote the value)", describe(data))
	case to.Kind() == reflect.Slice && to.Elem().Kind() == reflect.String:
		if s, ok := data.(string); ok {
			return splitList(s), nil
		}
	}
	return data, nil
}

func toDuration(data any) (any, error) {
	switch v := data.(type) {
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("invalid duration %q", v)
		}
		return d, nil
	case int, int64, uint64, float64:
		// A bare number has no unit; only zero is unambiguous.
		if fmt.Sprint(v) == "0" {
			return time.Duration(0), nil
		}
		return nil, fmt.Errorf("invalid duration %v: give a unit, e.g. \"30s\"", v)
	}
	return nil, fmt.Errorf("expected a duration such as \"30s\", got %s", describe(data))
}

func toInt(data any) (any, error) {
	switch v := data.(type) {
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("invalid integer %q", v)
		}
		return n, nil
	case int:
		return int64(v), nil
	case int64:
		return v, nil
	case uint64:
		if v > 1<<63-1 {
			return nil, fmt.Errorf("integer %d out of range", v)
		}
		return int64(v), nil
	case float64:
		// YAML reads 1e3 as a float; accept it when it is a whole number in range.
		if v >= 1<<63 || v < -(1<<63) || v != math.Trunc(v) {
			return nil, fmt.Errorf("invalid integer %v", v)
		}
		return int64(v), nil
	}
	return nil, fmt.Errorf("expected an integer, got %s", describe(data))
}

func toFloat(data any) (any, error) {
	switch v := data.(type) {
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("invalid number %q", v)
		}
		return f, nil
	case int:
		return float64(v), nil
	case int64:
		return float64(v), nil
	case uint64:
		return float64(v), nil
	}
	return nil, fmt.Errorf("expected a number, got %s", describe(data))
}

// splitList reads a comma-separated list, ignoring blanks so "a:1, b:2," works.
func splitList(s string) []string {
	out := []string{}
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
