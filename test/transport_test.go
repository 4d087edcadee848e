package test

import (
	"context"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/imshard/imshard/app"
	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
)

// transportSendStored sends n messages through e's API and proves each one
// reached its month table exactly once (through Kafka and the persist role).
func transportSendStored(t *testing.T, e *sendEnv, topic string, n int) {
	t.Helper()
	e.group(topic, 1, "active")
	e.member(topic, 7, "member", time.Time{})
	tok := e.Token(7, "")
	sent := make([]writepathSent, 0, n)
	for i := range n {
		cmid := fmt.Sprintf("%s-%d", topic, i)
		sent = append(sent, writepathSent{topic: topic, cmid: cmid, resp: e.mustSend(tok, topic, sendBody(cmid, cmid))})
	}
	writepathCheckStored(t, e, sent, e.Start)
}

// transportStartErr starts an App on cfg and returns its start error (nil
// when it started; it is then stopped).
func transportStartErr(t *testing.T, cfg *config.Config, roles ...string) error {
	t.Helper()
	a := app.New(cfg, zerolog.Nop())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := a.Start(ctx, roles)
	a.Close()
	return err
}

// The service sends and persists through brokers that demand TLS and SASL,
// with each mechanism it supports; a wrong password or a broker certificate
// from another CA stops the start with the reason.
func TestKafkaSASLAndTLS(t *testing.T) {
	pki := testenv.NewPKI(t)
	users := map[string][2]string{
		config.SASLPlain:       {"plain-user", "plain-pw"},
		config.SASLScramSHA256: {"scram256-user", "scram256-pw"},
		config.SASLScramSHA512: {"scram512-user", "scram512-pw"},
	}
	opts := []kfake.Opt{kfake.EnableSASL(), kfake.TLS(pki.ServerTLS)}
	for mech, up := range users {
		opts = append(opts, kfake.Superuser(mech, up[0], up[1]))
	}
	brokers := testenv.Kafka(t, opts...)
	secure := func(mech, user, pass string, tls config.TLS) func(*config.Config) {
		return func(c *config.Config) {
			c.Kafka.SASL = config.SASL{Mechanism: mech, Username: user, Password: pass}
			c.Kafka.TLS = tls
		}
	}
	caOnly := config.TLS{Enabled: true, CAFile: pki.CAFile}
	for _, mech := range []string{config.SASLPlain, config.SASLScramSHA256, config.SASLScramSHA512} {
		t.Run(mech, func(t *testing.T) {
			tls := caOnly
			if mech == config.SASLScramSHA512 {
				// with a client certificate too, as a broker requiring mTLS wants
				tls.CertFile, tls.KeyFile = pki.ClientCertFile, pki.ClientKeyFile
			}
			up := users[mech]
			e := writepathStart(t, harness.Options{Brokers: brokers, Mutate: secure(mech, up[0], up[1], tls)})
			transportSendStored(t, e, "secure-"+strings.ToLower(mech), 5)
		})
	}

	t.Run("wrong password", func(t *testing.T) {
		cfg := harness.Config(t, testenv.NewTenant(t), harness.Options{Brokers: brokers,
			Mutate: secure(config.SASLScramSHA256, "scram256-user", "not-the-password", caOnly)})
		err := transportStartErr(t, cfg, app.Persist)
		if err == nil || !strings.Contains(err.Error(), "refused the connection (check kafka.tls and kafka.sasl)") {
			t.Fatalf("start with a wrong SASL password: %v, want the brokers' refusal", err)
		}
	})
	t.Run("wrong CA", func(t *testing.T) {
		other := testenv.NewPKI(t)
		cfg := harness.Config(t, testenv.NewTenant(t), harness.Options{Brokers: brokers,
			Mutate: secure(config.SASLScramSHA256, "scram256-user", "scram256-pw", config.TLS{Enabled: true, CAFile: other.CAFile})})
		err := transportStartErr(t, cfg, app.Persist)
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("start against a broker certificate of another CA: %v, want a certificate error", err)
		}
	})
}

// The service runs against a Redis that demands an ACL user and TLS with a
// client certificate; a wrong password or a server certificate from another
// CA fails the start with the reason.
func TestRedisACLAndTLS(t *testing.T) {
	pki := testenv.NewPKI(t)
	tlsPort := testenv.FreePort(t)
	srv := testenv.StartRedis(t, "--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", pki.ServerCertFile, "--tls-key-file", pki.ServerKeyFile,
		"--tls-ca-cert-file", pki.CAFile, "--tls-auth-clients", "yes")
	admin := testenv.RedisClient(t, srv.Addr)
	ctx := context.Background()
	for _, cmd := range [][]string{
		{"ACL", "SETUSER", "imshard", "on", ">redis-acl-pw", "~*", "&*", "+@all"},
		{"ACL", "SETUSER", "default", "off"}, // nobody gets in without the user
	} {
		if err := admin.Do(ctx, admin.B().Arbitrary(cmd...).Build()).Error(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	secure := func(pass string, ca string) func(*config.Config) {
		return func(c *config.Config) {
			c.Redis.Addrs = []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))}
			c.Redis.Username, c.Redis.Password = "imshard", pass
			c.Redis.TLS = config.TLS{Enabled: true, CAFile: ca, CertFile: pki.ClientCertFile, KeyFile: pki.ClientKeyFile}
		}
	}
	e := writepathStart(t, harness.Options{Mutate: secure("redis-acl-pw", pki.CAFile)})
	transportSendStored(t, e, "secure-redis", 5)

	t.Run("wrong password", func(t *testing.T) {
		cfg := harness.Config(t, testenv.NewTenant(t), harness.Options{Mutate: secure("not-the-password", pki.CAFile)})
		err := transportStartErr(t, cfg, app.Query)
		if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("start with a wrong Redis password: %v, want WRONGPASS", err)
		}
	})
	t.Run("wrong CA", func(t *testing.T) {
		cfg := harness.Config(t, testenv.NewTenant(t), harness.Options{Mutate: secure("redis-acl-pw", testenv.NewPKI(t).CAFile)})
		err := transportStartErr(t, cfg, app.Query)
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Fatalf("start against a Redis certificate of another CA: %v, want a certificate error", err)
		}
	})
}

// transportGrants are the privileges docs/operations.md grants the service's
// MySQL account, read from the GRANT statement of its install section.
func transportGrants(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?m)^GRANT ([A-Z, ]+) ON `imshard\\\\_%`\\.\\* TO 'imshard'@").FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/operations.md has no GRANT … ON `imshard\\_%`.* TO 'imshard'@… line")
	}
	return string(m[1])
}

// The service runs against a MariaDB that admits its account only over TLS,
// with exactly the privileges the operations guide grants; without TLS, with
// a wrong password or against a certificate from another CA the start fails
// with the reason.
func TestMySQLTLS(t *testing.T) {
	pki := testenv.NewPKI(t)
	m := testenv.StartMariaDB(t, "--ssl-ca="+pki.CAFile, "--ssl-cert="+pki.ServerCertFile, "--ssl-key="+pki.ServerKeyFile)
	root := testenv.OpenDB(t, m.AdminDSN)
	for _, q := range []string{
		"CREATE USER 'imshard'@'127.0.0.1' IDENTIFIED BY 'mysql-tls-pw' REQUIRE SSL",
		"GRANT " + transportGrants(t) + " ON `imshard\\_%`.* TO 'imshard'@'127.0.0.1'",
	} {
		if _, err := root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	secure := func(pass string, tls config.TLS) func(*config.Config) {
		return func(c *config.Config) {
			c.MySQL.DSNTemplate = "imshard:" + pass + "@tcp(" + m.Addr + ")/imshard_{tenant}?parseTime=true&loc=UTC"
			c.MySQL.TLS = tls
		}
	}
	caOnly := config.TLS{Enabled: true, CAFile: pki.CAFile}
	e := writepathStart(t, harness.Options{Mutate: secure("mysql-tls-pw", caOnly)})
	transportSendStored(t, e, "secure-mysql", 5)
	var name, cipher string
	if err := e.DB.QueryRow("SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil || cipher == "" {
		t.Fatalf("the tenant pool's session is not encrypted: cipher %q, %v", cipher, err)
	}

	for _, tc := range []struct {
		name, pass string
		tls        config.TLS
		want       string
	}{
		{"no TLS", "mysql-tls-pw", config.TLS{}, "Error 1045"},
		{"wrong password", "not-the-password", caOnly, "Error 1045"},
		{"wrong CA", "mysql-tls-pw", config.TLS{Enabled: true, CAFile: testenv.NewPKI(t).CAFile}, "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := harness.Config(t, testenv.NewTenant(t), harness.Options{Mutate: secure(tc.pass, tc.tls)})
			err := transportStartErr(t, cfg, app.Query)
			if err == nil || !strings.Contains(err.Error(), "mysql refused the connection") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("start: %v, want the refusal with %q", err, tc.want)
			}
		})
	}
}
