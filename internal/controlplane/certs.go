package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// serverName is the name in the serving certificate; kubeconfigs set it as
// tls-server-name so the certificate verifies whichever IP a client dials.
const serverName = "kubernetes"

// credentials are the files the apiserver needs, written into dir.
type credentials struct {
	caPEM      []byte // CA that signed the serving certificate
	tlsCert    string // serving certificate (PEM file)
	tlsKey     string // serving key (PEM file)
	saKey      string // ServiceAccount token signing key (RSA, PEM file)
	saPub      string // its public key (PEM file), for token verification
	tokenFile  string // static token file with the admin token
	adminToken string
}

func writeCredentials(dir string) (*credentials, error) {
	c := &credentials{
		tlsCert:   filepath.Join(dir, "serving.crt"),
		tlsKey:    filepath.Join(dir, "serving.key"),
		saKey:     filepath.Join(dir, "sa.key"),
		saPub:     filepath.Join(dir, "sa.pub"),
		tokenFile: filepath.Join(dir, "tokens.csv"),
	}
	var err error
	if c.caPEM, err = writeServingCert(c.tlsCert, c.tlsKey); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	if err = writeServiceAccountKey(c.saKey, c.saPub); err != nil {
		return nil, fmt.Errorf("service account key: %w", err)
	}
	if c.adminToken, err = randomHex(24); err != nil {
		return nil, err
	}
	// token,user,uid,"group1,group2"
	line := fmt.Sprintf("%s,%s,%s,\"%s\"\n", c.adminToken, "nnm-admin", "nnm-admin", "system:masters")
	if err = os.WriteFile(c.tokenFile, []byte(line), 0o600); err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	return c, nil
}

// writeServingCert creates a CA and a serving certificate signed by it and
// returns the CA certificate in PEM.
func writeServingCert(certPath, keyPath string) ([]byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "nnm-controlplane-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: serverName},
		NotBefore:    now,
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{serverName, "kubernetes.default", "kubernetes.default.svc", "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writePEM(keyPath, "EC PRIVATE KEY", keyDER); err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

func writeServiceAccountKey(keyPath, pubPath string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := writePEM(keyPath, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)); err != nil {
		return err
	}
	return writePEM(pubPath, "PUBLIC KEY", pub)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return hex.EncodeToString(b), nil
}
