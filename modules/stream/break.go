package stream

import (
	"context"
	"time"

	"github.com/coder/websocket"

	"github.com/imshard/imshard/modules/testhook"
)

// twice is the testhook.DupFrame breakage: a live message frame (one with
// a creation time) written a second time. Inert in a shipped build.
func (c *conn) twice(frame []byte, created time.Time) error {
	if created.IsZero() || !testhook.Broken(testhook.DupFrame) {
		return nil
	}
	return c.ws.Write(context.Background(), websocket.MessageText, frame)
}
