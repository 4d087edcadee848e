package config

import "reflect"

// Changed lists the keys whose values differ between a and b, in the order of
// the file (tenants counts as one key). A running process uses it on SIGHUP to
// name every change it cannot apply without a restart.
func Changed(a, b *Config) []string {
	va, vb := reflect.ValueOf(*a), reflect.ValueOf(*b)
	var out []string
	for _, l := range leaves() {
		x, y := va.FieldByIndex(l.index), vb.FieldByIndex(l.index)
		if x.Kind() == reflect.Slice && x.Len() == 0 && y.Len() == 0 {
			continue // nil and empty are the same list
		}
		if !reflect.DeepEqual(x.Interface(), y.Interface()) {
			out = append(out, l.key)
		}
	}
	return out
}
