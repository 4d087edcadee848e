package config

import (
	"bytes"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

const mask = "****"

// Masked renders the effective config as YAML, keys in file order, for `imshard
// config check` and startup logs. Secrets (tenant jwt_secret and keys' secret, the Redis and Kafka
// SASL passwords, the password inside any DSN) become "****"; empty ones stay empty so an operator can
// still see that a secret is missing. The output loads back with Load.
func (c *Config) Masked() ([]byte, error) {
	m := *c
	m.Redis.Addrs = append([]string(nil), c.Redis.Addrs...)
	m.Redis.Password = maskSecret(c.Redis.Password)
	m.Kafka.SASL.Password = maskSecret(c.Kafka.SASL.Password)
	m.MySQL.DSNTemplate = maskDSN(c.MySQL.DSNTemplate)
	m.Tenants = make([]Tenant, len(c.Tenants))
	for i, t := range c.Tenants {
		t.JWTSecret = maskSecret(t.JWTSecret)
		t.Keys = slices.Clone(t.Keys)
		for j := range t.Keys {
			t.Keys[j].Secret = maskSecret(t.Keys[j].Secret)
		}
		t.DSN = maskDSN(t.DSN)
		m.Tenants[i] = t
	}
	node, err := toNode(reflect.ValueOf(m))
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(node); err != nil {
		return nil, fmt.Errorf("config: render: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: render: %w", err)
	}
	return buf.Bytes(), nil
}

func maskSecret(s string) string {
	if s == "" {
		return ""
	}
	return mask
}

// maskDSN hides the password of a go-sql-driver DSN,
// [user[:password]@][net[(addr)]]/dbname[?params], finding it exactly as the
// driver does (last '/', last '@' before it, first ':' before that) so a password
// containing '@', ':' or '/' is hidden whole. URL-style DSNs are handled too.
func maskDSN(dsn string) string {
	if strings.Contains(dsn, "://") {
		if u, err := url.Parse(dsn); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), mask)
				return u.String()
			}
			return dsn
		}
	}
	end := strings.LastIndexByte(dsn, '/')
	if end < 0 {
		end = len(dsn)
	}
	at := strings.LastIndexByte(dsn[:end], '@')
	if at < 0 {
		return dsn
	}
	colon := strings.IndexByte(dsn[:at], ':')
	if colon < 0 || colon+1 == at {
		return dsn
	}
	return dsn[:colon+1] + mask + dsn[at:]
}

// toNode builds the YAML by hand rather than yaml.Marshal(Config): the key names are
// the mapstructure tags, durations must read "30s" rather than 30000000000, and a
// yaml.Node keeps the fields in declaration (file) order.
func toNode(v reflect.Value) (*yaml.Node, error) {
	switch {
	case v.Type() == reflect.TypeFor[time.Duration]():
		return scalar(fmtDuration(time.Duration(v.Int())))
	case v.Kind() == reflect.Pointer:
		if v.IsNil() {
			return scalar(nil)
		}
		return toNode(v.Elem())
	case v.Kind() == reflect.Struct:
		n := &yaml.Node{Kind: yaml.MappingNode}
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if strings.Contains(f.Tag.Get("yaml"), ",omitempty") && v.Field(i).IsZero() {
				continue
			}
			k, err := scalar(keyName(f))
			if err != nil {
				return nil, err
			}
			val, err := toNode(v.Field(i))
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, k, val)
		}
		return n, nil
	case v.Kind() == reflect.Slice:
		n := &yaml.Node{Kind: yaml.SequenceNode}
		if v.Len() == 0 {
			n.Style = yaml.FlowStyle // "[]" rather than nothing, so the key stays visible
		}
		for i := range v.Len() {
			e, err := toNode(v.Index(i))
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, e)
		}
		return n, nil
	}
	return scalar(v.Interface())
}

func scalar(x any) (*yaml.Node, error) {
	var n yaml.Node
	if err := n.Encode(x); err != nil {
		return nil, fmt.Errorf("config: render: %w", err)
	}
	return &n, nil
}

// fmtDuration drops the zero tails of time.Duration.String ("24h0m0s" → "24h") so
// rendered values look like what an operator writes.
func fmtDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
