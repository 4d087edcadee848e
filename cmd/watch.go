package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/imshard/imshard/modules/routing"
)

type watchOptions struct {
	api   string
	topic string
	token string
	since int64
}

// newWatchCmd follows a topic's realtime stream, so trying the API needs no
// WebSocket client of its own.
func newWatchCmd(g *globals) *cobra.Command {
	o := &watchOptions{}
	c := &cobra.Command{
		Use:   "watch --topic=X --token=JWT [--since=SEQ] [--api=URL]",
		Short: "Follow a topic's realtime stream and print each frame as a JSON line (Ctrl-C ends it)",
		Long: `Opens GET /v1/topics/{topic}/stream (docs/api.md, "Realtime stream") with the token
and prints every frame but the heartbeat pings, one JSON document per line: the
messages above --since, then each new message and each recall, edit or delete as
it happens. --api defaults to http.addr of the configuration.`,
		Example: `  imshard watch --topic=room1 --token="$ALICE" --since=0
  imshard watch --api=http://10.0.0.5:8080 --topic=room1 --token="$ALICE"`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := routing.ValidTopic(o.topic); err != nil {
				return usagef("--topic: %v", err)
			}
			if o.token == "" {
				return usagef("--token is required (imshard token --tenant=T --sub=U prints one)")
			}
			if c.Flags().Changed("since") && o.since < 0 {
				return usagef("--since must be at least 0, got %d", o.since)
			}
			if o.api == "" {
				cfg, err := g.load(nil)
				if err != nil {
					return err
				}
				host, port, err := net.SplitHostPort(cfg.HTTP.Addr)
				if err != nil {
					return usagef("--api not given and http.addr %q is not host:port", cfg.HTTP.Addr)
				}
				if host == "" || host == "0.0.0.0" || host == "::" {
					host = "127.0.0.1"
				}
				o.api = "http://" + net.JoinHostPort(host, port)
			}
			ctx, stop := signalContext()
			defer stop()
			return g.watch(ctx, o)
		},
	}
	c.Flags().StringVar(&o.api, "api", "", "the API's base URL (default: http.addr of the configuration)")
	c.Flags().StringVar(&o.topic, "topic", "", "the topic to follow (required)")
	c.Flags().StringVar(&o.token, "token", "", "a token of a member of the topic (required)")
	c.Flags().Int64Var(&o.since, "since", -1, "also print the messages above this seq (default: only new ones)")
	return c
}

// watch prints the frames of the stream until ctx ends (exit 0) or the
// server closes it (exit 1, with its close reason).
func (g *globals) watch(ctx context.Context, o *watchOptions) error {
	u, err := url.Parse(strings.TrimSuffix(o.api, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return usagef("--api: want an http:// or https:// URL, got %q", o.api)
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path += "/v1/topics/" + url.PathEscape(o.topic) + "/stream"
	if o.since >= 0 {
		u.RawQuery = url.Values{"since": {fmt.Sprint(o.since)}}.Encode()
	}
	ws, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + o.token}},
	})
	if err != nil {
		if resp != nil {
			return fmt.Errorf("watch %s: the server refused the stream: %s", o.topic, resp.Status)
		}
		return fmt.Errorf("watch %s: %w", o.topic, err)
	}
	defer func() { _ = ws.CloseNow() }()
	ws.SetReadLimit(1 << 22)
	for {
		_, frame, err := ws.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				_ = ws.Close(websocket.StatusNormalClosure, "")
				return nil
			}
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return fmt.Errorf("watch %s: the server closed the stream: %d %s", o.topic, ce.Code, ce.Reason)
			}
			return fmt.Errorf("watch %s: %w", o.topic, err)
		}
		var f struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(frame, &f) == nil && f.Type == "ping" {
			continue
		}
		if _, err := fmt.Fprintf(g.stdout, "%s\n", frame); err != nil {
			return err
		}
	}
}
