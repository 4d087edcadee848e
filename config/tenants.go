package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// LoadTenantsFile reads a YAML (.yaml, .yml) or JSON (.json) list of tenants and
// validates each. It stands alone so a running service can re-read the file on
// SIGHUP without reloading everything else. Unknown fields are rejected, as in the
// main file, so a misspelt jwt_secret does not leave a tenant without one.
func LoadTenantsFile(path string) ([]Tenant, error) {
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".yaml" && ext != ".yml" && ext != ".json" {
		// Checked before reading, so a path like /dev/zero is never opened.
		return nil, fmt.Errorf("config: tenants file %s: unsupported extension %q (want .yaml, .yml or .json)", path, ext)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: read tenants file %s: %w", path, err)
	}
	var list []Tenant
	if ext == ".json" {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err = dec.Decode(&list); err == nil && dec.More() {
			err = errors.New("unexpected data after the list")
		}
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		err = dec.Decode(&list)
	}
	if err != nil && !errors.Is(err, io.EOF) { // EOF: an empty file is an empty list
		return nil, fmt.Errorf("config: parse tenants file %s: %w", path, err)
	}
	if errs := tenantProblems(list, " in tenants file "+path); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if list == nil {
		list = []Tenant{}
	}
	return list, nil
}

// MergeTenants returns base with extra merged in: a tenant of extra replaces the
// base tenant with the same id in place, new ones are appended in extra's order,
// so the order is stable across reloads. An id twice within one list is an error
// naming tenants[i].id, since which of the two was meant cannot be guessed.
func MergeTenants(base, extra []Tenant) ([]Tenant, error) {
	errs := duplicateIDs(base, "")
	errs = append(errs, duplicateIDs(extra, " in the merged-in list")...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	out := slices.Clone(base)
	at := make(map[string]int, len(out))
	for i, t := range out {
		at[t.ID] = i
	}
	for _, t := range extra {
		if i, ok := at[t.ID]; ok {
			out[i] = t
			continue
		}
		at[t.ID] = len(out)
		out = append(out, t)
	}
	return out, nil
}

func duplicateIDs(list []Tenant, where string) []error {
	var p problems
	first := map[string]int{}
	for i, t := range list {
		if j, dup := first[t.ID]; dup {
			p.add(fmt.Sprintf("tenants[%d].id", i), "duplicate tenant id %q%s (first at tenants[%d])", t.ID, where, j)
			continue
		}
		first[t.ID] = i
	}
	return p
}
