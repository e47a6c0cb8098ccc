package server

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/client-go/util/cert"
)

// Certificate file names in the metrics certificate directory (those of a kubernetes.io/tls Secret).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// TLSConfig returns the metrics listener's TLS configuration: the key pair in certDir (tls.crt,
// tls.key, re-read when they change, e.g. rotated by cert-manager), or, when certDir is empty, a
// self-signed certificate for host generated in memory at start (scrapers then skip verification, as
// kubebuilder's default setup does).
func TLSConfig(certDir, host string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if certDir == "" {
		certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey(host, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("metrics: self-signed certificate: %w", err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("metrics: self-signed certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		return cfg, nil
	}
	kp := &keyPair{cert: filepath.Join(certDir, CertFile), key: filepath.Join(certDir, KeyFile)}
	if _, err := kp.get(); err != nil {
		return nil, err
	}
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return kp.get() }
	return cfg, nil
}

// keyPair is a certificate and key on disk, loaded again when either file's modification time changes.
type keyPair struct {
	cert, key string
	mu        sync.Mutex
	loaded    *tls.Certificate
	mtime     [2]time.Time
}

func (k *keyPair) get() (*tls.Certificate, error) {
	var mtime [2]time.Time
	for i, f := range []string{k.cert, k.key} {
		fi, err := os.Stat(f)
		if err != nil {
			return k.fallback(fmt.Errorf("metrics certificate: %w", err))
		}
		mtime[i] = fi.ModTime()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.loaded != nil && mtime == k.mtime {
		return k.loaded, nil
	}
	pair, err := tls.LoadX509KeyPair(k.cert, k.key)
	if err != nil {
		if k.loaded != nil {
			return k.loaded, nil // mid-rotation: keep serving the previous pair
		}
		return nil, fmt.Errorf("metrics certificate %s, %s: %w", k.cert, k.key, err)
	}
	k.loaded, k.mtime = &pair, mtime
	return k.loaded, nil
}

func (k *keyPair) fallback(err error) (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.loaded != nil {
		return k.loaded, nil
	}
	return nil, err
}
