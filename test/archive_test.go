package test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
	"github.com/imshard/imshard/modules/archive"
	"github.com/imshard/imshard/modules/httpapi"
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/routing"
	"github.com/imshard/imshard/modules/testhook"
	"github.com/imshard/imshard/test/harness"
	"github.com/imshard/imshard/test/testenv"
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
	old, n := sealedMonth(t, env)
	return env, old, n
}

// sealedMonth is archivedMonth's month, in env.
func sealedMonth(t *testing.T, env *harness.Env) (routing.Month, int) {
	t.Helper()
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
	return old, len(evs)
}

// unmark puts an archived month back to sealed, for a test that archives
// it again elsewhere.
func unmark(t *testing.T, env *harness.Env, m routing.Month) {
	t.Helper()
	if _, err := env.DB.Exec("UPDATE im_group_message_shards SET status = 'sealed' WHERE shard_month = ?", m.String()); err != nil {
		t.Fatal(err)
	}
	env.App.Catalog().Invalidate(env.Tenant)
}

// tableChecksum is CHECKSUM TABLE … EXTENDED of t: equal for equal rows.
func tableChecksum(t *testing.T, env *harness.Env, table routing.Table) string {
	t.Helper()
	var name string
	var sum sql.NullInt64
	if err := env.DB.QueryRow("CHECKSUM TABLE "+table.Quoted()+" EXTENDED").Scan(&name, &sum); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(sum.Int64)
}

// tableExists reports whether month table table is in the tenant database.
func tableExists(t *testing.T, env *harness.Env, table routing.Table) bool {
	t.Helper()
	var n int
	if err := env.DB.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", table.Name()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// archiveStep is the month's recorded archive step and catalog status.
func archiveStep(t *testing.T, env *harness.Env, m routing.Month) (string, routing.Status) {
	t.Helper()
	var step, status string
	if err := env.DB.QueryRow("SELECT status FROM im_group_message_shards WHERE shard_month = ?", m.String()).Scan(&status); err != nil {
		t.Fatal(err)
	}
	err := env.DB.QueryRow("SELECT step FROM im_archives WHERE shard_month = ?", m.String()).Scan(&step)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	return step, routing.Status(status)
}

// A sealed, complete month is exported to Parquet with a manifest, read
// back and verified against its table — on the local file backend and
// against an S3 protocol server; a second run finds it done; a dry run
// writes nothing; a month not sealed is refused; an archive that no longer
// matches its table fails verification.
func TestArchiveExportsAndVerifiesASealedMonth(t *testing.T) {
	t.Parallel()
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
	if err != nil || rep.Step != archive.StepMarked || rep.Rows != int64(n) || rep.Topics != 3 || rep.Bytes == 0 {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	if _, err := os.Stat(filepath.Join(dir, env.Tenant, old.String(), "manifest.json")); err != nil {
		t.Fatalf("manifest: %v", err)
	}
	// a second run finds the month marked: it exports nothing
	again, err := archiverFor(env, fileURL, 0).Archive(ctx, env.Tenant, old, false)
	want := rep
	want.Export = 0
	if err != nil || again != want {
		t.Fatalf("second run: %+v %v, want %+v", again, err, want)
	}

	cfg := tenantConfig(t, env.Tenant, "send: {produce_timeout: 500ms}\n")
	if code, out := runCLI(t, nil, "shard", "list", "--config", cfg, "--tenant", env.Tenant); code != 0 ||
		!strings.Contains(out, "month "+old.String()+" archive: marked, "+fmt.Sprint(n)+" rows") {
		t.Fatalf("shard list: %d\n%s", code, out)
	}
	if code, out := runCLI(t, nil, "shard", "archive", "--config", cfg, "--tenant", env.Tenant, "--month", old.String(), "--dry-run"); code != 0 ||
		!strings.Contains(out, "is archived already") {
		t.Fatalf("shard archive --dry-run of an archived month: %d\n%s", code, out)
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
	unmark(t, env, old)
	s3rep, err := archiverFor(env, s3URL, 0).Archive(ctx, env.Tenant, old, false)
	if err != nil || s3rep.Step != archive.StepMarked || s3rep.Rows != int64(n) {
		t.Fatalf("archive to s3: %+v %v", s3rep, err)
	}

	// a table that changed after the export fails the verification
	table, _ := routing.TableFor(old)
	if _, err := env.DB.Exec("UPDATE im_archives SET step = ?", archive.StepExported); err != nil {
		t.Fatal(err)
	}
	unmark(t, env, old)
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

// A kill -9 of `shard archive` at every step (each step's work done, not
// yet recorded; the mark inside its transaction) leaves the month sealed
// and read from its table, or archived — never half marked; the next run
// resumes from the step recorded and ends marked, the table untouched.
func TestArchiveSurvivesAKillAtEveryStep(t *testing.T) {
	env, old, n := archivedMonth(t)
	table, _ := routing.TableFor(old)
	checksum := func() string { return tableChecksum(t, env, table) }
	before := checksum()
	cfg := tenantConfig(t, env.Tenant, "send: {produce_timeout: 500ms}\narchive: {url: \"file://"+t.TempDir()+"\"}\n")
	args := []string{"shard", "archive", "--config", cfg, "--tenant", env.Tenant, "--month", old.String()}
	recorded := ""
	for _, step := range []string{archive.StepPrechecked, archive.StepExported, archive.StepVerified, archive.StepMarked} {
		code, out := runCLI(t, []string{testhook.CrashArchiveEnv + "=" + step}, args...)
		if code == 0 {
			t.Fatalf("killed at %s: the run finished\n%s", step, out)
		}
		got, status := archiveStep(t, env, old)
		if got != recorded || status != routing.StatusSealed {
			t.Fatalf("killed at %s: step %q status %s, want %q sealed", step, got, status, recorded)
		}
		recorded = step
	}
	if code, out := runCLI(t, nil, args...); code != 0 || !strings.Contains(out, "month "+old.String()+" marked: "+fmt.Sprint(n)+" rows") {
		t.Fatalf("resumed run: %d\n%s", code, out)
	}
	if step, status := archiveStep(t, env, old); step != archive.StepMarked || status != routing.StatusArchived {
		t.Fatalf("after the resumed run: step %q status %s", step, status)
	}
	if after := checksum(); after != before {
		t.Fatalf("the month table changed: checksum %s, was %s", after, before)
	}
}

// A change that lands after the verification refuses the mark (the month
// goes back to be exported and verified again, and the next run archives
// it with the change); once the month is archived, a recall or a delete
// for everyone of its messages goes to the month's overlay and leaves the
// table (kept for archive.keep_table) alone; the restore writes them into
// the table. Right after a restore, while another process's catalog cache
// may still read the month from its archive, a change answers 409
// month_restoring with retry_after_ms; once that window has passed it
// goes through.
func TestArchiveMarkRefusesAChangedMonthAndArchivedMonthsTakeChanges(t *testing.T) {
	url := "file://" + t.TempDir()
	env := harness.Start(t, harness.Options{Mutate: func(c *config.Config) {
		c.Shard.SealingDays = 0
		c.Send.ProduceTimeout = time.Second
		c.Archive.URL = url // where the service reads the archive from
	}})
	old, n := sealedMonth(t, env)
	ctx := context.Background()
	cfg := tenantConfig(t, env.Tenant, "send: {produce_timeout: 1s}\narchive: {url: \""+url+"\"}\n")
	if code, out := runCLI(t, []string{testhook.CrashArchiveEnv + "=" + archive.StepMarked},
		"shard", "archive", "--config", cfg, "--tenant", env.Tenant, "--month", old.String()); code == 0 {
		t.Fatalf("the run was not killed before its mark\n%s", out)
	}
	admin := env.Token(1, httpapi.RoleAdmin)
	if code, r := chRecall(t, env, admin, "arch-a", 5, nil); code != 200 {
		t.Fatalf("recall before the mark: %d %+v", code, r.Error)
	}
	if _, err := archiverFor(env, url, 0).Archive(ctx, env.Tenant, old, false); !errors.Is(err, archive.ErrChanged) {
		t.Fatalf("mark after a change: %v", err)
	}
	if step, status := archiveStep(t, env, old); step != archive.StepPrechecked || status != routing.StatusSealed {
		t.Fatalf("after the refused mark: step %q status %s", step, status)
	}
	rep, err := archiverFor(env, url, 0).Archive(ctx, env.Tenant, old, false)
	if err != nil || rep.Step != archive.StepMarked || rep.Rows != int64(n) {
		t.Fatalf("archive again: %+v %v", rep, err)
	}

	table, _ := routing.TableFor(old)
	version := func() (v int) {
		if err := env.DB.QueryRow("SELECT version FROM " + table.Quoted() + " WHERE topic = 'arch-a' AND seqid = 6").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := version()
	for name, change := range map[string]func() (int, chResult){
		"recall": func() (int, chResult) { return chRecall(t, env, admin, "arch-a", 6, nil) },
		"delete": func() (int, chResult) { return chDeleteAll(t, env, admin, "arch-c", 7, "") },
	} {
		if code, r := change(); code != 200 || r.ChangeSeq == 0 {
			t.Fatalf("%s of an archived message: %d %+v", name, code, r.Error)
		}
	}
	if got := version(); got != v {
		t.Fatalf("an archived month's kept table changed: version %d, was %d", got, v)
	}

	if _, err := archiverFor(env, url, 0).Restore(ctx, env.Tenant, old); err != nil {
		t.Fatal(err)
	}
	if got := version(); got != v+1 {
		t.Fatalf("the restore did not write the overlay into the table: version %d, want %d", got, v+1)
	}
	code, r := chRecall(t, env, admin, "arch-a", 6, nil)
	if code != 409 || r.Error.Details["reason"] != "month_restoring" || r.Error.Details["retry_after_ms"] == nil {
		t.Fatalf("recall right after the restore: %d %+v", code, r.Error)
	}
	if got := version(); got != v+1 {
		t.Fatalf("a message changed right after the restore: version %d, was %d", got, v+1)
	}
	// the window passed (every catalog cache reads the table again)
	if _, err := env.DB.Exec("UPDATE im_group_message_shards SET unarchived_at = unarchived_at - INTERVAL ? MICROSECOND WHERE shard_month = ?",
		routing.RestoreSettle.Microseconds(), old.String()); err != nil {
		t.Fatal(err)
	}
	if code, r := chRecall(t, env, admin, "arch-a", 8, nil); code != 200 || r.ChangeSeq == 0 {
		t.Fatalf("recall once the restore settled: %d %+v", code, r.Error)
	}
}

// The patrol's part (what the shard manager runs for each tenant after its
// sync) finishes a month whose archive a kill left half done, and archives
// a sealed month once it is archive_after_months behind — not before the
// tenant asks for it.
func TestArchivePatrolResumesAndArchivesPastArchiveAfterMonths(t *testing.T) {
	fileURL := "file://" + t.TempDir()
	env := sealEnv(t, func(c *config.Config) { c.Archive.URL = fileURL })
	old, _ := sealedMonth(t, env)
	ctx := context.Background()
	patrol := env.App.NewArchiver()
	if err := patrol.Apply(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if step, status := archiveStep(t, env, old); step != "" || status != routing.StatusSealed {
		t.Fatalf("archive_after_months 0 archived %s: step %q status %s", old, step, status)
	}

	cfg := tenantConfig(t, env.Tenant, "send: {produce_timeout: 500ms}\narchive: {url: \""+fileURL+"\"}\n")
	if code, out := runCLI(t, []string{testhook.CrashArchiveEnv + "=" + archive.StepExported},
		"shard", "archive", "--config", cfg, "--tenant", env.Tenant, "--month", old.String()); code == 0 {
		t.Fatalf("the run was not killed\n%s", out)
	}
	if err := patrol.Apply(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if step, status := archiveStep(t, env, old); step != archive.StepMarked || status != routing.StatusArchived {
		t.Fatalf("patrol after a killed run: step %q status %s", step, status)
	}

	unmark(t, env, old)
	if _, err := env.DB.Exec("DELETE FROM im_archives"); err != nil {
		t.Fatal(err)
	}
	env.Reload(func(c *config.Config) { c.Tenants[0].ArchiveAfterMonths = 1 })
	if err := patrol.Apply(ctx, env.Tenant); err != nil {
		t.Fatal(err)
	}
	if step, status := archiveStep(t, env, old); step != archive.StepMarked || status != routing.StatusArchived {
		t.Fatalf("patrol with archive_after_months 1: step %q status %s", step, status)
	}
}

// `shard restore` brings an archived month back into MySQL: with its table
// still there it only verifies and flips it back to sealed; with rows
// missing (a restore killed half-way) or the table gone it writes back
// what the table lacks, verifies, and the month is as it was — while a
// month that is not archived is refused, and so is a restore or archive
// while another holds the tenant's archive lock.
func TestArchiveRestoreRebuildsTheMonth(t *testing.T) {
	env, old, n := archivedMonth(t)
	ctx := context.Background()
	table, _ := routing.TableFor(old)
	checksum := func() string { return tableChecksum(t, env, table) }
	before := checksum()
	fileURL := "file://" + t.TempDir()
	arch := archiverFor(env, fileURL, 0)
	archiveIt := func() {
		t.Helper()
		if rep, err := arch.Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
			t.Fatalf("archive: %+v %v", rep, err)
		}
	}
	archiveIt()
	cfg := tenantConfig(t, env.Tenant, "send: {produce_timeout: 500ms}\narchive: {url: \""+fileURL+"\"}\n")
	if code, out := runCLI(t, nil, "shard", "restore", "--config", cfg, "--tenant", env.Tenant, "--month", old.Next().String()); code == 0 ||
		!strings.Contains(out, "not archived") {
		t.Fatalf("restore of a month not archived: %d\n%s", code, out)
	}

	// one archive or restore per tenant at a time: another holder of the
	// tenant's archive lock refuses both
	conn, err := env.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('imshard_archive:', DATABASE()), 0)").Scan(&got); err != nil || got != 1 {
		t.Fatalf("take the archive lock: %d %v", got, err)
	}
	if _, err := arch.Restore(ctx, env.Tenant, old); !errors.Is(err, archive.ErrBusy) {
		t.Fatalf("restore while another holds the lock: %v", err)
	}
	if _, err := arch.Archive(ctx, env.Tenant, old, false); !errors.Is(err, archive.ErrBusy) {
		t.Fatalf("archive while another holds the lock: %v", err)
	}
	if _, err := conn.ExecContext(ctx, "SELECT RELEASE_LOCK(CONCAT('imshard_archive:', DATABASE()))"); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	rep, err := arch.Restore(ctx, env.Tenant, old)
	if err != nil || rep.Rows != int64(n) || rep.Restored != 0 {
		t.Fatalf("restore with the table whole: %+v %v", rep, err)
	}
	if step, status := archiveStep(t, env, old); step != "" || status != routing.StatusSealed {
		t.Fatalf("after the restore: step %q status %s", step, status)
	}

	archiveIt()
	res, err := env.DB.Exec("DELETE FROM " + table.Quoted() + " WHERE topic = 'arch-b'")
	if err != nil {
		t.Fatal(err)
	}
	missing, _ := res.RowsAffected()
	if rep, err := arch.Restore(ctx, env.Tenant, old); err != nil || rep.Restored != missing || rep.Rows != int64(n) {
		t.Fatalf("restore of a half-restored table: %+v %v, want %d written back", rep, err, missing)
	}

	archiveIt()
	if _, err := env.DB.Exec(table.DropDDL()); err != nil {
		t.Fatal(err)
	}
	if code, out := runCLI(t, nil, "shard", "restore", "--config", cfg, "--tenant", env.Tenant, "--month", old.String()); code != 0 ||
		!strings.Contains(out, fmt.Sprintf("restored and sealed: %d rows, %d written back", n, n)) {
		t.Fatalf("restore of a dropped table: %d\n%s", code, out)
	}
	if step, status := archiveStep(t, env, old); step != "" || status != routing.StatusSealed {
		t.Fatalf("after restoring the dropped table: step %q status %s", step, status)
	}
	if after := checksum(); after != before {
		t.Fatalf("the restored table differs: checksum %s, was %s", after, before)
	}
}

// A restore writes back no faster than archive.rows_per_second, as the
// export reads: every row of a dropped month is written back and then read
// back for the verification, each pass allowed one second's worth of rows
// at once and the rest at the limit.
func TestArchiveRestoreIsThrottled(t *testing.T) {
	t.Parallel()
	env, old, n := archivedMonth(t)
	ctx := context.Background()
	fileURL := "file://" + t.TempDir()
	if rep, err := archiverFor(env, fileURL, 0).Archive(ctx, env.Tenant, old, false); err != nil || rep.Step != archive.StepMarked {
		t.Fatalf("archive: %+v %v", rep, err)
	}
	table, _ := routing.TableFor(old)
	if _, err := env.DB.Exec(table.DropDDL()); err != nil {
		t.Fatal(err)
	}
	const rps = 20
	start := time.Now()
	rep, err := archiverFor(env, fileURL, rps).Restore(ctx, env.Tenant, old)
	took := time.Since(start)
	if err != nil || rep.Restored != int64(n) || rep.Rows != int64(n) {
		t.Fatalf("restore: %+v %v", rep, err)
	}
	if least := time.Duration(2*(n-rps)) * time.Second / rps; took < least {
		t.Fatalf("restore of %d rows at %d rows/s took %v, at least %v expected", n, rps, took, least)
	}
	if step, status := archiveStep(t, env, old); step != "" || status != routing.StatusSealed {
		t.Fatalf("after the restore: step %q status %s", step, status)
	}
}

// `imshard bench archive` runs end to end on a small month — the table's
// page, the archive, its pages warm and cold, every bar printed — and
// leaves neither its tenant's database and keys nor its archive objects
// behind; bad usage exits 2 (figures are not asserted: they belong to
// docs/performance.md).
func TestArchiveBenchCommand(t *testing.T) {
	t.Parallel()
	tenant := testenv.NewTenant(t)
	cfg := tenantConfig(t, tenant, "")
	bucket := t.TempDir()
	code, out := runCLI(t, nil, "--config", cfg, "bench", "archive", "--tenant", tenant, "--url=file://"+bucket,
		"--rows=2000", "--topics=20", "--duration=300ms", "--warmup=0s")
	if code != 0 {
		t.Fatalf("bench archive: exit %d\n%s", code, out)
	}
	for _, run := range []string{`month-table page \(before archiving\)`, `archived page, warm`, `archived page, cold \(empty cache\)`} {
		if !regexp.MustCompile(run + `\s+[1-9]\d*\s+0\s`).MatchString(out) {
			t.Fatalf("bench archive: no pages without errors for %q in\n%s", run, out)
		}
	}
	for _, bar := range []string{"export rate / raw SELECT rate", "archived bytes / table data + index",
		"archived page p99 warm / month-table page p99", "archived page p99 cold (empty cache)", "archive export            2000 rows",
		"InnoDB buffer pool"} {
		if !strings.Contains(out, bar) {
			t.Fatalf("bench archive: want %q in\n%s", bar, out)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(bucket, tenant, "*", "*")); len(left) > 0 {
		t.Fatalf("bench archive left archive objects: %v", left)
	}
	admin, err := sql.Open("mysql", testenv.MySQLAdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var dbs int
	if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", testenv.TenantDBPrefix+tenant).Scan(&dbs); err != nil || dbs != 0 {
		t.Fatalf("bench archive left its tenant's database: %d %v", dbs, err)
	}
	rdb := testenv.Redis(t)
	if keys, err := rdb.Do(context.Background(), rdb.B().Keys().Pattern("*{"+tenant+"}*").Build()).AsStrSlice(); err != nil || len(keys) > 0 {
		t.Fatalf("bench archive left keys of its tenant: %v %v", keys, err)
	}
	for _, bad := range [][]string{{"--topics=0"}, {"--duration=0s"}, {"--rows=100", "--topics=10"}, {"--tenant=Bad-Id"}} {
		if code, out := runCLI(t, nil, append([]string{"--config", cfg, "bench", "archive", "--tenant", tenant}, bad...)...); code != 2 {
			t.Fatalf("bench archive %v: exit %d, want 2\n%s", bad, code, out)
		}
	}
}

// The archive's last step drops the month's table: not before
// archive.keep_table has passed since the mark (nor before every catalog
// cache saw the mark, with keep_table 0); a kill -9 right before the DROP
// leaves the month archived with its table, and running the command again
// drops it; shard list says the table is dropped; the restore brings the
// same table back.
func TestArchiveDropsTheTableAfterKeepTableAndSurvivesAKill(t *testing.T) {
	t.Parallel()
	env, old, n := archivedMonth(t)
	table, _ := routing.TableFor(old)
	before := tableChecksum(t, env, table)
	exists := func() bool { return tableExists(t, env, table) }
	bucket := "file://" + t.TempDir()
	cfgTTL := func(keep, ttl string) string {
		return tenantConfig(t, env.Tenant, "send: {produce_timeout: 500ms, idempotency_ttl: "+ttl+"}\narchive: {url: \""+bucket+"\", keep_table: "+keep+"}\n")
	}
	cfg := func(keep string) string { return cfgTTL(keep, "24h") }
	keep0, keepHour := cfg("0s"), cfg("1h")
	// a retry may still look for its first send in the table this long
	// after the month's end: the table stays, whatever keep_table says
	end := time.Date(old.Year(), time.Month(old.Num())+1, 1, 0, 0, 0, 0, time.UTC)
	inReach := cfgTTL("0s", (time.Since(end) + time.Hour).Round(time.Hour).String())
	args := func(cfg string) []string {
		return []string{"shard", "archive", "--config", cfg, "--tenant", env.Tenant, "--month", old.String()}
	}
	code, out := runCLI(t, nil, args(keep0)...)
	if code != 0 || !strings.Contains(out, "month "+old.String()+" marked: "+fmt.Sprint(n)+" rows") || !strings.Contains(out, "is dropped once archive.keep_table") {
		t.Fatalf("archive: %d\n%s", code, out)
	}
	if !exists() {
		t.Fatal("the table went with the mark, before every catalog cache saw it")
	}
	time.Sleep(routing.RestoreSettle + 500*time.Millisecond)
	if code, out := runCLI(t, nil, args(keepHour)...); code != 0 || strings.Contains(out, "dropped;") || !exists() {
		t.Fatalf("a run within keep_table: %d exists %v\n%s", code, exists(), out)
	}
	if code, out := runCLI(t, nil, args(inReach)...); code != 0 || strings.Contains(out, "dropped;") || !exists() {
		t.Fatalf("a run with the month's end within send.idempotency_ttl: %d exists %v\n%s", code, exists(), out)
	}
	if code, out := runCLI(t, []string{testhook.CrashArchiveEnv + "=" + archive.CrashDropping}, args(keep0)...); code == 0 {
		t.Fatalf("killed before the drop: the run finished\n%s", out)
	}
	if step, status := archiveStep(t, env, old); step != archive.StepMarked || status != routing.StatusArchived || !exists() {
		t.Fatalf("killed before the drop: step %q status %s table %v", step, status, exists())
	}
	if code, out := runCLI(t, nil, args(keep0)...); code != 0 || !strings.Contains(out, "table "+table.Name()+" dropped") || exists() {
		t.Fatalf("the run after the kill: %d exists %v\n%s", code, exists(), out)
	}
	if code, out := runCLI(t, nil, args(keep0)...); code != 0 || strings.Contains(out, "dropped;") {
		t.Fatalf("a run after the drop: %d\n%s", code, out)
	}
	if code, out := runCLI(t, nil, "shard", "list", "--config", keep0, "--tenant", env.Tenant); code != 0 || !strings.Contains(out, "archived (table dropped)") {
		t.Fatalf("shard list: %d\n%s", code, out)
	}
	if code, out := runCLI(t, nil, "shard", "restore", "--config", keep0, "--tenant", env.Tenant, "--month", old.String()); code != 0 ||
		!strings.Contains(out, fmt.Sprintf("restored and sealed: %d rows, %d written back", n, n)) {
		t.Fatalf("restore of the dropped month: %d\n%s", code, out)
	}
	if after := tableChecksum(t, env, table); after != before {
		t.Fatalf("the restored table differs: checksum %s, was %s", after, before)
	}
}
