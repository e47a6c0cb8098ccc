package controlplane

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// serverName is the name in the serving certificate; kubeconfigs set it as
// tls-server-name so the certificate verifies whichever IP a client dials.
const serverName = "kubernetes"

// credentials are the files the apiserver needs, written into dir.
type credentials struct {
	caPEM      []byte // CA that signed the serving certificate
	caFile     string // caPEM as a file (kube-controller-manager's --root-ca-file)
	tlsCert    string // serving certificate (PEM file)
	tlsKey     string // serving key (PEM file)
	saKey      string // ServiceAccount token signing key (PEM file), also read for verification
	tokenFile  string // static token file with the admin token
	adminToken string
}

// serviceCIDRs is the apiserver's --service-cluster-ip-range: the first address of each range is the
// Cluster-IP of Service default/kubernetes, which Pods dial without a server name (in-cluster config),
// so the serving certificate holds it too.
func writeCredentials(dir, serviceCIDRs string) (*credentials, error) {
	var ips []net.IP
	for _, r := range strings.Split(serviceCIDRs, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(r))
		if err != nil {
			return nil, fmt.Errorf("service cluster IP range %q: %w", r, err)
		}
		ips = append(ips, net.IP(p.Masked().Addr().Next().AsSlice()))
	}
	c := &credentials{
		caFile:    filepath.Join(dir, "ca.crt"),
		tlsCert:   filepath.Join(dir, "serving.crt"),
		tlsKey:    filepath.Join(dir, "serving.key"),
		saKey:     filepath.Join(dir, "sa.key"),
		tokenFile: filepath.Join(dir, "tokens.csv"),
	}
	var err error
	if c.caPEM, err = writeServingCert(c.tlsCert, c.tlsKey, ips); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	if err = os.WriteFile(c.caFile, c.caPEM, 0o644); err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	if err = writeServiceAccountKey(c.saKey); err != nil {
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

// writeServingCert creates a CA and a serving certificate signed by it (client-go's util/cert) and
// returns the CA certificate in PEM. The certificate holds the loopback addresses and extraIPs.
func writeServingCert(certPath, keyPath string, extraIPs []net.IP) ([]byte, error) {
	chain, key, err := cert.GenerateSelfSignedCertKey(serverName,
		append([]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, extraIPs...),
		[]string{"kubernetes.default", "kubernetes.default.svc", "localhost"})
	if err != nil {
		return nil, err
	}
	certs, err := cert.ParseCertsPEM(chain) // the serving certificate, then its CA
	if err != nil {
		return nil, err
	}
	if len(certs) != 2 || !certs[1].IsCA {
		return nil, fmt.Errorf("want a serving certificate and its CA, got %d certificates", len(certs))
	}
	caPEM, err := cert.EncodeCertificates(certs[1])
	if err != nil {
		return nil, err
	}
	if err := cert.WriteCert(certPath, chain); err != nil {
		return nil, err
	}
	return caPEM, keyutil.WriteKey(keyPath, key)
}

// writeServiceAccountKey writes an ECDSA key for signing ServiceAccount tokens; kube-apiserver reads
// the public key for verification from the same file.
func writeServiceAccountKey(keyPath string) error {
	key, err := keyutil.MakeEllipticPrivateKeyPEM()
	if err != nil {
		return err
	}
	return keyutil.WriteKey(keyPath, key)
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return hex.EncodeToString(b), nil
}
