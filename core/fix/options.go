package fix

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// OptionError is one problem with one option of a fix: the typed form in which option errors
// travel from a fix to the configuration (errors.As), which adds where the option was set
// (config.Config.FixError). Key is the option as it was given; Problem shows the value and says what
// is accepted, never a Go type name.
type OptionError struct {
	// Fix is the fix's id; Settings sets it on the errors of a fix's Parse ("" where unknown).
	Fix string
	// Key is the option; "" for a problem of the fix's options together (two that contradict).
	Key     string
	Problem string
	// Unknown says Key is no option of the fix (Problem is UnknownKey's); Suggestion is the nearest
	// option when Key looks like a typo of it.
	Unknown    bool
	Suggestion string
}

func (e *OptionError) Error() string {
	path := e.Key
	if e.Fix != "" {
		path = "fixes." + e.Fix
		if e.Key != "" {
			path += "." + e.Key
		}
	}
	if path == "" {
		return e.Problem
	}
	return path + ": " + e.Problem
}

// Invalid is the error a fix's Parse returns for one option it refuses: key is the option's name
// (mss), the problem shows the value and what is accepted. The configuration names the option with
// the fix's id and where it was set: "config: fixes.mss-clamp.mss (line 4): 20 is out of range …".
func Invalid(key, format string, args ...any) error {
	return &OptionError{Key: key, Problem: fmt.Sprintf(format, args...)}
}

// OptionErr is err, a problem with option key, as an OptionError (nil stays nil; an OptionError
// stays as it is). rules.ParseList and rules.ParsePrefixes, called with the option's key, return
// "key: problem" wrapping the problem: the OptionError's Problem is then what they wrap.
func OptionErr(key string, err error) error {
	if err == nil {
		return nil
	}
	var oe *OptionError
	if errors.As(err, &oe) {
		return err
	}
	problem := err
	if u := errors.Unwrap(err); u != nil && err.Error() == key+": "+u.Error() {
		problem = u
	}
	return &OptionError{Key: key, Problem: problem.Error()}
}

// UnknownOption is the OptionError of an option key that is not one of known.
func UnknownOption(key string, known []string) *OptionError {
	return &OptionError{Key: key, Problem: UnknownKey("key", key, known), Unknown: true, Suggestion: Nearest(key, known)}
}

// UnknownKey is the problem text of a key that is not one of known: the nearest known key when one is
// close (a typo), else the list of accepted keys. The configuration uses it for its own keys too.
func UnknownKey(noun, key string, known []string) string {
	if near := Nearest(key, known); near != "" {
		return fmt.Sprintf("unknown %s; did you mean %s?", noun, near)
	}
	sorted := append([]string(nil), known...)
	sort.Strings(sorted)
	return fmt.Sprintf("unknown %s; accepted: %s", noun, strings.Join(sorted, ", "))
}

// Nearest returns the entry of known closest to key (ignoring case, '-' and '_') when it is a likely
// typo of it: at most a third of the key's letters (at least 2) apart. Empty when none is.
// (cobra's suggestion distance is unexported; this is the same Levenshtein distance.)
func Nearest(key string, known []string) string {
	best, bestD := "", max(2, len(key)/3)+1
	for _, k := range known {
		if d := distance(NormalizeKey(key), NormalizeKey(k)); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

var durationType = reflect.TypeOf(time.Duration(0))

// ShowValue renders a value for an error message: a string quoted and cut at 64 characters, a list or
// mapping by its kind (its content may be long or not ours), anything else as printed.
func ShowValue(val any) string {
	switch v := val.(type) {
	case nil:
		return "an empty value"
	case string:
		if len(v) > 64 {
			v = v[:64] + "…"
		}
		return strconv.Quote(v)
	}
	switch reflect.TypeOf(val).Kind() {
	case reflect.Map:
		return "a mapping"
	case reflect.Slice, reflect.Array:
		return "a list"
	}
	return fmt.Sprint(val)
}

func scalar(val any) bool {
	switch reflect.TypeOf(val).Kind() {
	case reflect.Map, reflect.Slice, reflect.Array, reflect.Struct, reflect.Pointer:
		return false
	}
	return true
}

// ValueProblem says why val (as read from YAML, the environment or a flag) cannot be a value of type
// t, showing the value and what is accepted; "" when it can, or when t is not one of the kinds the
// configuration uses (then decoding reports it). The configuration's keys and every fix's options
// are checked with it, so that one kind of value is described the same way everywhere.
func ValueProblem(val any, t reflect.Type) string {
	if val == nil {
		return ""
	}
	switch {
	case t == durationType:
		if isOrParses(val, time.ParseDuration) {
			return ""
		}
		return ShowValue(val) + " is not a duration such as 500ms, 30s or 1m30s"
	case t.Kind() == reflect.Bool:
		if isOrParses(val, strconv.ParseBool) {
			return ""
		}
		return ShowValue(val) + " is not true or false"
	case t.Kind() == reflect.String:
		if scalar(val) {
			return ""
		}
		return ShowValue(val) + " is not a single value"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		ok := true
		switch v := val.(type) {
		case string, []string:
		case []any:
			for _, e := range v {
				ok = ok && e != nil && scalar(e)
			}
		default:
			ok = false
		}
		if ok {
			return ""
		}
		return ShowValue(val) + ` is not a list such as [a, b] or "a,b"`
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		switch v := val.(type) {
		case int, int64, uint64, uint32, int32:
			return ""
		case float64: // YAML read through JSON (sigs.k8s.io/yaml) gives every number as float64
			if v == math.Trunc(v) {
				return ""
			}
		case string:
			var n uint64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%v", &n); err == nil {
				return ""
			}
		}
		return ShowValue(val) + " is not a number such as 16384 or 0x4000"
	}
	return ""
}

// isOrParses reports whether val is already a T, or a string that parse accepts once trimmed of
// surrounding space.
func isOrParses[T any](val any, parse func(string) (T, error)) bool {
	switch v := val.(type) {
	case T:
		return true
	case string:
		_, err := parse(strings.TrimSpace(v))
		return err == nil
	}
	return false
}

// optionFields maps the normalized name of every option of the struct type t to its name and type.
func optionFields(t reflect.Type) (map[string]reflect.StructField, []string) {
	fields := map[string]reflect.StructField{}
	var names []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[NormalizeKey(name)] = f
		names = append(names, name)
	}
	return fields, names
}
