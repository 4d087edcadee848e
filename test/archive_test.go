package test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/modules/archive"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/test/harness"
)

// archiverFor builds an archiver of env's tenant writing to url.
func archiverFor(env *harness.Env, url string, rps int) *archive.Archiver {
	a := env.App
	return archive.New(archive.Params{
		Config: archive.Config{URL: url, RowsPerSecond: rps}, DBs: a.Pools(), Catalog: a.Catalog(),
		Redis: env.Redis, KeySpace: a.KeySpace(), ProduceTimeout: env.Config.Send.ProduceTimeout,
		Log: zerolog.Nop(), Registerer: prometheus.NewRegistry(),
	})
}

// archivedMonth stores a month of varied rows (NULL and JSON columns, a
// recalled and a deleted one) in three topics and seals it.
func archivedMonth(t *testing.T) (*harness.Env, routing.Month, int) {
	t.Helper()
	env := sealEnv(t, nil)
	old := env.Start
	var evs []message.Event
	for i, topic := range []string{"arch-a", "arch-b", "arch-c"} {
		for seq := int64(1); seq <= int64(20+i*7); seq++ {
			evs = append(evs, persistEvent(env.Tenant, topic, seq, old, 100+seq%4, fmt.Sprintf("c-%s-%d", topic, seq)))
		}
	}
	persistProduce(t, env, evs...)
	persistWaitCount(t, env, len(evs), 30*time.Second, old)
	table, err := routing.TableFor(old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec("UPDATE " + table.Quoted() + " SET client_msg_id = NULL, reply_seqid = 1 WHERE seqid % 5 = 0"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec("UPDATE " + table.Quoted() + " SET status = 'recalled', recalled_at = UTC_TIMESTAMP(3), recalled_by = 7 WHERE topic = 'arch-a' AND seqid = 3"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec("UPDATE " + table.Quoted() + " SET deleted_at = UTC_TIMESTAMP(3), head = '{\"b\": 1, \"a\": [1, 2]}' WHERE topic = 'arch-b' AND seqid = 4"); err != nil {
		t.Fatal(err)
	}
	env.Activate(old.Next())
	sealWaitFor(t, env, old, routing.StatusSealed, 30*time.Second)
	return env, old, len(evs)
}

// A sealed, complete month is exported to Parquet with a manifest, read
// back and verified against its table — on the local file backend and
// against an S3 protocol server; a second run finds it done; a dry run
// writes nothing; a month not sealed is refused; an archive that no longer
// matches its table fails verification.
func TestArchiveExportsAndVerifiesASealedMonth(t *testing.T) {
	env, old, n := archivedMonth(t)
	ctx := context.Background()

	// refused: the active month is not sealed
	dir := t.TempDir()
	fileURL := "file://" + dir
	if _, err := archiverFor(env, fileURL, 0).Archive(ctx, env.Tenant, old.Next(), false); !errors.Is(err, archive.ErrNotSealed) {
		t.Fatalf("archive of an unsealed month: %v", err)
	}

	dry, err := archiverFor(env, fileURL, 0).Archive(ctx, env.Tenant, old, true)
	if err != nil || dry.Rows != int64(n) || dry.Topics != 3 {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a dry run wrote %d entries", len(entries))
	}

	rep, err := archiverFor(env, fileURL, 40).Archive(ctx, env.Tenant, old, false)
	if err != nil || rep.Step != archive.StepVerified || rep.Rows != int64(n) || rep.Topics != 3 || rep.Bytes == 0 {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	if _, err := os.Stat(filepath.Join(dir, env.Tenant, old.String(), "manifest.json")); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	again, err := archiverFor(env, fileURL, 0).Archive(ctx, env.Tenant, old, false)
	if err != nil || again != rep {
		t.Fatalf("second run: %+v %v, want %+v", again, err, rep)
	}

	cfg := tenantConfig(t, env.Tenant, "send: {produce_timeout: 500ms}\n")
	if code, out := runCLI(t, nil, "shard", "list", "--config", cfg, "--tenant", env.Tenant); code != 0 ||
		!strings.Contains(out, "month "+old.String()+" archive: verified, "+fmt.Sprint(n)+" rows") {
		t.Fatalf("shard list: %d\n%s", code, out)
	}
	if code, out := runCLI(t, nil, "shard", "archive", "--config", cfg, "--tenant", env.Tenant, "--month", old.String(), "--dry-run"); code != 0 ||
		!strings.Contains(out, "can be archived: "+fmt.Sprint(n)+" rows in 3 topics") {
		t.Fatalf("shard archive --dry-run: %d\n%s", code, out)
	}

	// the same month against an S3 protocol server (path style, custom endpoint)
	backend := s3mem.New()
	if err := backend.CreateBucket("archive"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	s3URL := "s3://archive?endpoint=" + srv.URL + "&use_path_style=true&region=us-east-1&anonymous=true"
	if _, err := env.DB.Exec("DELETE FROM im_archives"); err != nil {
		t.Fatal(err)
	}
	s3rep, err := archiverFor(env, s3URL, 0).Archive(ctx, env.Tenant, old, false)
	if err != nil || s3rep.Step != archive.StepVerified || s3rep.Rows != int64(n) {
		t.Fatalf("archive to s3: %+v %v", s3rep, err)
	}

	// a table that changed after the export fails the verification
	table, _ := routing.TableFor(old)
	if _, err := env.DB.Exec("UPDATE im_archives SET step = ?", archive.StepExported); err != nil {
		t.Fatal(err)
	}
	if _, err := env.DB.Exec("UPDATE " + table.Quoted() + " SET content = '{\"text\":\"changed\"}' WHERE topic = 'arch-c' AND seqid = 2"); err != nil {
		t.Fatal(err)
	}
	if _, err := archiverFor(env, s3URL, 0).Archive(ctx, env.Tenant, old, false); !errors.Is(err, archive.ErrMismatch) {
		t.Fatalf("verification of a changed table: %v", err)
	}
	var step string
	if err := env.DB.QueryRow("SELECT step FROM im_archives").Scan(&step); err != nil || step != archive.StepExported {
		t.Fatalf("step after a failed verification: %q %v", step, err)
	}
}
