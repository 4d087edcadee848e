package readpath

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/imshard/imshard/modules/message"
)

// Pages are rendered by hand (message.AppendJSON) into pooled buffers: the
// bytes are those httpapi.WriteJSON's encoder writes, at a fraction of the
// CPU, which on the list endpoint is most of the server's own work.
var renderBufs = sync.Pool{New: func() any { b := make([]byte, 0, 32<<10); return &b }}

func appendMessages(dst []byte, ms []message.Message) ([]byte, error) {
	dst = append(dst, `{"messages":[`...)
	for i, m := range ms {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		if dst, err = m.AppendJSON(dst); err != nil {
			return dst, err
		}
	}
	return append(dst, ']'), nil
}

func (p BeforePage) AppendJSON(dst []byte) ([]byte, error) {
	dst, err := appendMessages(dst, p.Messages)
	if err != nil {
		return dst, err
	}
	dst = append(dst, `,"next_before":`...)
	if p.NextBefore == nil {
		dst = append(dst, "null"...)
	} else {
		dst = strconv.AppendInt(dst, *p.NextBefore, 10)
	}
	return append(strconv.AppendBool(append(dst, `,"has_more":`...), p.HasMore), '}'), nil
}

func (p SincePage) AppendJSON(dst []byte) ([]byte, error) {
	dst, err := appendMessages(dst, p.Messages)
	if err != nil {
		return dst, err
	}
	dst = strconv.AppendInt(append(dst, `,"next_since":`...), p.NextSince, 10)
	dst = strconv.AppendBool(append(dst, `,"has_more":`...), p.HasMore)
	dst = append(dst, `,"gaps":`...)
	if p.Gaps == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i, g := range p.Gaps {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, g, 10)
		}
		dst = append(dst, ']')
	}
	return append(dst, '}'), nil
}

// WritePage answers 200 with the page, as httpapi.WriteJSON would (plus
// its length).
func WritePage(w http.ResponseWriter, render func([]byte) ([]byte, error)) error {
	bp := renderBufs.Get().(*[]byte)
	defer renderBufs.Put(bp)
	b, err := render((*bp)[:0])
	if err != nil {
		return err
	}
	b = append(b, '\n')
	*bp = b
	w.Header().Set("Content-Type", "application/json")
	// a known length spares the page chunked encoding and a second flush
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return nil
}
