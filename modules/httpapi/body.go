package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
)

// DecodeStrict decodes exactly one JSON value from r into v: unknown
// fields, trailing data and a body past the http.MaxBytesReader limit are
// errors (invalid_argument, too_large).
func DecodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return bodyError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil {
			return bodyError(err)
		}
		return Errorf(CodeInvalidArgument, "body must be a single JSON object")
	}
	return nil
}

func bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return Wrap(CodeTooLarge, "body exceeds "+strconv.FormatInt(tooLarge.Limit, 10)+" bytes", err)
	}
	if errors.Is(err, io.EOF) {
		return Errorf(CodeInvalidArgument, "empty body")
	}
	return Wrap(CodeInvalidArgument, "invalid JSON body: "+err.Error(), err)
}
