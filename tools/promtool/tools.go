//go:build tools

// Package tools pins promtool so that
//
//	go build github.com/prometheus/prometheus/cmd/promtool
//
// run from this module builds the exact version in go.mod/go.sum. make test uses it to check and unit
// test the alerting rules in deploy/components/prometheusrule.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
