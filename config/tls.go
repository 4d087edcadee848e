package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Client builds the crypto/tls client configuration of a TLS section; nil when
// TLS is off. key is where the section sits ("kafka.tls"), so a file that cannot
// be used is reported as a *KeyError naming its key. Validate calls it to check
// the files; the clients call it to connect, so both read them the same way.
func (t TLS) Client(key string) (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, &KeyError{Key: key + ".ca_file", Msg: err.Error()}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, &KeyError{Key: key + ".ca_file", Msg: fmt.Sprintf("%s holds no PEM certificate", t.CAFile)}
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" && t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, &KeyError{Key: key + ".cert_file", Msg: err.Error()}
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// tlsSection checks one TLS section: settings that would be ignored are
// refused rather than silently dropped, and the files must load.
func (p *problems) tlsSection(key string, t TLS) {
	if !t.Enabled {
		set := []struct{ name, v string }{{"ca_file", t.CAFile}, {"cert_file", t.CertFile}, {"key_file", t.KeyFile}, {"server_name", t.ServerName}}
		for _, f := range set {
			if f.v != "" {
				p.add(key+".enabled", "is false but %s.%s is set: enable TLS or remove it", key, f.name)
				return
			}
		}
		return
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		p.add(key+".key_file", "is required with %s.cert_file", key)
		return
	case t.KeyFile != "" && t.CertFile == "":
		p.add(key+".cert_file", "is required with %s.key_file", key)
		return
	}
	if _, err := t.Client(key); err != nil {
		*p = append(*p, err)
	}
}
