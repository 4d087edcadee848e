package testenv

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// RedisCounter is a TCP proxy in front of one Redis server that counts the
// commands clients send through it, by name — what a client asks for, not
// what Redis runs (INFO commandstats also counts the commands a script
// calls). FCALL is counted per function, with the library's version suffix
// cut off ("fcall imshard_send").
type RedisCounter struct {
	Addr string

	mu     sync.Mutex
	counts map[string]int
	match  func(args []string) bool // Before's
	before func()
}

// Before runs fn once, just before the first command for which match
// answers true is passed on (match sees every command, in the order the
// proxy reads them, one at a time): what fn does to Redis comes between
// what the client sent until then and that command.
func (c *RedisCounter) Before(match func(args []string) bool, fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.match, c.before = match, fn
}

// CountRedisCommands starts a counting proxy to upstream; it is closed on
// cleanup.
func CountRedisCommands(t testing.TB, upstream string) *RedisCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy: %v", err)
	}
	c := &RedisCounter{Addr: ln.Addr().String(), counts: map[string]int{}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(cs ...net.Conn) {
		mu.Lock()
		conns = append(conns, cs...)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = down.Close()
				continue
			}
			track(down, up)
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(down, up)
				_ = down.Close()
			}()
			go func() {
				defer wg.Done()
				c.forward(bufio.NewReader(down), up)
				_ = up.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, cn := range conns {
			_ = cn.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return c
}

// forward passes RESP commands (arrays of bulk strings) to up, each
// counted before it leaves, until the stream ends.
func (c *RedisCounter) forward(r *bufio.Reader, up io.Writer) {
	for {
		var raw []byte
		args, err := readCommand(r, &raw)
		if err != nil || len(args) == 0 {
			return
		}
		name := strings.ToLower(args[0])
		if name == "fcall" && len(args) > 1 {
			fn := args[1]
			if i := strings.LastIndexByte(fn, '_'); i > 0 {
				fn = fn[:i]
			}
			name += " " + fn
		}
		c.mu.Lock()
		c.counts[name]++
		var fn func()
		if c.before != nil && c.match(args) {
			fn, c.before = c.before, nil
		}
		c.mu.Unlock()
		if fn != nil {
			fn()
		}
		if _, err := up.Write(raw); err != nil {
			return
		}
	}
}

// readCommand reads one command, appending its bytes to raw.
func readCommand(r *bufio.Reader, raw *[]byte) ([]string, error) {
	n, err := readLen(r, '*', raw)
	if err != nil {
		return nil, err
	}
	args := make([]string, n)
	for i := range args {
		m, err := readLen(r, '$', raw)
		if err != nil {
			return nil, err
		}
		b := make([]byte, m+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		*raw = append(*raw, b...)
		args[i] = string(b[:m])
	}
	return args, nil
}

func readLen(r *bufio.Reader, prefix byte, raw *[]byte) (int, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	*raw = append(*raw, line...)
	if len(line) < 3 || line[0] != prefix {
		return 0, fmt.Errorf("not RESP: %q", line)
	}
	return strconv.Atoi(strings.TrimRight(line[1:], "\r\n"))
}

// Take returns the counts since the last Take (or the start) and resets
// them.
func (c *RedisCounter) Take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.counts
	c.counts = map[string]int{}
	return out
}
