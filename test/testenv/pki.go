package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a throwaway certificate authority with a server certificate for
// 127.0.0.1 and localhost and a client certificate, all signed by it, written
// as PEM files into a temp dir, for tests of TLS connections.
type PKI struct {
	CAFile         string // the CA certificate
	ServerCertFile string // server certificate (SAN 127.0.0.1, ::1, localhost)
	ServerKeyFile  string
	ClientCertFile string // client certificate (CN imshard), for servers that verify clients
	ClientKeyFile  string

	// ServerTLS serves ServerCert, and verifies a client certificate if one
	// is presented, for in-process servers (kfake).
	ServerTLS *tls.Config
}

// NewPKI generates a CA and its certificates (ECDSA P-256, valid for a day).
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	dir := t.TempDir()
	fail := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("testenv: pki: %v", err)
		}
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	fail(err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "imshard test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	fail(err)
	ca, err := x509.ParseCertificate(caDER)
	fail(err)

	p := &PKI{CAFile: filepath.Join(dir, "ca.pem")}
	fail(writePEM(p.CAFile, "CERTIFICATE", caDER))
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (certFile, keyFile string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		fail(err)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		fail(err)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		fail(err)
		certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		fail(writePEM(certFile, "CERTIFICATE", der))
		fail(writePEM(keyFile, "PRIVATE KEY", keyDER))
		return certFile, keyFile
	}
	p.ServerCertFile, p.ServerKeyFile = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.ClientCertFile, p.ClientKeyFile = leaf("imshard", 3, x509.ExtKeyUsageClientAuth)

	cert, err := tls.LoadX509KeyPair(p.ServerCertFile, p.ServerKeyFile)
	fail(err)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	p.ServerTLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	return p
}

// writePEM writes one PEM block, readable by its owner only (keys among them;
// mariadbd and redis-server run as the test's user).
func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
