package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"
)

const (
	envPrefix = "IMSHARD_"
	// testEnvPrefix belongs to the test suite (test/testenv), not to the
	// configuration: a developer pointing tests elsewhere must not break Load.
	testEnvPrefix = "IMSHARD_TEST_"
	// defaultPath is read when --config is not given, and only if it exists, so a
	// bare `imshard all` in an empty directory runs on the built-in defaults.
	defaultPath = "imshard.yaml"
)

// LoadOptions says where configuration comes from. Precedence: flags > env > file > defaults.
type LoadOptions struct {
	// Path is the --config value; "" means ./imshard.yaml if that file exists, else
	// defaults only.
	Path string
	// Env is the environment as KEY=VALUE; nil means os.Environ(). Tests pass their
	// own so they never touch the process environment.
	Env []string
	// Flags maps a config key (e.g. "http.addr") to a command's flag; only flags
	// with Changed set override, so a flag's own default never beats the file.
	Flags map[string]*pflag.Flag
}

// Load builds the effective Config from defaults, the file, IMSHARD_* variables and
// changed flags, then merges tenants_file into Tenants (dropping the built-in demo
// tenant, see DemoTenant). It does not Validate: every command validates the result
// (the same check a Config built in code, as tests build one, goes through).
//
// Every problem with a value is a *KeyError naming the dotted key (or the unknown
// IMSHARD_* variable); all of them are returned together with errors.Join. A file
// that cannot be read or parsed gives an error naming the file.
func Load(opts LoadOptions) (*Config, error) {
	ls := leaves()
	def := reflect.ValueOf(Default())
	v := viper.New()
	for _, l := range ls {
		v.SetDefault(l.key, plain(def.FieldByIndex(l.index)))
	}
	// origin remembers where each key's winning value came from, so an error about
	// a value also says where to fix it.
	origin := map[string]string{}
	var errs []error

	path, err := configPath(opts.Path)
	if err != nil {
		return nil, err
	}
	if path != "" {
		m, keyErrs, err := readFile(path)
		if err != nil {
			return nil, err
		}
		// Bad keys in the file are reported together with bad env and flags.
		errs = append(errs, keyErrs...)
		for _, l := range ls {
			if _, ok := lookup(m, l.key); ok {
				origin[l.key] = "file " + path
			}
		}
		if err := v.MergeConfigMap(m); err != nil {
			return nil, fmt.Errorf("config: merge %s: %w", path, err)
		}
	}

	env := opts.Env
	if env == nil {
		env = os.Environ()
	}
	errs = append(errs, applyEnv(v, ls, env, origin)...)
	// Flags after env: both use viper's Set layer, so the later write wins.
	errs = append(errs, applyFlags(v, ls, opts.Flags, origin)...)

	// Decode even after errors: keys already rejected are absent from the settings,
	// and the operator gets every bad value in one run instead of one per attempt.
	cfg, decodeErrs := decode(v.AllSettings(), origin)
	if errs = append(errs, decodeErrs...); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if cfg.TenantsFile != "" {
		// The demo tenant is a default, not a choice: an operator who
		// configures only tenants_file (or keeps the example's tenants
		// beside it) must not find it accepting tokens.
		if reflect.DeepEqual(cfg.Tenants, Default().Tenants) {
			cfg.Tenants = []Tenant{}
		}
		extra, err := LoadTenantsFile(cfg.TenantsFile)
		if err != nil {
			return nil, err
		}
		if cfg.Tenants, err = MergeTenants(cfg.Tenants, extra); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// applyEnv sets every IMSHARD_* variable of env on v and records its origin.
func applyEnv(v *viper.Viper, ls []leaf, env []string, origin map[string]string) []error {
	byEnv := make(map[string]leaf, len(ls))
	for _, l := range ls {
		byEnv[l.env()] = l
	}
	var errs []error
	for _, kv := range env {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, envPrefix) || strings.HasPrefix(name, testEnvPrefix) {
			continue
		}
		l, known := byEnv[name]
		if !known {
			// A typo such as IMSHARD_HTTP_ADR would otherwise be ignored silently.
			errs = append(errs, &KeyError{Key: name, Msg: "unknown environment variable: no config key maps to it"})
			continue
		}
		// Empty counts as unset, as in viper: compose files pass `X: ${X:-}` through.
		if val == "" {
			continue
		}
		src := "env " + name
		x, e := fromText(l, val)
		if e != nil {
			errs = append(errs, annotate(e, src)...)
			continue
		}
		v.Set(l.key, x)
		origin[l.key] = src
	}
	return errs
}

// applyFlags sets every changed flag on v and records its origin. Unchanged flags
// are skipped so a flag's own default never overrides the file or env.
func applyFlags(v *viper.Viper, ls []leaf, flags map[string]*pflag.Flag, origin map[string]string) []error {
	byKey := make(map[string]leaf, len(ls))
	for _, l := range ls {
		byKey[l.key] = l
	}
	keys := make([]string, 0, len(flags))
	for k := range flags {
		keys = append(keys, k)
	}
	slices.Sort(keys) // deterministic error order
	var errs []error
	for _, key := range keys {
		f := flags[key]
		if f == nil || !f.Changed {
			continue
		}
		l, known := byKey[key]
		if !known {
			errs = append(errs, &KeyError{Key: key, Msg: "flag --" + f.Name + " is bound to an unknown key"})
			continue
		}
		src := "flag --" + f.Name
		var x any
		var e []error
		if sv, ok := f.Value.(pflag.SliceValue); ok && l.isList() {
			x = sv.GetSlice()
		} else {
			x, e = fromText(l, f.Value.String())
		}
		if e != nil {
			errs = append(errs, annotate(e, src)...)
			continue
		}
		v.Set(l.key, x)
		origin[l.key] = src
	}
	return errs
}

func configPath(p string) (string, error) {
	if p != "" {
		return p, nil
	}
	switch _, err := os.Stat(defaultPath); {
	case err == nil:
		return defaultPath, nil
	case errors.Is(err, os.ErrNotExist):
		return "", nil
	default:
		return "", fmt.Errorf("config: %w", err)
	}
}

// readFile parses the file; keyErrs are problems with keys in it, err means the
// file could not be read or parsed at all.
func readFile(path string) (m map[string]any, keyErrs []error, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, nil, fmt.Errorf("config: parse %s: %w", path, err)
	}
	if doc == nil {
		return map[string]any{}, nil, nil // an empty file means all defaults
	}
	if _, ok := asMap(doc); !ok {
		return nil, nil, fmt.Errorf("config: parse %s: the top level must be a mapping of keys, got %s", path, describe(doc))
	}
	n, errs := normalize("", doc, reflect.TypeFor[Config]())
	return n.(map[string]any), annotate(errs, "file "+path), nil
}

// fromText turns one env or flag string into the value stored for key l.
func fromText(l leaf, s string) (any, []error) {
	switch {
	case l.isList():
		return splitList(s), nil
	case l.typ.Kind() == reflect.Slice:
		// The only list of records is tenants, given as JSON since it cannot be
		// flattened into one variable per field.
		var x any
		if err := json.Unmarshal([]byte(s), &x); err != nil {
			return nil, []error{&KeyError{Key: l.key, Msg: "invalid JSON: " + err.Error()}}
		}
		if x == nil {
			return []any{}, nil
		}
		return normalize(l.key, x, l.typ)
	}
	return s, nil
}

func lookup(m map[string]any, key string) (any, bool) {
	var cur any = m
	for p := range strings.SplitSeq(key, ".") {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = mm[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func decode(settings map[string]any, origin map[string]string) (*Config, []error) {
	var cfg Config
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook:  mapstructure.DecodeHookFuncType(decodeHook),
		ErrorUnused: true,
		Result:      &cfg,
	})
	if err != nil {
		return nil, []error{fmt.Errorf("config: %w", err)}
	}
	if err := dec.Decode(settings); err != nil {
		return nil, keyErrors(err, origin)
	}
	for i := range cfg.Tenants {
		// a tenant without keys reads as one never given any, as it does
		// from a tenants_file, whatever layer the defaults came through
		if len(cfg.Tenants[i].Keys) == 0 {
			cfg.Tenants[i].Keys = nil
		}
	}
	return &cfg, nil
}

// keyErrors turns mapstructure's error tree into one *KeyError per problem, with
// the dotted key the operator wrote rather than mapstructure's field path.
func keyErrors(err error, origin map[string]string) []error {
	var out []error
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		de, ok := e.(*mapstructure.DecodeError)
		if !ok {
			switch w := e.(type) {
			case interface{ Unwrap() []error }:
				for _, c := range w.Unwrap() {
					walk(c)
				}
			case interface{ Unwrap() error }:
				walk(w.Unwrap()) // mapstructure's "decoding failed" wrapper
			default:
				out = append(out, fmt.Errorf("config: %w", e))
			}
			return
		}
		key := de.Name()
		if key == reflect.TypeFor[Config]().String() {
			key = "" // mapstructure names the root by its Go type
		}
		key = strings.ToLower(key)
		inner := de.Unwrap()
		if rest, ok := strings.CutPrefix(inner.Error(), "has invalid keys: "); ok {
			for k := range strings.SplitSeq(rest, ", ") {
				out = append(out, &KeyError{Key: joinKey(key, k), Msg: "unknown key"})
			}
			return
		}
		ke := &KeyError{Key: orRoot(key), Msg: inner.Error()}
		leafKey, _, _ := strings.Cut(key, "[")
		if src, ok := origin[leafKey]; ok {
			ke.Msg += " (from " + src + ")"
		}
		out = append(out, ke)
	}
	walk(err)
	if len(out) == 0 {
		return []error{fmt.Errorf("config: %w", err)}
	}
	return out
}

func annotate(errs []error, src string) []error {
	for _, e := range errs {
		var ke *KeyError
		if errors.As(e, &ke) {
			ke.Msg += " (from " + src + ")"
		}
	}
	return errs
}
