package test

import (
	"context"
	"fmt"
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
