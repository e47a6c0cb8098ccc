package controlplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// saTokenSeconds is the lifetime of tokens minted by ServiceAccountKubeconfig.
const saTokenSeconds = 3600

// writeKubeconfig writes a single-context kubeconfig authenticating with a
// bearer token.
func writeKubeconfig(path, server string, caPEM []byte, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["nnm"] = &clientcmdapi.Cluster{
		Server:                   server,
		CertificateAuthorityData: caPEM,
		TLSServerName:            serverName,
	}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["nnm"] = &clientcmdapi.Context{Cluster: "nnm", AuthInfo: user}
	cfg.CurrentContext = "nnm"
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

func restConfig(server string, caPEM []byte, token string) *rest.Config {
	return &rest.Config{
		Host:            server,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM, ServerName: serverName},
		QPS:             200,
		Burst:           400,
	}
}

// ServiceAccountKubeconfig creates the ServiceAccount (and its namespace) if
// missing, mints a one-hour token for it through the TokenRequest API and
// writes a kubeconfig using it. With forNodeNS == "" the kubeconfig works from
// the root netns; otherwise it works from inside that node netns, which is
// connected first if needed (see ConnectNamespace). The account gets no RBAC
// bindings: grant what the test needs.
func (c *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, namespace, name, forNodeNS string) (string, error) {
	server := c.Server()
	if forNodeNS != "" {
		var err error
		if server, err = c.nodeServer(forNodeNS); err != nil {
			return "", err
		}
	}
	if err := c.ensureServiceAccount(ctx, namespace, name); err != nil {
		return "", err
	}
	tr, err := c.AdminClient().CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(saTokenSeconds))}},
		metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("TokenRequest for serviceaccount %s/%s: %w", namespace, name, err)
	}
	file := "sa-" + namespace + "-" + name
	if forNodeNS != "" {
		file += "@" + forNodeNS
	}
	path := filepath.Join(c.dataDir, "kubeconfigs", sanitize(file)+".yaml")
	user := "system:serviceaccount:" + namespace + ":" + name
	if err := writeKubeconfig(path, server, c.creds.caPEM, user, tr.Status.Token); err != nil {
		return "", err
	}
	return path, nil
}

func (c *ControlPlane) ensureServiceAccount(ctx context.Context, namespace, name string) error {
	cs := c.AdminClient()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create serviceaccount %s/%s: %w", namespace, name, err)
	}
	return nil
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator || r < ' ' {
			return '_'
		}
		return r
	}, s)
}

func ptr[T any](v T) *T { return &v }
