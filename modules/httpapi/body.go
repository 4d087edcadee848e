package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/imshard/imshard/modules/message"
)

// DecodeStrict decodes exactly one JSON value from r into v. The body must
// be UTF-8 JSON without a lone surrogate escape or a repeated object key
// anywhere (message.CheckJSON); unknown fields, trailing data, a value of
// the wrong type and a body past the http.MaxBytesReader limit are errors
// (invalid_argument, too_large) whose message names the field and what it
// must be, never the decoder's own words; a value of the wrong type also
// names its field in the details.
func DecodeStrict(r io.Reader, v any) error {
	body, err := io.ReadAll(r)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return Wrap(CodeTooLarge, "body exceeds "+strconv.FormatInt(tooLarge.Limit, 10)+" bytes", err)
		}
		return Wrap(CodeInvalidArgument, "body could not be read", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return Errorf(CodeInvalidArgument, "empty body")
	}
	if err := message.CheckJSON(body, 0); err != nil {
		if !json.Valid(body) {
			return Wrap(CodeInvalidArgument, "body must be a single valid JSON object", err)
		}
		return Wrap(CodeInvalidArgument, "body "+err.Error(), err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		e := Wrap(CodeInvalidArgument, describeDecodeError(err), err)
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			e.Details = map[string]any{"field": typeErr.Field}
		}
		return e
	}
	return nil
}

// describeDecodeError says in the API's words what a decode error of a
// valid JSON body means: a field of the wrong type, or an unknown field.
func describeDecodeError(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		want := describeType(typeErr.Type)
		if typeErr.Field == "" {
			return "body: expected " + want + ", got " + typeErr.Value
		}
		return fmt.Sprintf("field %q: expected %s, got %s", typeErr.Field, want, typeErr.Value)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return "unknown field " + name
	}
	return "body does not have the expected fields and types"
}

var (
	idType   = reflect.TypeFor[message.ID]()
	timeType = reflect.TypeFor[message.Time]()
)

// describeType names what a JSON value of Go type t must look like.
func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == idType:
		return "a decimal id (a string or a number)"
	case t == timeType:
		return "an RFC 3339 time"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "a JSON object"
	}
	return "a JSON value"
}
