package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

// Certs are PEM files made by GenerateCerts.
type Certs struct {
	// CAFile signed the server and client certificates.
	CAFile string
	// ServerCertFile and ServerKeyFile are for 127.0.0.1 and localhost.
	ServerCertFile, ServerKeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate.
	ClientCertFile, ClientKeyFile string
	// OtherCAFile is an unrelated CA (a wrong CA for tests); OtherClientCertFile
	// and OtherClientKeyFile are a client certificate it signed.
	OtherCAFile                             string
	OtherClientCertFile, OtherClientKeyFile string
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// GenerateCerts writes a CA, a server and a client certificate (and an
// unrelated CA with its own client certificate) into a t.TempDir(). The
// server certificate names 127.0.0.1, localhost and every address in ips
// (a server StartTLSIn puts on a namespace LAN).
func GenerateCerts(t testing.TB, ips ...net.IP) *Certs {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	serial := int64(1)
	mk := func(name string, parent *issuer, tmpl *x509.Certificate) (*issuer, string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.Subject = pkix.Name{CommonName: name}
		tmpl.NotBefore = time.Now().Add(-time.Hour)
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
		signer, signKey := tmpl, key
		if parent != nil {
			signer, signKey = parent.cert, parent.key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return &issuer{cert, key}, write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	caTmpl := func() *x509.Certificate {
		return &x509.Certificate{IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	}
	leaf := func(usage ...x509.ExtKeyUsage) *x509.Certificate {
		return &x509.Certificate{
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: usage,
			IPAddresses: append([]net.IP{net.IPv4(127, 0, 0, 1)}, ips...),
			DNSNames:    []string{"localhost"},
		}
	}
	var c Certs
	ca, caFile, _ := mk("ca", nil, caTmpl())
	c.CAFile = caFile
	_, c.ServerCertFile, c.ServerKeyFile = mk("server", ca, leaf(x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth))
	_, c.ClientCertFile, c.ClientKeyFile = mk("client", ca, leaf(x509.ExtKeyUsageClientAuth))
	other, otherFile, _ := mk("other-ca", nil, caTmpl())
	c.OtherCAFile = otherFile
	_, c.OtherClientCertFile, c.OtherClientKeyFile = mk("other-client", other, leaf(x509.ExtKeyUsageClientAuth))
	return &c
}
