package tenantdb

import (
	"bytes"
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/imshard/imshard/test/testenv"
)

func TestInterpolatesOnlyWhereEscapingIsSafe(t *testing.T) {
	for _, tc := range []struct {
		name, query string
		want        bool
	}{
		{"our defaults", "parseTime=true&loc=UTC", true},
		{"utf8mb4 named", "charset=utf8mb4", true},
		{"utf8mb4 collation", "collation=utf8mb4_unicode_ci", true},
		{"strict sql_mode of the operator", "sql_mode=%27STRICT_TRANS_TABLES%27", true},
		{"NO_BACKSLASH_ESCAPES", "sql_mode=%27STRICT_ALL_TABLES,no_backslash_escapes%27", false},
		{"GBK charset", "charset=gbk", false},
		{"a fallback list with SJIS", "charset=utf8mb4,sjis", false},
		{"Big5 collation", "collation=big5_chinese_ci", false},
		{"client charset as a session variable", "character_set_client=gbk", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := mysql.ParseDSN("u:p@tcp(127.0.0.1:3306)/imshard_x?" + tc.query)
			if err != nil {
				t.Fatal(err)
			}
			normalize(cfg)
			if cfg.InterpolateParams != tc.want {
				t.Fatalf("InterpolateParams = %v, want %v", cfg.InterpolateParams, tc.want)
			}
			if tc.want && cfg.MaxAllowedPacket != 0 {
				t.Fatalf("MaxAllowedPacket = %d: the server's limit is not read", cfg.MaxAllowedPacket)
			}
		})
	}
}

// TestInterpolatedValuesRoundTrip writes and reads values through a tenant
// pool, which writes them into the statements' text, and through a pool of
// the same DSN with prepared statements, and expects the very same bytes and
// times back from both (and the same refusal of what strict SQL refuses).
func TestInterpolatedValuesRoundTrip(t *testing.T) {
	ctx := context.Background()
	tenant := testenv.NewTenant(t)
	ps := newPools(t, tenant)
	interp, err := ps.DB(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ps.tenantConfig(Tenant{ID: tenant, DSN: strings.ReplaceAll(testenv.DSNTemplate(), "{tenant}", tenant)})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.InterpolateParams {
		t.Fatal("the tenant pools do not interpolate")
	}
	cfg.InterpolateParams = false
	prepared, err := open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prepared.Close() })

	// a statement with parameters on an interpolating connection prepares nothing
	conn, err := interp.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	prepares := func() int64 {
		var name string
		var n int64
		if err := conn.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_stmt_prepare'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := prepares()
	var one int64
	if err := conn.QueryRowContext(ctx, "SELECT ? + 0", 1).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT ?: %d %v", one, err)
	}
	if after := prepares(); after != before {
		t.Fatalf("%d statements prepared for one query with a parameter", after-before)
	}
	_ = conn.Close()

	if _, err := interp.ExecContext(ctx, `CREATE TABLE rt (
		id BIGINT NOT NULL PRIMARY KEY,
		b MEDIUMBLOB NULL,
		s MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
		j JSON NULL,
		k VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
		ts DATETIME(3) NULL
	) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci`); err != nil {
		t.Fatal(err)
	}

	all := make([]byte, 0, 512)
	for i := 0; i < 256; i++ {
		all = append(all, byte(i))
	}
	all = append(all, "\x00'\"\\\x1a\r\n\\'\\\"?--  /* */ #"...)
	big := append(bytes.Repeat([]byte("\\'\x00"), 1<<20/3), all...) // past the driver's long-data size
	tricky := "it's \"quoted\", a back\\slash, \\' an escaped quote, a NUL \x00, \x1a, \r\n, 😀 🇸🇪, ? -- # /* */ `tick`"
	doc := `{"a":"x'y\"z\\ 😀 \u0000 ?","b":[1,2.5,null,true],"c":"` + "\u00e9\u4e2d" + `"}`
	stockholm := time.FixedZone("CET", 3600)
	type row struct {
		id int64
		b  any
		s  any
		j  any
		k  any
		ts any
	}
	rows := []row{
		{1, all, tricky, doc, "k'\\\"1", time.Date(2026, 12, 7, 23, 59, 59, 999_999_999, time.UTC)},
		{2, big, strings.Repeat(tricky, 500), doc, "😀", time.Date(2027, 1, 1, 0, 30, 0, 123_000_000, stockholm)},
		{3, "\xff\xfe\x80 not UTF-8 as a string", "", "null", "", time.Time{}},
		{4, nil, nil, nil, nil, nil},
		{5, []byte(nil), (*string)(nil), sql.NullString{}, sql.NullString{}, sql.NullTime{}},
	}
	// the same rows through both pools: ids 1–5 interpolated, 101–105 prepared
	for _, r := range rows {
		for _, p := range []struct {
			db  *sql.DB
			off int64
		}{{interp, 0}, {prepared, 100}} {
			if _, err := p.db.ExecContext(ctx, "INSERT INTO rt (id, b, s, j, k, ts) VALUES (?, ?, ?, ?, ?, ?)",
				r.id+p.off, r.b, r.s, r.j, r.k, r.ts); err != nil {
				t.Fatalf("insert %d: %v", r.id+p.off, err)
			}
		}
	}
	type got struct {
		b    []byte
		s, j sql.NullString
		k    sql.NullString
		ts   sql.NullTime
	}
	read := func(db *sql.DB, id int64) got {
		var g got
		if err := db.QueryRowContext(ctx, "SELECT b, s, j, k, ts FROM rt WHERE id = ?", id).Scan(&g.b, &g.s, &g.j, &g.k, &g.ts); err != nil {
			t.Fatalf("read %d: %v", id, err)
		}
		return g
	}
	for _, r := range rows {
		a, p := read(interp, r.id), read(prepared, r.id+100)
		if !bytes.Equal(a.b, p.b) || (a.b == nil) != (p.b == nil) || a.s != p.s || a.j != p.j || a.k != p.k ||
			a.ts.Valid != p.ts.Valid || !a.ts.Time.Equal(p.ts.Time) {
			t.Fatalf("row %d differs: interpolated %q %q %q %q %v, prepared %q %q %q %q %v",
				r.id, a.b, a.s.String, a.j.String, a.k.String, a.ts, p.b, p.s.String, p.j.String, p.k.String, p.ts)
		}
		if a2 := read(prepared, r.id); !bytes.Equal(a2.b, a.b) || a2.s != a.s || !a2.ts.Time.Equal(a.ts.Time) {
			t.Fatalf("row %d reads differently through the two pools", r.id)
		}
		switch v := r.b.(type) {
		case []byte:
			if !bytes.Equal(a.b, v) {
				t.Fatalf("row %d: bytes %q came back as %q", r.id, v, a.b)
			}
		case string:
			if string(a.b) != v {
				t.Fatalf("row %d: bytes %q came back as %q", r.id, v, a.b)
			}
		}
		if v, ok := r.s.(string); ok && a.s.String != v {
			t.Fatalf("row %d: text %q came back as %q", r.id, v, a.s.String)
		}
		if v, ok := r.ts.(time.Time); ok && !v.IsZero() {
			want := v.UTC().Truncate(time.Millisecond)
			if !a.ts.Time.Equal(want) || a.ts.Time.Location() != time.UTC {
				t.Fatalf("row %d: time %v came back as %v", r.id, want, a.ts.Time)
			}
		}
	}
	if g := read(interp, 4); g.b != nil || g.s.Valid || g.j.Valid || g.k.Valid || g.ts.Valid {
		t.Fatalf("NULLs came back as %+v", g)
	}

	// values in conditions find the same rows through both pools
	for _, p := range []*sql.DB{interp, prepared} {
		var n int
		if err := p.QueryRowContext(ctx, "SELECT COUNT(*) FROM rt WHERE b = ? AND s = ? AND k = ?", all, tricky, "k'\\\"1").Scan(&n); err != nil || n != 2 {
			t.Fatalf("rows found by their values: %d %v", n, err)
		}
		if err := p.QueryRowContext(ctx, "SELECT COUNT(*) FROM rt WHERE k = ? AND ts = ?", "😀",
			time.Date(2027, 1, 1, 0, 30, 0, 123_000_000, stockholm)).Scan(&n); err != nil || n != 2 {
			t.Fatalf("rows found by an emoji and a time: %d %v", n, err)
		}
	}

	// what strict SQL refuses, it refuses either way: bytes that are not
	// UTF-8 in a text column, a document that is not JSON
	for _, p := range []*sql.DB{interp, prepared} {
		if _, err := p.ExecContext(ctx, "INSERT INTO rt (id, s) VALUES (?, ?)", 9, "\xff\xfe"); err == nil {
			t.Fatal("bytes that are not UTF-8 stored in a text column")
		}
		if _, err := p.ExecContext(ctx, "INSERT INTO rt (id, j) VALUES (?, ?)", 9, `{"a":`); err == nil {
			t.Fatal("a document that is not JSON stored")
		}
	}
}
