package fix

import "errors"

// ErrorLeaves flattens joined errors (errors.Join, also when wrapped) into the single ones, in order; nil
// for a nil error. A wrapper around a join is dropped: each leaf says its problem on its own.
func ErrorLeaves(err error) []error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			var out []error
			for _, x := range j.Unwrap() {
				out = append(out, ErrorLeaves(x)...)
			}
			return out
		}
	}
	if err == nil {
		return nil
	}
	return []error{err}
}
