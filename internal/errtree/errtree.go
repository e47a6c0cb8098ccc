// Package errtree reads the tree that errors.Join builds: the configuration, the fixes' options and
// the health probes each report a joined error as one line per problem.
package errtree

import "errors"

// Leaves flattens joined errors (errors.Join, also when wrapped) into the single ones, in order; nil
// for a nil error. A wrapper around a join is dropped: each leaf says its problem on its own.
func Leaves(err error) []error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			var out []error
			for _, x := range j.Unwrap() {
				out = append(out, Leaves(x)...)
			}
			return out
		}
	}
	if err == nil {
		return nil
	}
	return []error{err}
}
