package main

import (
	"slices"
	"strings"
	"testing"
)

func TestSummaryCountsPerPackageAndPrintsFailuresAndSkips(t *testing.T) {
	in := []string{
		`{"Action":"start","Package":"a"}`,
		`{"Action":"run","Package":"a","Test":"TestOK"}`,
		`{"Action":"output","Package":"a","Test":"TestOK","Output":"=== RUN   TestOK\n"}`,
		`{"Action":"output","Package":"a","Test":"TestOK","Output":"noise of a passing test\n"}`,
		`{"Action":"pass","Package":"a","Test":"TestOK"}`,
		`{"Action":"run","Package":"a","Test":"TestKernel"}`,
		`{"Action":"run","Package":"a","Test":"TestKernel/nft"}`,
		`{"Action":"output","Package":"a","Test":"TestKernel/nft","Output":"    --- SKIP: TestKernel/nft (0.00s)\n"}`,
		`{"Action":"output","Package":"a","Test":"TestKernel/nft","Output":"        x_test.go:3: skipping: no nft\n"}`,
		`{"Action":"skip","Package":"a","Test":"TestKernel/nft"}`,
		`{"Action":"pass","Package":"a","Test":"TestKernel"}`,
		`{"Action":"output","Package":"a","Output":"PASS\n"}`,
		`{"Action":"output","Package":"a","Output":"ok  \ta\t0.1s\n"}`,
		`{"Action":"pass","Package":"a","Elapsed":12.34}`,
		`{"Action":"run","Package":"b","Test":"TestBad"}`,
		`{"Action":"output","Package":"b","Test":"TestBad","Output":"    b_test.go:9: want 1, got 2\n"}`,
		`{"Action":"output","Package":"b","Test":"TestBad","Output":"        second line of the message\n"}`,
		`{"Action":"output","Package":"b","Test":"TestBad","Output":"        third line\n"}`,
		`{"Action":"output","Package":"b","Test":"TestBad","Output":"        fourth line, cut from the recap\n"}`,
		`{"Action":"fail","Package":"b","Test":"TestBad"}`,
		`{"Action":"output","Package":"b","Output":"FAIL\tb\t0.2s\n"}`,
		`{"Action":"fail","Package":"b"}`,
		`not json: a message of the tool itself`,
	}
	var out strings.Builder
	s := newSummary(&out)
	for _, l := range in {
		s.line(l)
	}
	if s.report() {
		t.Error("report() = true with a failed test")
	}
	got := out.String()
	for _, want := range []string{
		"ok  \ta\t0.1s", "FAIL\tb\t0.2s", // package result lines
		"want 1, got 2",                 // a failed test's output
		"skipping: no nft",              // a skip's reason
		"not json: a message",           // passed through
		"2 passed, 1 failed, 1 skipped", // TestOK and TestKernel pass, its subtest skips, TestBad fails
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	// Package a's row: its counts, then its run's seconds from its pass event.
	if !slices.ContainsFunc(strings.Split(got, "\n"), func(l string) bool {
		return strings.Join(strings.Fields(l), " ") == "3 2 0 1 12.3 a"
	}) {
		t.Errorf("no row \"3 2 0 1 12.3 a\" for package a:\n%s", got)
	}
	if strings.Contains(got, "noise of a passing test") {
		t.Errorf("a passing test's output was printed:\n%s", got)
	}
	if a := s.pkgs["a"]; *a != (counts{run: 3, pass: 2, skip: 1, seconds: 12.34}) {
		t.Errorf("package a: %+v", *a)
	}
	// The recap, after every test's output and before the table: TestBad's message, cut to 3 lines.
	recap := got[strings.Index(got, "why each test failed"):strings.Index(got, "tests per suite")]
	if want := "TestBad:\n    b_test.go:9: want 1, got 2\n        second line of the message\n        third line\n"; !strings.Contains(recap, want) {
		t.Errorf("recap lacks %q:\n%s", want, recap)
	}
	if strings.Contains(recap, "fourth line") || strings.Contains(recap, "skipping") {
		t.Errorf("recap holds more than the failed test's messages, cut:\n%s", recap)
	}
	if !strings.HasSuffix(got, "2 passed, 1 failed, 1 skipped\n") {
		t.Errorf("the closing line is not the plain count:\n%s", got)
	}
}

func TestSummaryFailsOnBuildFailureWithoutTests(t *testing.T) {
	var out strings.Builder
	s := newSummary(&out)
	s.line(`{"ImportPath":"c [c.test]","Action":"build-output","Output":"c/x.go:1: syntax error\n"}`)
	s.line(`{"ImportPath":"c [c.test]","Action":"build-fail"}`)
	if s.report() {
		t.Error("report() = true after a build failure")
	}
	if !strings.Contains(out.String(), "syntax error") {
		t.Errorf("build output not printed:\n%s", out.String())
	}
}
