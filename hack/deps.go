//go:build tools

// Package hack pins dependencies that the project's packages are being written against, so that
// `go mod tidy` keeps them while those packages land.
package hack

import (
	_ "github.com/coreos/go-iptables/iptables"
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/go-viper/mapstructure/v2"
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/prometheus/client_golang/prometheus/testutil"
	_ "github.com/prometheus/client_golang/prometheus/testutil/promlint"
	_ "github.com/spf13/cobra"
	_ "github.com/spf13/pflag"
	_ "github.com/spf13/viper"
	_ "go.uber.org/fx"
	_ "go.uber.org/fx/fxtest"
	_ "go.uber.org/goleak"
	_ "golang.org/x/sys/unix"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apimachinery/pkg/apis/meta/v1"
	_ "k8s.io/client-go/informers"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/kubernetes/fake"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "sigs.k8s.io/knftables"
	_ "sigs.k8s.io/yaml"
)
