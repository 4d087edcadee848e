package archive

import (
	"database/sql"
	"time"

	"github.com/imshard/imshard/modules/readpath"
)

// Row is one month-table row as the archive stores it: a Parquet column
// per table column, in (topic, seqid) order. Times are microseconds since
// the epoch (UTC); text columns keep the bytes the table returned, so a
// read of the archive gives back exactly what the table gave.
type Row struct {
	MessageID        int64   `parquet:"message_id"`
	Topic            string  `parquet:"topic"`
	GroupID          int64   `parquet:"group_id"`
	SeqID            int64   `parquet:"seqid"`
	FromUser         int64   `parquet:"from_user"`
	ClientMsgID      *string `parquet:"client_msg_id,optional"`
	MsgType          string  `parquet:"msg_type"`
	Status           string  `parquet:"status"`
	Content          *string `parquet:"content,optional"`
	Head             *string `parquet:"head,optional"`
	MentionedUserIDs *string `parquet:"mentioned_user_ids,optional"`
	MentionAll       int64   `parquet:"mention_all"`
	ReplySeqID       *int64  `parquet:"reply_seqid,optional"`
	RootSeqID        *int64  `parquet:"root_seqid,optional"`
	FileCount        int64   `parquet:"file_count"`
	ContentSize      int64   `parquet:"content_size"`
	HasRisk          int64   `parquet:"has_risk"`
	AuditStatus      string  `parquet:"audit_status"`
	Version          int64   `parquet:"version"`
	RecalledAt       *int64  `parquet:"recalled_at,optional"`
	RecalledBy       *int64  `parquet:"recalled_by,optional"`
	DeletedAt        *int64  `parquet:"deleted_at,optional"`
	ExpiresAt        *int64  `parquet:"expires_at,optional"`
	CreatedAt        int64   `parquet:"created_at"`
	UpdatedAt        int64   `parquet:"updated_at"`
}

// columns is how many values a table row has (routing.LegacyColumns).
const columns = 25

// values is the row as the driver would return it from the table, for
// routing.CanonicalRow: the archive and the table hash alike.
func (r *Row) values() []any {
	ostr := func(s *string) any {
		if s == nil {
			return nil
		}
		return []byte(*s)
	}
	oi64 := func(n *int64) any {
		if n == nil {
			return nil
		}
		return *n
	}
	ts := func(us int64) time.Time { return time.UnixMicro(us).UTC() }
	ots := func(us *int64) any {
		if us == nil {
			return nil
		}
		return ts(*us)
	}
	return []any{r.MessageID, []byte(r.Topic), r.GroupID, r.SeqID, r.FromUser, ostr(r.ClientMsgID),
		[]byte(r.MsgType), []byte(r.Status), ostr(r.Content), ostr(r.Head), ostr(r.MentionedUserIDs),
		r.MentionAll, oi64(r.ReplySeqID), oi64(r.RootSeqID), r.FileCount, r.ContentSize, r.HasRisk,
		[]byte(r.AuditStatus), r.Version, ots(r.RecalledAt), oi64(r.RecalledBy), ots(r.DeletedAt),
		ots(r.ExpiresAt), ts(r.CreatedAt), ts(r.UpdatedAt)}
}

// readRow is the row as the read path renders it (readpath.Row), as a
// scan of the month table would give it.
func (r *Row) readRow() readpath.Row {
	ostr := func(s *string) []byte {
		if s == nil {
			return nil
		}
		return []byte(*s)
	}
	oi64 := func(n *int64) sql.NullInt64 {
		if n == nil {
			return sql.NullInt64{}
		}
		return sql.NullInt64{Int64: *n, Valid: true}
	}
	var cmid sql.NullString
	if r.ClientMsgID != nil {
		cmid = sql.NullString{String: *r.ClientMsgID, Valid: true}
	}
	return readpath.Row{Topic: r.Topic, Seq: r.SeqID, MessageID: r.MessageID, GroupID: r.GroupID, From: r.FromUser,
		ClientMsgID: cmid, MsgType: r.MsgType, Status: r.Status, Content: ostr(r.Content), Head: ostr(r.Head),
		Mentions: ostr(r.MentionedUserIDs), MentionAll: r.MentionAll != 0, ReplySeqID: oi64(r.ReplySeqID),
		RootSeqID: oi64(r.RootSeqID), Version: int(r.Version), CreatedAt: time.UnixMicro(r.CreatedAt).UTC(),
		UpdatedAt: time.UnixMicro(r.UpdatedAt).UTC()}
}
