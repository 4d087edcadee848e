package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
)

// TestStopDrainsFromTheLoadBalancer: on a stop, /readyz answers 503 at once
// while the API still serves new requests for http.shutdown_delay; then the
// listener closes, and a request already in flight (its body still arriving)
// completes within http.shutdown_grace.
func TestStopDrainsFromTheLoadBalancer(t *testing.T) {
	t.Parallel()
	e := startSend(t, harness.Options{Mutate: func(c *config.Config) {
		c.HTTP.ShutdownDelay = 3 * time.Second
		c.HTTP.ShutdownGrace = 20 * time.Second
	}})
	e.group("room", 1, "active")
	e.member("room", 1, "member", time.Time{})
	user := e.Token(1, "")
	readyz := func() int {
		resp, err := http.Get(e.OpsURL + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz before the stop: %d", code)
	}
	apiAddr := strings.TrimPrefix(e.BaseURL, "http://")
	body, err := json.Marshal(sendBody("in-flight", "hello"))
	if err != nil {
		t.Fatal(err)
	}

	stopped := make(chan struct{})
	go func() { defer close(stopped); e.Stop() }()
	defer func() { <-stopped }()

	waitFor(t, time.Minute, func() bool { return readyz() == http.StatusServiceUnavailable })
	// Not ready, yet still serving: a load balancer that has not noticed yet
	// loses nothing. One request begins (headers and part of its body sent:
	// its handler runs, waiting for the rest), another completes.
	inflight, err := net.Dial("tcp", apiAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer inflight.Close()
	head := fmt.Sprintf("POST /v1/topics/room/messages HTTP/1.1\r\nHost: imshard\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", user, len(body))
	if _, err := inflight.Write(append([]byte(head), body[:5]...)); err != nil {
		t.Fatal(err)
	}
	if code, r := e.send(user, "room", sendBody("during-delay", "hi")); code != http.StatusCreated {
		t.Fatalf("the API must keep serving during http.shutdown_delay: %d %+v", code, r)
	}
	// The listener closes after the delay; the request in flight...
	waitFor(t, time.Minute, func() bool {
		c, err := net.Dial("tcp", apiAddr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	// ...completes after it closed.
	if _, err := inflight.Write(body[5:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(inflight), nil)
	if err != nil {
		t.Fatalf("the in-flight request was cut instead of drained: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("in-flight send: %d", resp.StatusCode)
	}
}
